"""The ``fpga`` backend, as mqttbed knows it."""

from mqttbed.brokers.fpga.backend import Options, unavailable
from mqttbed.brokers.fpga.section import FpgaPipelineLatency
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures, ServerCommand

DECLARATION = BackendDeclaration(
    name="fpga",
    summary="seed 000's FPGA broker over UDP: the behavioural model, the RTL, or a board",
    options=Options,
    backend="mqttbed.brokers.fpga.backend:FpgaBackend",
    unavailable=unavailable,
    results_section=FpgaPipelineLatency,
    features=BrokerFeatures(persistent_sessions=False, qos=frozenset({0}), retained=False,
                            note="the hardware has QoS 0 only and ignores retain"),
    standalone=ServerCommand("mqttbed.brokers.fpga.server:main"),
)
