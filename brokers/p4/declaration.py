"""The ``p4`` backend, as mqttbed knows it."""

from mqttbed.brokers.mqttsn.section import Packets
from mqttbed.brokers.p4.backend import Options, unavailable
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures

DECLARATION = BackendDeclaration(
    name="p4",
    summary="PAMS: the MQTT-SN gateway behind an in-network accelerating switch (eBPF)",
    options=Options,
    backend="mqttbed.brokers.p4.backend:P4Backend",
    unavailable=unavailable,
    results_section=Packets,
    features=BrokerFeatures(persistent_sessions=False, qos=frozenset({0, 1}), retained=False,
                            note="MQTT-SN through the gateway: QoS -1, 0 and 1"),
)
