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
