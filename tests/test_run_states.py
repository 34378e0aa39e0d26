"""The run state machine."""

from __future__ import annotations

import pytest

from mqttbed.controller.states import TERMINAL_STATES, TRANSITIONS, RunState, check_transition
from mqttbed.core.errors import IllegalTransition

HAPPY_PATH = [RunState.QUEUED, RunState.DEPLOYING, RunState.RUNNING, RunState.COLLECTING,
              RunState.DONE]


def test_the_happy_path_is_legal():
    for current, target in zip(HAPPY_PATH, HAPPY_PATH[1:], strict=False):
        check_transition(current, target)  # raises IllegalTransition if not
        assert target in TRANSITIONS[current]
    assert HAPPY_PATH[-1] in TERMINAL_STATES


@pytest.mark.parametrize("state", [RunState.DEPLOYING, RunState.RUNNING, RunState.COLLECTING])
def test_an_active_run_can_fail_or_be_interrupted(state):
    check_transition(state, RunState.FAILED)
    check_transition(state, RunState.INTERRUPTED)


def test_skipping_a_state_raises_a_named_error():
    with pytest.raises(IllegalTransition, match="from queued to running"):
        check_transition(RunState.QUEUED, RunState.RUNNING)


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_terminal_states_have_no_way_out(state):
    with pytest.raises(IllegalTransition, match="terminal"):
        check_transition(state, RunState.DEPLOYING)
