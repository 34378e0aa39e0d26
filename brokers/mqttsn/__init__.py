"""The MQTT-SN 1.2 gateway/broker: seed 004's "software broker", and the ``mqtt-sn`` backend.

- :mod:`.gateway`: sessions, topic ids and fan-out: what it answers to each datagram.
- :mod:`.counters`: packets in and out by type, drops by reason.
- :mod:`.server`: the gateway as a UDP server (``mqttbed broker run mqtt-sn``).
- :mod:`.backend`: the ``mqtt-sn`` broker backend; :mod:`.section`: its ``packets`` figures.
"""

from mqttbed.brokers.mqttsn.declaration import DECLARATION

__all__ = ["DECLARATION"]
