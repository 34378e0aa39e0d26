"""MQTT-ST election and link roles (paper §II.C.3-4), the BPDU bytes, topologies: pure."""

from __future__ import annotations

import math
import struct

import pytest

from mqttbed.brokers.mqttst.bpdu import (
    MAX_CAPABILITY,
    Bpdu,
    MalformedBpdu,
    decode_bpdu,
    encode_bpdu,
)
from mqttbed.brokers.mqttst.topology import topology_edges, tree_verdict
from mqttbed.brokers.mqttst.tree import (
    BrokerId,
    Neighbour,
    Role,
    RootClaim,
    TreeState,
    compute_tree,
    epoch_newer,
    outranks,
)


def broker(i: int) -> BrokerId:
    return BrokerId(f"10.0.0.{i + 1}", 1883)


def converge(capabilities: list[float], rtts: dict[tuple[int, int], float],
             hysteresis: float = 0.0) -> dict[int, TreeState]:
    """Run compute_tree at every broker in synchronous rounds, BPDUs crossing every link,
    until nothing changes: what the nodes reach once their triggered updates settle."""
    links = {i: {} for i in range(len(capabilities))}
    for (a, b), rtt in rtts.items():
        links[a][b] = links[b][a] = rtt
    states: dict[int, TreeState | None] = {i: None for i in links}

    def claim(j: int) -> RootClaim:
        state = states[j]
        return RootClaim(broker(j), capabilities[j], 0) if state is None else \
            RootClaim(state.root, state.root_capability, state.cost_us)

    for _ in range(50):
        new = {i: compute_tree(broker(i), capabilities[i], {
            broker(j): Neighbour(capabilities[j], claim(j), rtt) for j, rtt in links[i].items()},
            previous=states[i], hysteresis=hysteresis) for i in links}
        if new == states:
            return new
        states = dict(new)
    raise AssertionError("the tree did not settle in 50 rounds")


def role(states: dict[int, TreeState], i: int, j: int) -> Role:
    return states[i].roles[broker(j)]


def full_mesh(n: int, rtt: float = 100.0) -> dict[tuple[int, int], float]:
    return {(a, b): rtt for a in range(n) for b in range(a + 1, n)}


# -- election ----------------------------------------------------------------------------


def test_highest_capability_becomes_root():
    states = converge([100, 300, 200], full_mesh(3))
    assert {state.root for state in states.values()} == {broker(1)}
    assert states[1].is_root and states[1].cost_us == 0


def test_capability_tie_goes_to_the_lowest_address():
    low, high = BrokerId("127.0.0.9", 1900), BrokerId("127.0.0.10", 1800)
    assert outranks(5.0, low, 5.0, high)            # 9 < 10 as numbers, not as text
    assert not outranks(5.0, high, 5.0, low)
    same_ip = BrokerId("127.0.0.1", 1883), BrokerId("127.0.0.1", 1884)
    assert outranks(5.0, same_ip[0], 5.0, same_ip[1])   # then the lower client port
    assert outranks(6.0, high, 5.0, low)             # capability first
    states = converge([7, 7, 7], full_mesh(3))
    assert {state.root for state in states.values()} == {broker(0)}


def test_a_lone_broker_is_its_own_root_with_its_links_down():
    state = compute_tree(broker(0), 1.0, {broker(1): Neighbour(up=False)})
    assert state.is_root and state.roles == {broker(1): Role.DOWN}


def test_a_link_counts_for_the_election_only_once_its_rtt_is_measured():
    unmeasured = Neighbour(9.0, RootClaim(broker(1), 9.0, 0), rtt_us=None)
    state = compute_tree(broker(0), 1.0, {broker(1): unmeasured})
    assert state.is_root and state.roles[broker(1)] == Role.DESIGNATED


# -- roles --------------------------------------------------------------------------------


def test_full_mesh_root_links_are_direct_and_the_third_link_is_blocked_at_one_end():
    states = converge([100, 50, 10], {(0, 1): 100, (0, 2): 120, (1, 2): 80})
    assert states[0].roles == {broker(1): Role.DESIGNATED, broker(2): Role.DESIGNATED}
    assert states[1].root_link == broker(0) and states[2].root_link == broker(0)
    # 1 is closer to the root (100 us) than 2 (120 us): 1's end forwards, 2's blocks
    assert role(states, 1, 2) == Role.DESIGNATED and role(states, 2, 1) == Role.BLOCKED


