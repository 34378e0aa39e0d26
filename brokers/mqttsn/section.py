"""What the MQTT-SN gateway adds to the results: the packets it received, sent and dropped.

PAMS (seed 004) shows its gain as packets that no longer reach the broker, so every run
of the ``mqtt-sn`` backend hands over the gateway's own counters, one value per run:
a point's figures are the sums over its runs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from mqttbed.core.sections import BackendSection, SectionRecords


class GatewayPackets(BackendSection):
    """Datagrams the MQTT-SN gateway counted itself, summed over a point's runs."""

    key: ClassVar[str] = "packets"
    title: ClassVar[str] = "Packets at the MQTT-SN gateway"
    note: ClassVar[str] = (
        "Counted by the gateway process (brokers/mqttsn): every datagram received and sent, "
        "control packets included; dropped ones (malformed, unknown client, unknown topic "
        "id, ...) are among those received.")

    broker_received: int = Field(0, description="datagrams the gateway received")
    broker_sent: int = Field(0, description="datagrams the gateway sent")
    broker_dropped: int = Field(0, description="received datagrams it dropped, any reason")
    broker_publish_received: int = Field(0, description="PUBLISH datagrams received")
    broker_publish_sent: int = Field(0, description="PUBLISH datagrams sent")


def packet_records(gateway_stats: dict[str, Any] | None) -> SectionRecords:
    """The section's records (one value per figure) from the gateway's stats file."""
    if not gateway_stats:
        return {}
    return {
        "broker_received": [float(gateway_stats["broker_received"])],
        "broker_sent": [float(gateway_stats["broker_sent"])],
        "broker_dropped": [float(gateway_stats["broker_dropped"])],
        "broker_publish_received": [float(gateway_stats["received_by_type"].get("PUBLISH", 0))],
        "broker_publish_sent": [float(gateway_stats["sent_by_type"].get("PUBLISH", 0))],
    }
