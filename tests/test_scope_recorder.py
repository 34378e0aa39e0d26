"""The scope recorder's acquisition loop against a scripted instrument (no scope here)."""

from __future__ import annotations

import time

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments
from mqttbed.controller.scope_recorder import ScopeRecorder
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import Endpoint
from tests.conftest import wait_until

SPEC = parse_spec({
    "name": "rec", "agents": {"count": 1},
    "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 100, "messages": 50,
                 "warmup_messages": 10},
    "measurement": {"scope": {"resource": "virtual", "acquisitions": 3,
                              "channels": {"publisher": 1, "subscribers": [2, 3]}}}})


class ScriptedScope:
    """Answers wait_triggered from a script; records when each acquisition was armed."""

    def __init__(self, triggers: list[bool]):
        self.triggers = list(triggers)
        self.armed_ns: list[int] = []

    def arm_single(self) -> None:
        self.armed_ns.append(monotonic_ns())

    def wait_triggered(self, _timeout_s: float) -> bool:
        return self.triggers.pop(0) if self.triggers else False

    def edge_delays_s(self) -> dict[int, float | None]:
        return {2: 100e-6, 3: 150e-6}

    def close(self) -> None:
        pass


def recorder_with(scope: ScriptedScope) -> ScopeRecorder:
    assignments = plan_assignments(SPEC, "r", "c", Endpoint(host="127.0.0.1", port=1), ["a"])
    recorder = ScopeRecorder(SPEC.measurement.scope, assignments)
    recorder._scope = scope  # what open() would have connected to
    return recorder


def test_it_arms_after_the_warm_up_and_again_after_an_acquisition_without_a_trigger():
    scope = ScriptedScope([True, False, False, True, True])
    recorder = recorder_with(scope)
    t_start = monotonic_ns()
    recorder.start(t_start)
    deadline = time.monotonic() + 5
    while recorder.acquisitions < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    recorder.stop()
    # first armed half a period before the first measured message: 10 warm-up periods of
    # 10 ms, less 5 ms
    assert scope.armed_ns[0] >= t_start + 95_000_000
    assert recorder.acquisitions == 3 and recorder.timeouts == 2 and len(scope.armed_ns) == 5
    assert recorder.error is None
    assert sorted({row["seq"] for row in recorder._rows}) == [0, 1, 2]


def test_a_run_that_ends_first_stops_the_loop_with_what_was_caught():
    scope = ScriptedScope([True])  # then never again
    recorder = recorder_with(scope)
    recorder.start(monotonic_ns() - 1_000_000_000)  # warm-up long over: arm at once
    wait_until(lambda: recorder.acquisitions == 1 and recorder.timeouts >= 1, 5,
               "the recorder's one acquisition and a timeout after it")
    recorder.stop()
    assert recorder.acquisitions == 1 and recorder.timeouts >= 1 and recorder.error is None


class FedScope:
    """Records what the recorder feeds the virtual scope (channel, edges) and the horizon."""

    def __init__(self) -> None:
        self.fed: list[tuple[int, list[tuple[int, int]]]] = []
        self.horizons: list[int] = []

    def feed(self, channel: int, edges: list[tuple[int, int]]) -> None:
        self.fed.append((channel, edges))

    def advance(self, horizon_ns: int) -> None:
        self.horizons.append(horizon_ns)


def test_edges_of_a_binary_chunk_feed_the_virtual_scope_as_a_json_chunks_do():
    """The same edges, as a JSON chunk's lists and as a decoded binary chunk's Arrow
    arrays: each probed line gets the same edges on the controller's clock."""
    from array import array

    from mqttbed.controller.agent_api import binary_result_chunk
    from mqttbed.core.binary_chunk import EdgeBuffers, encode_chunk
    from mqttbed.core.events import EVENT_COLUMNS
    from mqttbed.core.protocol import ClockEstimate, ResultChunk

    probes = [recorder_with(ScriptedScope([])) for _ in range(2)]
    pub, subs = probes[0].publisher, probes[0].subscribers
    pins = [pub.pin, subs[0].pin, 99, subs[1].pin, pub.pin, subs[0].pin]
    times = [1_000, 1_010, 1_015, 1_020, 2_000, 2_012]
    levels = [1, 1, 1, 1, 0, 0]
    lists = ResultChunk(run_id="c-r0000", agent_id=pub.agent_id, seq=0,
                        columns={name: [] for name in EVENT_COLUMNS},
                        edges={"pin": pins, "t_ns": times, "level": levels},
                        edges_until_ns=3_000)
    binary = binary_result_chunk(encode_chunk(
        run_id="c-r0000", agent_id=pub.agent_id, seq=0, batches=[], constants={},
        edges=EdgeBuffers(array("i", pins).tobytes(), array("q", times).tobytes(),
                          bytes(levels)), edges_until_ns=3_000))
    fed = []
    for recorder, chunk in zip(probes, (lists, binary), strict=True):
        recorder._virtual = FedScope()   # what open() would have started
        recorder.set_clocks({pub.agent_id: ClockEstimate(offset_ns=400, uncertainty_ns=1,
                                                         method="ntp")})
        recorder.feed(chunk)
        fed.append((recorder._virtual.fed, recorder._virtual.horizons))
    assert fed[0] == fed[1]
    assert fed[0] == ([(pub.channel, [(600, 1), (1_600, 0)]),
                       (subs[0].channel, [(610, 1), (1_612, 0)]),
                       (subs[1].channel, [(620, 1)])], [2_600])
