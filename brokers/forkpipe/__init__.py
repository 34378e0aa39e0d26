"""The fork/pipe broker: a C MQTT 3.1.1 broker with a process per client and per subscription.

``backend`` deploys it (``broker.backend: forkpipe``); ``build`` compiles it from ``src/``.
"""

from mqttbed.brokers.forkpipe.declaration import DECLARATION

__all__ = ["DECLARATION"]
