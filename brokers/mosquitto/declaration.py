"""The ``mosquitto`` backend, as mqttbed knows it."""

from mqttbed.brokers.mosquitto.backend import Options, unavailable
from mqttbed.core.backends import BackendDeclaration

DECLARATION = BackendDeclaration(
    name="mosquitto",
    summary="Eclipse Mosquitto, a private process per run (here or on a lab host)",
    options=Options,
    backend="mqttbed.brokers.mosquitto.backend:MosquittoBackend",
    unavailable=unavailable,
)
