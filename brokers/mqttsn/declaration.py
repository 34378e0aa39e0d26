"""The ``mqtt-sn`` backend, as mqttbed knows it."""

from mqttbed.brokers.mqttsn.backend import Options, unavailable
from mqttbed.brokers.mqttsn.section import Packets
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures, ServerCommand

DECLARATION = BackendDeclaration(
    name="mqtt-sn",
    summary="seed 004's MQTT-SN 1.2 gateway/broker over UDP",
    options=Options,
    backend="mqttbed.brokers.mqttsn.backend:MqttSnBackend",
    unavailable=unavailable,
    results_section=Packets,
    features=BrokerFeatures(persistent_sessions=False, qos=frozenset({0, 1}), retained=False,
                            note="the gateway carries QoS -1, 0 and 1"),
    standalone=ServerCommand("mqttbed.brokers.mqttsn.server:main"),
)
