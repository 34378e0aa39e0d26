"""The ``mqtt-st`` backend, as mqttbed knows it."""

from mqttbed.brokers.mqttst.backend import PLACEMENTS, Options, unavailable
from mqttbed.brokers.mqttst.report import locality_figures
from mqttbed.brokers.mqttst.section import MqttSt
from mqttbed.core.backends import BackendDeclaration, ServerCommand

DECLARATION = BackendDeclaration(
    name="mqtt-st",
    summary="seed 001's MQTT-ST: a spanning tree of Mosquitto brokers",
    options=Options,
    backend="mqttbed.brokers.mqttst.backend:MqttStBackend",
    unavailable=unavailable,
    results_section=MqttSt,
    placements=PLACEMENTS,
    report_figures=locality_figures,
    standalone=ServerCommand("mqttbed.brokers.mqttst.cli:main"),
)
