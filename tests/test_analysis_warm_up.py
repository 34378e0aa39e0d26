"""The warm-up analysis a fresh Spark session does before the first run measures
(controller/analysis_warm_up.py): it must run the real pipeline on its synthetic rows, or
it warms nothing; and start_spark_in_background runs it only on a session it created."""

from __future__ import annotations

import pytest

from mqttbed.analytics import spark as spark_module
from mqttbed.controller import analysis_warm_up as warm_up
from mqttbed.controller.analysis_warm_up import warm_up_analysis


@pytest.mark.integration
def test_the_warm_up_campaign_goes_through_the_whole_analysis(spark):
    stats = warm_up_analysis(spark)
    measured = warm_up.MESSAGES - warm_up.WARMUP_MESSAGES
    assert [run.state for run in stats.runs] == ["done"] * warm_up.RUNS
    for run in stats.runs:
        assert run.messages_sent == measured
        assert run.deliveries_received == run.deliveries_expected == measured * 2
        assert run.lost == run.duplicates == 0
        # kernel stamps (t_recv_ns) are read, not the user-space ones 40 us later:
        # 100 us + 0 or 9 us per rank + 0..30 us by seq
        latency = run.latency_us
        assert latency.count == measured * 2
        assert latency.p50 is not None and latency.max is not None
        assert 100 <= latency.p50 <= latency.max <= 139
        assert run.generator is not None and run.generator.rate_kept
    (point,) = stats.points
    assert point.deliveries_received == measured * 2 * warm_up.RUNS


def test_the_background_start_warms_only_a_session_it_created(monkeypatch):
    made, warmed = [], []
    monkeypatch.setattr(spark_module, "_session", None)
    monkeypatch.setattr(spark_module, "_create", lambda settings: made.append(1) or "new")
    spark_module.start_spark_in_background(nice=0, then=warmed.append).join(10)
    assert made == [1] and warmed == ["new"]
    monkeypatch.setattr(spark_module, "_session", "running")
    spark_module.start_spark_in_background(nice=0, then=warmed.append).join(10)
    assert made == [1] and warmed == ["new"]
