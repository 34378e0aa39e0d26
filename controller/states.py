"""The run state machine: queued -> deploying -> running -> collecting -> done.

A run may fail from any active state, or be interrupted (controller stopped or campaign
cancelled). Terminal states have no way out.

A campaign goes created -> queued -> running -> analysing -> done, failed or cancelled:
what its runs came to becomes its status only once its statistics are computed.
"""

from __future__ import annotations

from enum import StrEnum

from mqttbed.core.errors import IllegalTransition


class RunState(StrEnum):
    QUEUED = "queued"
    DEPLOYING = "deploying"
    RUNNING = "running"
    COLLECTING = "collecting"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class CampaignStatus(StrEnum):
    CREATED = "created"
    QUEUED = "queued"
    RUNNING = "running"
    ANALYSING = "analysing"   # the runs have ended; Spark computes the statistics
    DONE = "done"             # only once stats.json exists
    FAILED = "failed"
    CANCELLED = "cancelled"


CAMPAIGN_ENDED = frozenset({CampaignStatus.DONE, CampaignStatus.FAILED,
                            CampaignStatus.CANCELLED})
# Started and not ended: statistics are on their way.
CAMPAIGN_UNDER_WAY = frozenset({CampaignStatus.QUEUED, CampaignStatus.RUNNING,
                                CampaignStatus.ANALYSING})


_ENDINGS = {RunState.FAILED, RunState.INTERRUPTED}
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.DEPLOYING, RunState.INTERRUPTED}),
    RunState.DEPLOYING: frozenset({RunState.RUNNING} | _ENDINGS),
    RunState.RUNNING: frozenset({RunState.COLLECTING} | _ENDINGS),
    RunState.COLLECTING: frozenset({RunState.DONE} | _ENDINGS),
    RunState.DONE: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.INTERRUPTED: frozenset(),
}
ACTIVE_STATES = frozenset({RunState.DEPLOYING, RunState.RUNNING, RunState.COLLECTING})
TERMINAL_STATES = frozenset(s for s, nexts in TRANSITIONS.items() if not nexts)


def check_transition(current: RunState, target: RunState) -> None:
    """Raise IllegalTransition unless the state machine connects ``current`` to ``target``."""
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (terminal)"
        raise IllegalTransition(f"run cannot go from {current} to {target}; allowed: {allowed}")
