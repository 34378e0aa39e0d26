"""What MQTT-SN brokers add to the results: packets counted where they happen.

PAMS (seed 004) shows its gain as packets that no longer reach the broker, so a run of
the ``mqtt-sn`` backend and of the ``p4`` backend (the same gateway behind the PAMS
switch) hands over one value per figure: a point's figures are the sums over its runs.
One section type for both, since results sections are keyed uniquely: the gateway
counts its own datagrams, the switch counts what crosses its ports, and a figure the
backend has no place to count (the switch's, for ``mqtt-sn``) stays null, never 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from mqttbed.core.sections import BackendSection, SectionRecords


class Packets(BackendSection):
    """Packets per place (publishers, switch, broker, subscribers), summed over a point's runs."""

    key: ClassVar[str] = "packets"
    title: ClassVar[str] = "Packets per place"
    note: ClassVar[str] = (
        "broker_*: counted by the MQTT-SN gateway process (brokers/mqttsn), control packets "
        "included; dropped ones (malformed, unknown client, ...) are among those received. "
        "publishers_sent, switch_*, subscribers_received: the PAMS switch's eBPF counters "
        "(p4 backend), every packet on the port (ARP included): what entered the switch from "
        "publisher hosts, from any host, and what left it towards subscriber hosts. Null: "
        "the backend has no switch to count there.")

    publishers_sent: int | None = Field(
        None, description="packets the switch received from publisher hosts' ports")
    switch_received: int | None = Field(
        None, description="packets the switch received on any host port")
    switch_publish_accelerated: int | None = Field(
        None, description="PUBLISHes the switch sent to subscribers itself, not to the broker")
    broker_received: int = Field(0, description="datagrams the gateway received")
    broker_sent: int = Field(0, description="datagrams the gateway sent")
    broker_dropped: int = Field(0, description="received datagrams it dropped, any reason")
    broker_publish_received: int = Field(0, description="PUBLISH datagrams received")
    broker_publish_sent: int = Field(0, description="PUBLISH datagrams sent")
    subscribers_received: int | None = Field(
        None, description="packets the switch sent out of subscriber hosts' ports")


def packet_records(gateway_stats: dict[str, Any] | None) -> SectionRecords:
    """The gateway's figures of the section (one value each) from its stats file."""
    if not gateway_stats:
        return {}
    return {
        "broker_received": [float(gateway_stats["broker_received"])],
        "broker_sent": [float(gateway_stats["broker_sent"])],
        "broker_dropped": [float(gateway_stats["broker_dropped"])],
        "broker_publish_received": [float(gateway_stats["received_by_type"].get("PUBLISH", 0))],
        "broker_publish_sent": [float(gateway_stats["sent_by_type"].get("PUBLISH", 0))],
    }
