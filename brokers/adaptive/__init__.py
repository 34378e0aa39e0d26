"""The adaptive broker: seed 003's cloud-edge MQTT broker, and the ``adaptive`` backend.

Size-aware withholding of large messages per subscriber, driven by RTT queries and the
paper's policies (:mod:`mqttbed.core.withholding`), with lazy or eager allocation.

- :mod:`.outbox`: one subscriber's queues, the withholding decisions, the held-bytes ledger.
- :mod:`.rtt`: the RTT queries and each subscriber's latest estimate.
- :mod:`.session`: one MQTT 3.1.1 connection (asyncio protocol) and its writer.
- :mod:`.broker`: configuration, routing, query rounds, keep-alive, counters.
- :mod:`.server`: the TCP server (``mqttbed broker run adaptive``).
- :mod:`.backend`: the ``adaptive`` broker backend; :mod:`.section`: its ``withholding`` figures.
- :mod:`.shaped_client`: a subscriber that answers RTT queries late on purpose (tests, bench).
"""

from mqttbed.brokers.adaptive.declaration import DECLARATION

__all__ = ["DECLARATION"]
