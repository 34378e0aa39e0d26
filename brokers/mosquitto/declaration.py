"""The ``mosquitto`` backend, as mqttbed knows it."""

from mqttbed.brokers.mosquitto.backend import Options, unavailable
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures
from mqttbed.core.broker_access import ListenerTransport

DECLARATION = BackendDeclaration(
    name="mosquitto",
    summary="Eclipse Mosquitto, a private process per run (here or on a lab host)",
    options=Options,
    backend="mqttbed.brokers.mosquitto.backend:MosquittoBackend",
    unavailable=unavailable,
    # Declared for what Mosquitto 2.0 can be built with; whether the binary a run starts
    # has WebSocket support is known only where it runs (here, or a lab host), so a deploy
    # asks it (brokers/mosquitto/access.py) and refuses ws and wss naming the binary.
    features=BrokerFeatures(
        protocols=frozenset({"3.1.1", "5"}),
        transports=frozenset(ListenerTransport),
        auth=True, shared_subscriptions=frozenset({"3.1.1", "5"}),
        note="Mosquitto 2.0 speaks MQTT 3.1.1 and 5 on every listener; ws and wss need a "
             "binary built with WebSockets (Debian 12's 2.0.11 is), checked at deploy"),
)
