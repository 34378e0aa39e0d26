"""A run without clients measures the idle broker for its whole window."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.run_record import run_record

pytestmark = pytest.mark.integration


def test_idle_run_samples_the_broker_for_the_window_without_agents(controller, updates):
    spec = parse_spec({"name": "idle", "workload": {"publishers": 0, "subscribers": 0,
                                                    "min_window_s": 1.5}})
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "done"
    run_id = f"{campaign_id}-r0000"
    with controller.sessions() as s:
        run = s.get(RunRow, run_id)
    assert run_record(run.run_metadata, run.id).agents == {}
    samples = pq.read_table(controller.layout.run_samples(campaign_id, run_id)
                            / "samples.parquet").to_pylist()
    covered_s = (samples[-1]["t_ns"] - samples[0]["t_ns"]) / 1e9
    assert covered_s >= 1.5
    assert all(s["processes"] == 1 for s in samples)
