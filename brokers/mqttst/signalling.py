"""What MQTT-ST signalling costs: a plain PINGREQ against a BPDU PINGREQ (paper §III.A.1).

:func:`pingreq_sizes` gives the MQTT-level sizes, from the encoder the nodes use (IPv4
broker ids). :func:`measure_frame_sizes` sends one of each over a real TCP connection on
the loopback and captures them with an AF_PACKET socket (needs CAP_NET_RAW, i.e. root),
so the sizes include what the kernel adds: Ethernet, IPv4 and TCP headers with their
options. The paper reports 78 and 114 bytes; its capture's link layer and TCP options
are not stated.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

from mqttbed.brokers.mqttst.bpdu import Bpdu, encode_bpdu
from mqttbed.brokers.mqttst.mqtt5 import PingReq, encode
from mqttbed.brokers.mqttst.tree import BrokerId

ETH_P_ALL = 0x0003
ETHERNET_HEADER = 14
_SAMPLE_ID = BrokerId("127.0.0.1", 1883)


def sample_bpdu_pingreq() -> bytes:
    """A BPDU PINGREQ as a node sends it, with IPv4 broker ids."""
    bpdu = Bpdu(_SAMPLE_ID, 5000.0, BrokerId("127.0.0.2", 1883), 9000.0, 250, 1)
    return encode(PingReq(encode_bpdu(bpdu)))


def pingreq_sizes() -> dict[str, int]:
    """MQTT-level bytes of a plain PINGREQ and of an MQTT-ST BPDU PINGREQ."""
    return {"plain_bytes": len(encode(PingReq())), "mqtt_st_bytes": len(sample_bpdu_pingreq())}


def measure_frame_sizes(timeout_s: float = 2.0) -> dict[str, int] | None:
    """Frame bytes of both PINGREQs as captured on ``lo``; None without CAP_NET_RAW.

    Returns ``plain_frame_bytes``, ``mqtt_st_frame_bytes`` and ``header_bytes`` (what
    Ethernet, IP and TCP add to each).
    """
    try:
        capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except (PermissionError, OSError):
        return None
    with capture, socket.socket() as server:
        capture.bind(("lo", 0))
        capture.settimeout(timeout_s)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            accepted, _ = server.accept()
            with accepted:
                sizes = {}
                for name, pingreq in (("plain", encode(PingReq())),
                                      ("mqtt_st", sample_bpdu_pingreq())):
                    client.sendall(pingreq)
                    frame = _capture(capture, port, pingreq, timeout_s)
                    sizes[f"{name}_frame_bytes"] = len(frame)
                    accepted.recv(4096)
    sizes["header_bytes"] = sizes["plain_frame_bytes"] - len(encode(PingReq()))
    return sizes


def _capture(capture: socket.socket, port: int, payload: bytes, timeout_s: float) -> bytes:
    """The first captured IPv4/TCP frame to ``port`` whose TCP payload is ``payload``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            frame = capture.recv(65535)
            if _tcp_payload(frame, port) == payload:
                return frame
    raise TimeoutError(f"no frame with the {len(payload)}-byte PINGREQ seen on lo")


def _tcp_payload(frame: bytes, port: int) -> bytes | None:
    if len(frame) < ETHERNET_HEADER + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[ETHERNET_HEADER:]
    ip_header = (ip[0] & 0x0F) * 4
    if ip[9] != socket.IPPROTO_TCP or len(ip) < ip_header + 20:
        return None
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[ip_header:total]
    if struct.unpack("!H", tcp[2:4])[0] != port:
        return None
    return tcp[(tcp[12] >> 4) * 4:]
