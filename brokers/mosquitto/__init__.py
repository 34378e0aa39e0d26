"""Mosquitto, the software reference broker: the ``mosquitto`` backend.

- :mod:`.backend`: one private Mosquitto process per run, here or on a lab host.
- :mod:`.declaration`: what mqttbed knows of the backend.
"""

from mqttbed.brokers.mosquitto.declaration import DECLARATION

__all__ = ["DECLARATION"]