def test_root_link_follows_the_least_cumulative_latency_not_the_hop_count():
    states = converge([100, 50, 10], {(0, 1): 100, (0, 2): 1000, (1, 2): 100})
    assert states[2].root_link == broker(1) and states[2].cost_us == 200
    assert role(states, 1, 2) == Role.DESIGNATED
    assert role(states, 0, 2) == Role.DESIGNATED and role(states, 2, 0) == Role.BLOCKED


def test_equal_latency_to_the_root_goes_through_the_neighbour_with_more_capability():
    # 3 reaches root 0 through 1 or 2 at 200 us either way; 2 has the higher C
    states = converge([100, 20, 30, 10], {(0, 1): 100, (0, 2): 100, (1, 3): 100, (2, 3): 100})
    assert states[3].root_link == broker(2)
    assert role(states, 3, 1) == Role.BLOCKED and role(states, 1, 3) == Role.DESIGNATED


def test_equal_path_cost_designates_the_end_with_more_capability():
    states = converge([100, 20, 30], full_mesh(3))
    assert role(states, 2, 1) == Role.DESIGNATED and role(states, 1, 2) == Role.BLOCKED


def test_ring_of_four_blocks_exactly_one_link_end():
    states = converge([100, 40, 30, 20], {(0, 1): 100, (1, 2): 100, (2, 3): 100, (3, 0): 100})
    assert states[1].root_link == broker(0) and states[3].root_link == broker(0)
    assert states[2].root_link == broker(1)   # 200 us either way; 1 has the higher C
    blocked = [(i, peer) for i, state in states.items()
               for peer, r in state.roles.items() if r == Role.BLOCKED]
    assert blocked == [(2, broker(3))]
    assert role(states, 3, 2) == Role.DESIGNATED


def test_chain_keeps_every_link_active():
    states = converge([10, 20, 100, 30], {(0, 1): 50, (1, 2): 50, (2, 3): 50})
    assert all(r in (Role.ROOT, Role.DESIGNATED)
               for state in states.values() for r in state.roles.values())
    assert states[0].root_link == broker(1) and states[0].cost_us == 100


def test_a_neighbour_with_another_story_about_the_root_is_never_blocked():
    honest = Neighbour(100.0, RootClaim(broker(2), 100.0, 0), 50.0)
    # neighbour 1 names the same root with another C, at a cost below ours: comparing
    # costs alone would block our end while 1 may still need what we forward
    other_story = Neighbour(5.0, RootClaim(broker(2), 50.0, 1), 50.0)
    state = compute_tree(broker(0), 1.0, {broker(1): other_story, broker(2): honest})
    assert state.root == broker(2) and state.root_capability == 100.0
    assert state.roles[broker(1)] == Role.DESIGNATED
    same_story = Neighbour(5.0, RootClaim(broker(2), 100.0, 1), 50.0)
    state = compute_tree(broker(0), 1.0, {broker(1): same_story, broker(2): honest})
    assert state.roles[broker(1)] == Role.BLOCKED


# -- hysteresis ---------------------------------------------------------------------------


def test_hysteresis_keeps_the_root_link_against_a_slightly_better_path():
    previous = compute_tree(broker(0), 1.0, {
        broker(1): Neighbour(50.0, RootClaim(broker(3), 99.0, 100), 100.0),
        broker(2): Neighbour(40.0, RootClaim(broker(3), 99.0, 100), 120.0)})
    assert previous.root_link == broker(1) and previous.cost_us == 200
    slower = {broker(1): Neighbour(50.0, RootClaim(broker(3), 99.0, 100), 130.0),
              broker(2): Neighbour(40.0, RootClaim(broker(3), 99.0, 100), 120.0)}
    kept = compute_tree(broker(0), 1.0, slower, previous, hysteresis=0.2)
    assert kept.root_link == broker(1) and kept.cost_us == 200   # advertised cost kept too
    moved = compute_tree(broker(0), 1.0, slower, previous, hysteresis=0.0)
    assert moved.root_link == broker(2) and moved.cost_us == 220


def test_a_kept_cost_never_drops_to_the_parents_advertised_cost():
    parent = lambda cost: Neighbour(50.0, RootClaim(broker(3), 99.0, cost), 10.0)  # noqa: E731
    previous = compute_tree(broker(0), 1.0, {broker(1): parent(100)})
    assert previous.cost_us == 110
    # the parent's cost rose to 105: 115 is within 20 % of 110, but 110 would sit within
    # 5 us of the parent and blocking decisions compare these numbers: re-advertise
    state = compute_tree(broker(0), 1.0, {broker(1): parent(105)}, previous, hysteresis=0.2)
    assert state.cost_us == 110
    state = compute_tree(broker(0), 1.0, {broker(1): parent(110)}, previous, hysteresis=0.2)
    assert state.cost_us == 120


