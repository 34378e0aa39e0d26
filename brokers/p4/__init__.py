"""The p4 backend: PAMS in-network acceleration of MQTT-SN.

``pams.p4`` is the P4_16 reference (never compiled here: no P4 compiler installs on
this machine); ``ebpf/pams.bpf.c`` is the same pipeline running in the kernel, the one
the tests and runs use; ``tables`` writes either one's tables.
"""

from mqttbed.brokers.p4.declaration import DECLARATION

__all__ = ["DECLARATION"]
