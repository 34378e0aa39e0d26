"""What an MQTT-ST run adds to the results: the tree, its re-convergence, its signalling.

One section for the ``mqtt-st`` backend (seed 001). The tree figures come from the tree
nodes' own state files (which links each node marked root, designated or blocked, and
when), the per-broker load from the resource samples of each broker's two processes
(its Mosquitto and its tree node). How delivery came back after a failure is measured
from the events like every other figure (``fault`` in the results), not here.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from mqttbed.core.sections import Agreed, BackendSection, Distribution, SectionBlock


class TreeLinks(SectionBlock):
    """Links of the tree by role, counted once per link (the role its two ends agree on:
    a link is active when one end has it as root link and the other as designated)."""

    root: Agreed = Field(None, description="links that are some broker's root link")
    designated: Agreed = Field(None, description="active links, seen from the parent end "
                                                 "(equal to root on a converged tree)")
    blocked: Agreed = Field(None, description="links blocked at either end")


class BrokerLoad(SectionBlock):
    """One broker of the run: its Mosquitto and its tree node, mean over the point's runs."""

    cpu_percent_mean: float | None = Field(None, description="Mosquitto + tree node, % of "
                                                             "one core")
    node_cpu_percent_mean: float | None = Field(None, description="the tree node alone")
    rss_bytes_max: float | None = Field(None, description="Mosquitto + tree node")


class MqttSt(BackendSection):
    """The spanning tree of an ``mqtt-st`` run (null fields: a benchmark run, no tree)."""

    key: ClassVar[str] = "mqtt_st"
    title: ClassVar[str] = "MQTT-ST spanning tree"
    note: ClassVar[str] = (
        "From the tree nodes' state files (brokers/mqttst): root = broker index elected "
        "root once the tree converged before any failure; root_after_failure = after it. "
        "reconvergence_s: from killing a broker until every live node agreed on one root "
        "and the active links spanned the live brokers (null without a failure). "
        "signalling_bytes_per_keepalive: MQTT bytes of BPDU PINGREQ/PINGRESP all brokers "
        "sent per keep-alive interval, over the run. brokers: per broker index, its "
        "Mosquitto and tree node processes (the sum is the common broker figures).")

    brokers_deployed: Agreed = Field(None, description="K")
    root: Agreed = None
    root_after_failure: Agreed = None
    links: TreeLinks | None = None
    convergence_s: Distribution | None = Field(
        None, description="from starting the nodes until the first converged tree")
    reconvergence_s: Distribution | None = None
    signalling_bytes_per_keepalive: float | None = None
    pingreq_bytes_plain: Agreed = Field(None, description="a standard PINGREQ, MQTT bytes")
    pingreq_bytes_mqtt_st: Agreed = Field(None, description="a BPDU PINGREQ, MQTT bytes")
    forwarded: int = Field(0, description="PUBLISHes the nodes sent on tree links")
    discarded_blocked: int = Field(0, description="PUBLISHes dropped: came on a blocked link")
    deduplicated: int = Field(0, description="PUBLISHes dropped: seen before (origin, seq)")
    brokers: dict[str, BrokerLoad] = Field(default_factory=dict)
