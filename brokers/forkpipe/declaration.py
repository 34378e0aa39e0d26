"""The ``forkpipe`` backend, as mqttbed knows it."""

from mqttbed.brokers.forkpipe.backend import Options, unavailable
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures

DECLARATION = BackendDeclaration(
    name="forkpipe",
    summary="the fork/pipe broker in C: a process per client and per subscription",
    options=Options,
    backend="mqttbed.brokers.forkpipe.backend:ForkPipeBackend",
    unavailable=unavailable,
    features=BrokerFeatures(persistent_sessions=False, retained=False,
                            note="QoS 1 and 2 publishes complete their flows; every "
                                 "subscription is granted QoS 0"),
)
