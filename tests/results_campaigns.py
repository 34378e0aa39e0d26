"""Two small real campaigns in one data dir, for the tests of the commands and of
``mqttbed.results`` that read results (``latest``, ``latest~1``, DataFrames, events).

Made once per test process (the tests only read them): Mosquitto, the agent program on
threads of this process, and this process's Spark session, so they cost a few seconds of
runs and one analysis each rather than a ``mqttbed run`` (an interpreter and a JVM) each.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

# Two points of two runs each (parameters as columns, runs to group), then a campaign of
# one run: two campaigns to tell apart.
FIRST = {"name": "results-first", "broker": {"backend": "mosquitto"},
         "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 200, "messages": 40,
                      "warmup_messages": 5},
         "agents": {"count": 1}, "timing": {"start_lead_s": 0.2, "drain_s": 0.3},
         "sweep": {"workload.subscribers": [1, 2]}, "repetitions": 2}
SECOND = {**FIRST, "name": "results-second", "sweep": {}, "repetitions": 1,
          "workload": {**FIRST["workload"], "subscribers": 3}}


# the pytest-xdist group of the tests that read them: on one worker, made once
RESULTS_CAMPAIGNS = "results-campaigns"


@dataclass(frozen=True)
class Campaigns:
    """The data dir and its two campaigns' ids, oldest first."""

    data_dir: Path
    first: str
    second: str


@functools.cache
def _made(root: Path) -> Campaigns:
    from mqttbed.agents.in_process import start_agents
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    data_dir = root / "data"
    ids = []
    with create_controller(Settings(data_dir=data_dir), start_agents=start_agents) as ctl:
        for spec in (FIRST, SECOND):
            campaign_id = ctl.engine.create_campaign(parse_spec(spec))
            status = ctl.run_campaign(campaign_id)
            assert status == "done", f"{spec['name']} ended {status}"
            ids.append(campaign_id)
    return Campaigns(data_dir, *ids)


_ROOT: list[Path] = []


def two_campaigns(factory: pytest.TempPathFactory) -> Campaigns:
    """The two campaigns, made on the first call in this process."""
    if not _ROOT:
        _ROOT.append(factory.mktemp("results-campaigns"))
    return _made(_ROOT[0])
