"""The warm-up analysis a fresh Spark session does before the first run measures
(controller/analysis_warm_up.py): it must run the real pipeline on its synthetic rows, or
it warms nothing; and start_spark_in_background runs it only on a session it created."""

from __future__ import annotations

import pytest

from mqttbed.analytics import spark as spark_module
from mqttbed.controller import analysis_warm_up as warm_up
from mqttbed.controller.analysis_warm_up import warm_up_analysis


@pytest.mark.integration
# A fresh JVM's first analysis: 36 s of session set-up and 88 s of call in one CI run at
# load (over the default 120 s, whose timeout left the worker's Spark gateway broken for
# every test after it)
@pytest.mark.timeout(400)
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


def test_the_background_start_warms_only_a_session_it_created_then_nices_it(monkeypatch):
    """Start-up and warm-up at normal priority (nothing measures meanwhile: the first run
    is held), then the JVM's threads niced; a running session is left as it is."""
    steps: list[object] = []
    monkeypatch.setattr(spark_module, "_session", None)
    monkeypatch.setattr(spark_module, "_create",
                        lambda settings: steps.append("create") or "new")
    monkeypatch.setattr(spark_module, "spark_jvm_pid", lambda spark: 4242)
    monkeypatch.setattr(spark_module, "renice_threads",
                        lambda pid, by: steps.append(("renice", pid, by)))
    spark_module.start_spark_in_background(nice=7, then=steps.append).join(10)
    assert steps == ["create", "new", ("renice", 4242, 7)]

    def broken(_spark: object) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(spark_module, "_session", None)
    steps.clear()
    spark_module.start_spark_in_background(nice=7, then=broken).join(10)
    assert steps == ["create", ("renice", 4242, 7)]   # niced even so
    monkeypatch.setattr(spark_module, "_session", "running")
    steps.clear()
    spark_module.start_spark_in_background(nice=7, then=steps.append).join(10)
    assert steps == []