def test_hysteresis_must_be_a_finite_fraction():
    with pytest.raises(ValueError, match="hysteresis"):
        compute_tree(broker(0), 1.0, {}, hysteresis=math.nan)


def test_epochs_compare_as_serial_numbers_across_the_wrap():
    assert epoch_newer(1, 0) and not epoch_newer(0, 1) and not epoch_newer(5, 5)
    assert epoch_newer(0, 2**32 - 1) and not epoch_newer(2**32 - 1, 0)


def test_broker_ids_parse_and_refuse_what_is_not_address_and_port():
    assert BrokerId.parse("127.0.0.1:1883") == BrokerId("127.0.0.1", 1883)
    assert BrokerId.parse("[::1]:1883") == BrokerId("::1", 1883)
    assert str(BrokerId("::1", 1883)) == "[::1]:1883"
    for bad in ("localhost:1883", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:x"):
        with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
            BrokerId.parse(bad)


# -- the BPDU on the wire ------------------------------------------------------------------


def sample_bpdu(**changes) -> Bpdu:
    fields = dict(sender=BrokerId("127.0.0.1", 1884), sender_capability=10.0,
                  root=BrokerId("127.0.0.1", 1883), root_capability=20.0,
                  root_path_cost_us=150, epoch=7, topology_change=True)
    return Bpdu(**{**fields, **changes})


def test_bpdu_round_trips_in_40_bytes_with_ipv4():
    bpdu = sample_bpdu()
    payload = encode_bpdu(bpdu)
    assert len(payload) == 40
    assert decode_bpdu(payload) == bpdu
    v6 = sample_bpdu(sender=BrokerId("::1", 1884), root=BrokerId("::1", 1883))
    assert decode_bpdu(encode_bpdu(v6)) == v6


def _patched(offset: int, raw: bytes) -> bytes:
    payload = bytearray(encode_bpdu(sample_bpdu()))
    payload[offset:offset + len(raw)] = raw
    return bytes(payload)


SENDER_C, ROOT_C = 13, 28   # offsets of the two capabilities in an IPv4 BPDU


@pytest.mark.parametrize(("payload", "reason"), [
    (encode_bpdu(sample_bpdu())[:20], "truncated"),
    (b"", "truncated"),
    (encode_bpdu(sample_bpdu()) + b"\x00", "length"),
    (_patched(0, b"\x02"), "version"),
    (_patched(1, b"\x80"), "flags"),
    (_patched(6, b"\x05"), "address"),
    (_patched(SENDER_C, struct.pack("!d", math.nan)), "capability"),
    (_patched(SENDER_C, struct.pack("!d", math.inf)), "capability"),
    (_patched(ROOT_C, struct.pack("!d", -math.inf)), "capability"),
    (_patched(SENDER_C, struct.pack("!d", -1.0)), "capability"),
    (_patched(ROOT_C, struct.pack("!d", MAX_CAPABILITY * 10)), "capability"),
    (_patched(36, struct.pack("!I", 2**32 - 1)), "cost"),
])
def test_malformed_bpdus_are_refused_with_a_reason(payload, reason):
    with pytest.raises(MalformedBpdu) as caught:
        decode_bpdu(payload)
    assert caught.value.reason == reason


@pytest.mark.parametrize("bpdu", [
    sample_bpdu(root=BrokerId("127.0.0.1", 1884), root_capability=99.0, root_path_cost_us=0),
    sample_bpdu(root=BrokerId("127.0.0.1", 1884), root_capability=10.0, root_path_cost_us=5),
    sample_bpdu(root_capability=5.0),     # a root the sender itself outranks
    sample_bpdu(root_path_cost_us=0),     # someone else's root at no cost
])
def test_self_contradicting_claims_are_refused(bpdu):
    with pytest.raises(MalformedBpdu) as caught:
        decode_bpdu(encode_bpdu(bpdu))
    assert caught.value.reason == "inconsistent"


# -- topologies --------------------------------------------------------------------------


def test_named_topologies():
    assert topology_edges("full-mesh", 4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert topology_edges("ring", 4) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert topology_edges("ring", 2) == [(0, 1)]
    assert topology_edges("chain", 3) == [(0, 1), (1, 2)]
    assert topology_edges("chain", 1) == []


def test_explicit_edge_lists():
    assert topology_edges("0-1,1-2", 3) == [(0, 1), (1, 2)]
    assert topology_edges(" 2-0 , 1-0 ", 3) == [(0, 1), (0, 2)]
    assert topology_edges([[0, 1], [2, 1]], 3) == [(0, 1), (1, 2)]


@pytest.mark.parametrize(("kind", "named"), [
    ("star", "'star'"), ("0-1,x", "'0-1,x'"), ("0-1-2", "'0-1-2'"), ("0-5", "0-5"),
    ("0-0,0-1,1-2", "0-0"), ("0-1", "[2]"), ([[0, "1"]], "[[0, '1']]"), (42, "42"),
])
def test_bad_topologies_are_refused_naming_the_value(kind, named):
    with pytest.raises(ValueError) as caught:
        topology_edges(kind, 3)
    assert named in str(caught.value)


# -- the cluster-wide check -----------------------------------------------------------------


def node_state(i: int, root: int, links: dict[int, str], epoch: int = 1) -> dict:
    return {"id": f"127.0.0.1:{1883 + i}", "capability": 10.0 - i, "epoch": epoch,
            "root": f"127.0.0.1:{1883 + root}", "root_capability": 10.0 - root,
            "root_path_cost_us": 0,
            "links": [{"peer": f"127.0.0.1:{1883 + j}", "role": r} for j, r in links.items()]}


IDS = [f"127.0.0.1:{1883 + i}" for i in range(3)]
MESH = [(0, 1), (0, 2), (1, 2)]


def test_verdict_accepts_a_spanning_tree():
    states = [node_state(0, 0, {1: "designated", 2: "designated"}),
              node_state(1, 0, {0: "root", 2: "designated"}),
              node_state(2, 0, {0: "root", 1: "blocked"})]
    assert tree_verdict(states, IDS, [True] * 3, MESH) == (0, "")


@pytest.mark.parametrize(("states", "why"), [
    ([node_state(0, 0, {1: "designated", 2: "designated"}),
      node_state(1, 0, {0: "root", 2: "designated"}),
      node_state(2, 0, {0: "root", 1: "designated"})], "active at both ends"),
    ([node_state(0, 0, {1: "designated", 2: "designated"}),
      node_state(1, 0, {0: "root", 2: "blocked"}),
      node_state(2, 1, {0: "root", 1: "blocked"})], "disagree on the root"),
    ([node_state(0, 0, {1: "designated", 2: "designated"}),
      node_state(1, 0, {0: "root", 2: "blocked"}),
      node_state(2, 0, {0: "root", 1: "blocked"}, epoch=2)], "different epochs"),
    ([node_state(0, 0, {1: "blocked", 2: "designated"}),
      node_state(1, 0, {0: "root", 2: "blocked"}),
      node_state(2, 0, {0: "root", 1: "blocked"})], "whose end is blocked"),
    ([node_state(0, 0, {1: "designated", 2: "designated"}),
      node_state(1, 0, {0: "root", 2: "down"}),
      node_state(2, 0, {0: "root", 1: "blocked"})], "not up at both ends"),
    ([node_state(0, 0, {1: "designated", 2: "designated"}), None,
      node_state(2, 0, {0: "root", 1: "blocked"})], "no stats from brokers [1]"),
])
def test_verdict_names_what_is_not_converged(states, why):
    root, reason = tree_verdict(states, IDS, [True] * 3, MESH)
    assert root is None and why in reason


def test_verdict_waits_until_a_dead_neighbour_is_noticed_and_refuses_a_dead_root():
    noticed = [None, node_state(1, 1, {0: "down", 2: "designated"}),
               node_state(2, 1, {0: "down", 1: "root"})]
    assert tree_verdict(noticed, IDS, [False, True, True], MESH) == (1, "")
    unnoticed = [None, node_state(1, 1, {0: "designated", 2: "designated"}), noticed[2]]
    assert "not noticed that broker 0 is down" in \
        tree_verdict(unnoticed, IDS, [False, True, True], MESH)[1]
    dead_root = [None, node_state(1, 0, {0: "down", 2: "designated"}),
                 node_state(2, 0, {0: "down", 1: "root"})]
    assert "not a live broker" in tree_verdict(dead_root, IDS, [False, True, True], MESH)[1]
