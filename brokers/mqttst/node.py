"""An MQTT-ST tree node: the spanning tree and the forwarding beside one Mosquitto.

One asyncio loop runs the node's client connection to its Mosquitto (:mod:`.local`),
the link server, the links it dials (the lower broker id of a pair dials, and redials
every ``reconnect_s`` while the link is down) and a tick for keep-alives and the stats
file. What the node does, and why:

**Tree.** After every BPDU, RTT sample, link up or down, it recomputes its state with
:func:`.tree.compute_tree`. It sends a BPDU on every link every keep-alive (the paper's
periodic PINGREQ) and at once on all links whenever what it advertises changes (root,
root C, cost, epoch): *triggered updates*, so convergence is a few RTTs, not keep-alives.

**Topology change.** When an established link fails (socket error, EOF, 1.5 keep-alives
of silence) the node starts a new *epoch*: it forgets every neighbour's root claim, is
its own root again, and sends BPDUs with the Topology Change flag (the paper's special
TC PINGREQ). A node that hears a newer epoch does the same; claims of an older epoch are
ignored. So no broker can keep believing in a dead root that a neighbour still quotes
(the count-to-infinity a plain "forget and listen again" would allow); the tree is
rebuilt from the live brokers' own claims. A new link (a broker restored) needs no TC:
its BPDUs join the current epoch.

**Forwarding.** A publication from a local client gets origin marks (:mod:`.forwarding`)
and goes out on every active link (root and designated); one from a link is discarded
if that link is blocked (counted), dropped if its (origin, sequence) was seen, else
injected into the local Mosquitto with its original QoS and retain and forwarded on the
other active links. ``$``-topics are never forwarded.

**Bad input from a neighbour.** A byte stream that is not MQTT, a packet out of place or
a CONNECT from a broker outside ``members`` ends or refuses the link (an MQTT peer that
sends a malformed packet is disconnected, MQTT 5 section 4.13). A well-framed PINGREQ
whose BPDU is malformed (:func:`.bpdu.decode_bpdu`) or forged (a sender id other than
the one the link was opened with, a C that changed, a claim that this broker is root
with another C, a root outside ``members``) is answered with PINGRESP, dropped, counted
under ``malformed_bpdus`` by reason and logged (at most once per second per reason):
the link stays, so a bad BPDU cannot force a Topology Change.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.bpdu import Bpdu, MalformedBpdu, decode_bpdu, encode_bpdu
from mqttbed.brokers.mqttst.forwarding import DedupeWindow, mark, origin_of, unmark
from mqttbed.brokers.mqttst.links import SILENCE_KEEPALIVES, Link
from mqttbed.brokers.mqttst.local import LocalClient, connect_local
from mqttbed.brokers.mqttst.mqtt5 import Publish
from mqttbed.brokers.mqttst.tree import (
    ACTIVE_ROLES,
    EPOCH_MODULUS,
    BrokerId,
    Neighbour,
    RootClaim,
    TreeState,
    compute_tree,
    epoch_newer,
)
from mqttbed.core.clock import monotonic_ns

logger = logging.getLogger("mqttbed.mqtt-st")

TICK_S = 0.02
FIRST_REDIAL_S = 0.05
HISTORY_LENGTH = 256
LOG_INTERVAL_S = 1.0
STATS_FORMAT = 1


@dataclass(frozen=True)
class Peer:
    """A neighbour to link with: its broker id and where its link port listens."""

    broker: BrokerId
    link_host: str
    link_port: int

    @classmethod
    def parse(cls, text: str) -> Peer:
        """``ADDRESS:CLIENTPORT@LINKHOST:LINKPORT``; ValueError names the text."""
        broker, sep, link = text.partition("@")
        host, colon, port = link.rpartition(":")
        if not sep or not colon:
            raise ValueError(f"peer {text!r} is not ADDRESS:CLIENTPORT@LINKHOST:LINKPORT, "
                             "e.g. 127.0.0.1:1884@127.0.0.1:21884")
        try:
            return cls(BrokerId.parse(broker), host.strip("[]"), int(port))
        except ValueError as exc:
            raise ValueError(f"peer {text!r}: {exc}") from None


@dataclass(frozen=True)
class NodeConfig:
    me: BrokerId
    capability: float
    local: tuple[str, int]
    link: tuple[str, int]
    peers: tuple[Peer, ...] = ()
    members: frozenset[BrokerId] | None = None   # None: accept any node that dials in
    keepalive_s: float = 10.0
    reconnect_s: float = 1.0
    hysteresis: float = 0.2
    startup_timeout_s: float = 10.0
    index: int | None = None


@dataclass
class NodeCounters:
    pingreq_sent: int = 0
    pingreq_received: int = 0
    plain_pingreq_received: int = 0
    signalling_bytes_sent: int = 0
    signalling_bytes_received: int = 0
    local_publications: int = 0
    link_publications_received: int = 0
    forwarded: int = 0
    injected: int = 0
    discarded_blocked: int = 0
    discarded_unmarked: int = 0
    deduplicated: int = 0
    malformed_bpdus: int = 0
    stale_bpdus: int = 0
    topology_changes: int = 0
    links_established: int = 0
    links_failed: int = 0
    links_refused: int = 0
    protocol_errors: int = 0
    malformed_by_reason: Counter[str] = field(default_factory=Counter)


class Node:
    """One MQTT-ST node: links, tree state, forwarding and counters (see the module doc)."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.me = config.me
        self.capability = config.capability
        self.keepalive_s = config.keepalive_s
        self.incarnation = f"{self.me}/{secrets.token_hex(4)}"
        self.counters = NodeCounters()
        self.epoch = 0
        self.links: dict[BrokerId, Link] = {}        # established links by peer
        self.claims: dict[BrokerId, RootClaim] = {}  # each neighbour's claim this epoch
        self.peer_capability: dict[BrokerId, float] = {}
        self.tree = TreeState(self.me, self.capability, 0, None, {})
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_LENGTH)
        self.dedupe = DedupeWindow()
        self.local: LocalClient | None = None
        self.version = 0                              # bumped on every change worth a write
        self.started_at_ns = monotonic_ns()
        self.fatal: asyncio.Future[str] | None = None
        self._sequence = 0
        self._advertised: tuple[Any, ...] | None = None
        self._topology_change = False
        self._last_bpdu: dict[BrokerId, float] = {}
        self._dialing: set[BrokerId] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_dial: dict[BrokerId, float] = {}       # monotonic time of the next attempt
        self._failed_dials: dict[BrokerId, int] = {}
        self._logged_at: dict[str, float] = {}
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> asyncio.AbstractServer:
        """Listen on the link port, subscribe at the local Mosquitto, compute the first state."""
        loop = asyncio.get_running_loop()
        self.fatal = loop.create_future()
        host, port = self.config.link
        server = await loop.create_server(lambda: Link(self), host, port, reuse_address=True)
        local_host, local_port = self.config.local
        self.local = await connect_local(local_host, local_port, f"mqttst-node/{self.me}",
                                         self._local_message, self._local_lost,
                                         self.config.startup_timeout_s)
        self._recompute()
        return server

    def tick(self) -> None:
        """Dial missing peers, send due BPDUs, end silent links, keep Mosquitto's session."""
        now = time.monotonic()
        for peer in self.config.peers:
            if (peer.broker not in self.links and peer.broker not in self._dialing
                    and self.me.key < peer.broker.key
                    and now >= self._next_dial.get(peer.broker, 0.0)):
                # 50 ms, 100 ms, ... up to reconnect_s: peers started together find each
                # other within their start-up spread, a dead one costs one dial per period
                failures = self._failed_dials.get(peer.broker, 0)
                self._next_dial[peer.broker] = now + min(self.config.reconnect_s,
                                                         FIRST_REDIAL_S * 2 ** failures)
                self._failed_dials[peer.broker] = failures + 1
                self._dialing.add(peer.broker)
                task = asyncio.get_running_loop().create_task(self._dial(peer))
                self._tasks.add(task)               # the loop keeps only a weak reference
                task.add_done_callback(self._tasks.discard)
        for broker, link in list(self.links.items()):
            if link.silent_for() > SILENCE_KEEPALIVES * self.keepalive_s:
                link.abort(f"silent for {link.silent_for():.1f} s "
                           f"({SILENCE_KEEPALIVES} keep-alives of {self.keepalive_s} s)")
            elif now - self._last_bpdu.get(broker, 0.0) >= self.keepalive_s:
                self._send_bpdu(link)
        if self.local is not None:
            self.local.keep_alive()

    def shut_down(self) -> None:
        """Close every link (DISCONNECT first) and the local connection."""
        self._stopping = True
        for link in list(self.links.values()):
            link.close("node stopping")
        if self.local is not None:
            self.local.close("node stopping")

    async def _dial(self, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(
                lambda: Link(self, dialed=peer.broker), peer.link_host, peer.link_port),
                timeout=max(self.config.reconnect_s, 1.0))
        except (OSError, TimeoutError) as exc:
            self._dialing.discard(peer.broker)
            logger.debug("dialing %s at %s:%d failed: %s", peer.broker, peer.link_host,
                         peer.link_port, exc)

    # -- links (LinkOwner) --------------------------------------------------------------

    def admit(self, link: Link, peer: BrokerId) -> tuple[int, str]:
        """Welcome ``peer`` unless it is outside ``members``, is us, or is linked already."""
        members = self.config.members
        if members is not None and peer not in members:
            return mqtt5.NOT_AUTHORIZED, "not a member of this cluster"
        if peer == self.me:
            return mqtt5.CLIENT_ID_NOT_VALID, "it claims this node's own id"
        if peer in self.links:
            return mqtt5.CLIENT_ID_NOT_VALID, "a link to it is up already"
        return mqtt5.SUCCESS, ""

    def link_refused(self, client_id: str, reason_code: int, why: str) -> None:
        self.counters.links_refused += 1
        self.version += 1
        self._log_limited("refused", "refused a link from %r (CONNACK %#x): %s", client_id,
                          reason_code, why)

    def link_up(self, link: Link) -> None:
        assert link.peer is not None
        self._dialing.discard(link.peer)
        self._failed_dials.pop(link.peer, None)
        if link.peer in self.links:   # both ends dialed at once: keep the first
            link.close("duplicate link")
            return
        self.links[link.peer] = link
        self.counters.links_established += 1
        logger.info("link to %s up", link.peer)
        self._recompute()
        self._send_bpdu(link)

    def link_down(self, link: Link, reason: str) -> None:
        if link.dialed is not None:
            self._dialing.discard(link.dialed)
        peer = link.peer
        if peer is None or self.links.get(peer) is not link:
            return   # a refused, duplicate or never-established link: the tree never used it
        del self.links[peer]
        self.claims.pop(peer, None)
        self.peer_capability.pop(peer, None)   # a broker restarted there may have a new C
        self._last_bpdu.pop(peer, None)
        if self._stopping:
            return
        self.counters.links_failed += 1
        logger.warning("link to %s failed (%s): topology change", peer, reason)
        self._new_epoch((self.epoch + 1) % EPOCH_MODULUS)
        self._recompute()

    def on_pingreq(self, link: Link, payload: bytes) -> None:
        self.counters.pingreq_received += 1
        if not payload:
            self.counters.plain_pingreq_received += 1
            return
        try:
            bpdu = decode_bpdu(payload)
            self._check_forgery(link, bpdu)
        except MalformedBpdu as exc:
            self._malformed(link, exc)
            return
        if epoch_newer(bpdu.epoch, self.epoch):
            self._new_epoch(bpdu.epoch)
        elif bpdu.epoch != self.epoch:
            self.counters.stale_bpdus += 1   # it will hear our epoch and catch up
            return
        assert link.peer is not None
        self.peer_capability[link.peer] = bpdu.sender_capability
        self.claims[link.peer] = bpdu.claim
        self._recompute()

    def on_rtt(self, link: Link) -> None:
        self.version += 1
        self._recompute()

    def count_signalling(self, sent: int, received: int) -> None:
        self.counters.signalling_bytes_sent += sent
        self.counters.signalling_bytes_received += received

    def count_protocol_error(self, link: Link, reason: str) -> None:
        self.counters.protocol_errors += 1
        self.version += 1
        self._log_limited("protocol", "closing the link from %s: %s",
                          link.peer or "an unknown peer", reason)

    def _check_forgery(self, link: Link, bpdu: Bpdu) -> None:
        """Raise MalformedBpdu for a BPDU no correct neighbour on this link would send."""
        members = self.config.members
        known = self.peer_capability.get(bpdu.sender)
        if bpdu.sender != link.peer:
            raise MalformedBpdu("forged-sender", f"BPDU from {bpdu.sender} on the link "
                                                 f"opened by {link.peer}")
        if known is not None and known != bpdu.sender_capability:
            raise MalformedBpdu("forged-capability", f"{bpdu.sender} changed its C from "
                                f"{known!r} to {bpdu.sender_capability!r}")
        if bpdu.root == self.me and bpdu.root_capability != self.capability:
            raise MalformedBpdu("forged-root", f"names this node root with C "
                                f"{bpdu.root_capability!r}, not {self.capability!r}")
        said = self.peer_capability.get(bpdu.root)
        if bpdu.root != bpdu.sender and said is not None and said != bpdu.root_capability:
            raise MalformedBpdu("forged-root", f"names {bpdu.root} root with C "
                                f"{bpdu.root_capability!r}; {bpdu.root} itself says {said!r}")
        if members is not None and bpdu.root not in members:
            raise MalformedBpdu("unknown-root", f"names {bpdu.root} root, not a member")

    def _malformed(self, link: Link, exc: MalformedBpdu) -> None:
        self.counters.malformed_bpdus += 1
        self.counters.malformed_by_reason[exc.reason] += 1
        self.version += 1
        self._log_limited(exc.reason, "dropped a BPDU from %s: %s", link.peer, exc)

    def _log_limited(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._logged_at.get(key, -LOG_INTERVAL_S) >= LOG_INTERVAL_S:
            self._logged_at[key] = now
            logger.warning(message, *args)

    # -- the tree -----------------------------------------------------------------------

    def _new_epoch(self, epoch: int) -> None:
        """Restart the tree from scratch: forget every claim, announce a Topology Change."""
        logger.info("epoch %d -> %d: the tree restarts", self.epoch, epoch)
        self.epoch = epoch
        self.claims.clear()
        self.counters.topology_changes += 1
        self._topology_change = True
        self.tree = TreeState(self.me, self.capability, 0, None, self.tree.roles)

    def _neighbours(self) -> dict[BrokerId, Neighbour]:
        peers = [peer.broker for peer in self.config.peers] + list(self.links)
        return {broker: Neighbour(self.peer_capability.get(broker), self.claims.get(broker),
                                  link.rtt_us if (link := self.links.get(broker)) else None,
                                  up=link is not None)
                for broker in peers}

    def _recompute(self) -> None:
        old = self.tree
        self.tree = compute_tree(self.me, self.capability, self._neighbours(), previous=old,
                                 hysteresis=self.config.hysteresis)
        if (self.tree.root, self.tree.roles) != (old.root, old.roles) or not self.history:
            self.history.append({
                "t_ns": monotonic_ns(), "epoch": self.epoch, "root": str(self.tree.root),
                "roles": {str(peer): role.value for peer, role in self.tree.roles.items()}})
            logger.info("root %s via %s, roles %s", self.tree.root, self.tree.root_link,
                        {str(p): r.value for p, r in self.tree.roles.items()})
        self.version += 1
        advertised = (self.tree.root, self.tree.root_capability, self.tree.cost_us, self.epoch)
        if advertised != self._advertised or self._topology_change:
            self._advertised = advertised
            for link in list(self.links.values()):
                self._send_bpdu(link)
            self._topology_change = False

    def bpdu(self) -> Bpdu:
        """The BPDU this node sends now."""
        return Bpdu(self.me, self.capability, self.tree.root, self.tree.root_capability,
                    self.tree.cost_us, self.epoch, self._topology_change)

    def _send_bpdu(self, link: Link) -> None:
        assert link.peer is not None
        self._last_bpdu[link.peer] = time.monotonic()
        self.counters.pingreq_sent += 1
        link.send_bpdu(encode_bpdu(self.bpdu()))

    # -- forwarding ---------------------------------------------------------------------

    def _local_message(self, message: Publish) -> None:
        if message.topic.startswith("$"):
            return
        self._sequence += 1
        self.counters.local_publications += 1
        self._forward(mark(message, self.incarnation, self._sequence), came_from=None)

    def on_link_publish(self, link: Link, message: Publish) -> None:
        self.counters.link_publications_received += 1
        self.version += 1
        if link.peer is None or self.tree.roles.get(link.peer) not in ACTIVE_ROLES:
            self.counters.discarded_blocked += 1
            return
        origin = origin_of(message)
        if origin is None or message.topic.startswith("$"):
            self.counters.discarded_unmarked += 1
            self._log_limited("unmarked", "dropped a PUBLISH on %r from %s without valid "
                              "origin marks", message.topic, link.peer)
            return
        if origin.broker == self.incarnation \
                or not self.dedupe.first_time(origin.broker, origin.sequence):
            self.counters.deduplicated += 1
            return
        assert self.local is not None
        self.local.publish(unmark(message, origin))
        self.counters.injected += 1
        self._forward(message, came_from=link.peer)

    def _forward(self, message: Publish, came_from: BrokerId | None) -> None:
        for peer, role in self.tree.roles.items():
            if role in ACTIVE_ROLES and peer != came_from and (link := self.links.get(peer)):
                link.publish(message)
                self.counters.forwarded += 1
        self.version += 1

    def _local_lost(self, reason: str) -> None:
        if self.local is not None and not self._stopping and self.fatal is not None \
                and not self.fatal.done():
            self.fatal.set_result(f"lost the local Mosquitto: {reason}")

    # -- the counters file --------------------------------------------------------------

    def counters_snapshot(self) -> dict[str, Any]:
        """The node's state and counters as JSON-able data (what its ``--stats-file`` holds)."""
        counters = dict(vars(self.counters))
        by_reason = counters.pop("malformed_by_reason")
        bpdu_bytes = len(mqtt5.encode(mqtt5.PingReq(encode_bpdu(self.bpdu()))))
        links = []
        for broker, role in sorted(self.tree.roles.items(), key=lambda item: item[0].key):
            link = self.links.get(broker)
            links.append({"peer": str(broker), "role": role.value,
                          "rtt_us": None if link is None or link.rtt_us is None
                          else round(link.rtt_us, 1)})
        return {
            "format": STATS_FORMAT,
            "broker": "mqtt-st-node",
            "index": self.config.index,
            "id": str(self.me),
            "incarnation": self.incarnation,
            "capability": self.capability,
            "epoch": self.epoch,
            "root": str(self.tree.root),
            "root_capability": self.tree.root_capability,
            "root_path_cost_us": self.tree.cost_us,
            "root_link": None if self.tree.root_link is None else str(self.tree.root_link),
            "links": links,
            "converged_at_ns": list(self.history),
            "counters": {**counters, "pingreq_bytes": {"bpdu": bpdu_bytes, "plain": 2},
                         "malformed_by_reason": dict(by_reason)},
            "started_at_ns": self.started_at_ns,
            "written_at_ns": monotonic_ns(),
        }
