"""The report's figures and scope table from stats.json alone (no controller, no browser)."""

from __future__ import annotations

from datetime import UTC, datetime

from mqttbed.analytics.results import CampaignStats, SysTopicSeries, results_model
from mqttbed.api.report import broker_ranking, build_figures, scope_table


def dist(p50: float, **extra: float) -> dict[str, float]:
    return {"count": 10, "mean": p50, "std": 1.0, "p50": p50, "p90": p50, "p99": p50 * 2,
            "p999": p50 * 3, "max": p50 * 4, **extra}


def point(index: int, backend: str, subscribers: int, cpu: float, cpu_std: float,
          scope: dict | None = None) -> dict:
    return {
        "point_index": index, "backend": backend, "runs": 3, "runs_failed": 0,
        "run_ids": [], "sections": {},
        "params": {"broker.backend": backend, "workload.subscribers": subscribers},
        "latency_us": dist(100.0 + index), "sync_spread_us": dist(10.0 + index),
        "first_last_spread_us": dist(5.0, std=2.5),
        "deliveries_received": 10, "lost": 0, "duplicates": 0, "reordered": 0,
        "broker": {"cpu_percent_mean": cpu, "cpu_percent_std": cpu_std,
                   "net_recv_kb_per_s": 3.0, "net_recv_kb_per_s_std": 0.5,
                   "net_sent_kb_per_s": 4.0, "net_sent_kb_per_s_std": 0.25},
        **({"scope": scope} if scope else {}),
    }


def stats(points: list[dict]) -> CampaignStats:
    return results_model(()).model_validate({
        "campaign": {"id": "c1"}, "generated_at": datetime.now(UTC), "points": points,
        "runs": []})


def test_broker_bars_carry_each_backends_std_over_runs():
    figures = build_figures(stats([point(0, "mosquitto", 2, 20.0, 2.4),
                                   point(1, "forkpipe", 2, 24.0, 2.9)]), {})
    cpu = {bar["name"]: bar for bar in figures["plot-broker-cpu"]["data"]}
    assert cpu["forkpipe: CPU %"]["error_y"]["array"] == [2.9]
    assert cpu["mosquitto: CPU %"]["error_y"]["array"] == [2.4]
    net = {bar["name"]: bar["error_y"]["array"] for bar in figures["plot-broker-net"]["data"]}
    assert net["mosquitto: received"] == [0.5] and net["mosquitto: sent"] == [0.25]


def test_first_to_last_spread_is_drawn_as_mean_with_its_std():
    figures = build_figures(stats([point(0, "mosquitto", 2, 1.0, 0.1),
                                   point(1, "mosquitto", 10, 1.0, 0.1)]), {})
    (dotted,) = [c for c in figures["plot-sync-spread"]["data"] if "first→last" in c["name"]]
    assert dotted["y"] == [5.0, 5.0] and dotted["error_y"]["array"] == [2.5, 2.5]


def test_a_scope_watching_one_subscriber_has_no_spread_and_the_report_still_renders():
    one_line = {"latency_us": dist(90.0), "acquisitions": 20}
    both = {"latency_us": dist(95.0), "sync_spread_us": dist(7.0), "acquisitions": 18}
    points = [point(0, "mosquitto", 2, 1.0, 0.1, scope=one_line),
              point(1, "mosquitto", 10, 1.0, 0.1, scope=both)]
    bars = {bar["name"]: bar["y"] for bar in build_figures(stats(points), {})["plot-scope"]["data"]}
    assert bars["scope latency p50"] == [90.0, 95.0]
    assert bars["scope spread p50"] == [None, 7.0]
    rows = scope_table(stats(points).points, show_backend=False)
    assert rows[0]["scope_spread"] is None and rows[0]["spread_difference"] is None
    assert rows[0]["difference"] == 100.0 - 90.0
    assert rows[1]["spread_difference"] == 11.0 - 7.0 and rows[1]["acquisitions"] == 18


def test_p50_is_drawn_with_its_interval_across_runs_and_p99_as_its_own_curve():
    points = [point(0, "mosquitto", 2, 1.0, 0.1), point(1, "mosquitto", 10, 1.0, 0.1)]
    points[0]["latency_us"]["p50_ci"] = [90.0, 130.0]     # p50 is 100
    figures = build_figures(stats(points), {})
    curves = {c["name"]: c for c in figures["plot-latency"]["data"]}
    p50 = curves["mosquitto: p50 (95 % CI over runs)"]
    assert p50["y"] == [100.0, 101.0]
    assert p50["error_y"]["array"] == [30.0, 0] and p50["error_y"]["arrayminus"] == [10.0, 0]
    assert curves["mosquitto: p99"]["y"] == [200.0, 202.0]


def test_first_to_last_bars_never_reach_below_zero():
    skewed = point(0, "mosquitto", 2, 1.0, 0.1)
    skewed["first_last_spread_us"] = dist(5.0, mean=3.0, std=8.0)
    (dotted,) = [c for c in build_figures(stats([skewed]), {})["plot-sync-spread"]["data"]
                 if "first→last" in c["name"]]
    assert dotted["error_y"]["array"] == [8.0] and dotted["error_y"]["arrayminus"] == [3.0]


def test_a_message_mix_gets_a_latency_cdf_per_stream_of_each_point():
    points = [point(0, "mosquitto", 2, 1.0, 0.1), point(1, "mosquitto", 10, 1.0, 0.1)]
    for p in points:
        p["streams"] = {"small": {"topic": "m/s", "payload_bytes": 100},
                        "large": {"topic": "m/l", "payload_bytes": 1_000_000}}
    document = stats(points).model_dump()
    quantiles = [float(q) for q in range(101)]
    document["series"]["stream_latency_cdf_us"] = {
        "0": {"small": quantiles, "large": quantiles}, "1": {"small": quantiles}}
    figures = build_figures(type(stats([])).model_validate(document), {})
    curves = figures["plot-stream-latency-cdf"]["data"]
    assert [c["name"] for c in curves] == [
        "subscribers=2: small, 100 B", "subscribers=2: large, 1,000,000 B",
        "subscribers=10: small, 100 B"]
    assert [c["line"]["dash"] for c in curves] == ["solid", "dash", "solid"]
    assert curves[0]["x"] == quantiles and curves[0]["y"][-1] == 1.0


def test_a_campaign_without_streams_has_no_stream_plot():
    figures = build_figures(stats([point(0, "mosquitto", 2, 1.0, 0.1)]), {})
    assert "plot-stream-latency-cdf" not in figures


def test_the_cloud_is_averaged_over_its_locations_against_locality():
    spec = {"workload": {"placement": "distributed"},
            "scenarios": [{"name": "distributed"},
                          {"name": "cloud-a", "workload.placement": "benchmark"},
                          {"name": "cloud-b", "workload.placement": "benchmark"}]}
    means_ms = {("distributed", 0): 75, ("distributed", 100): 1,
                ("cloud-a", 0): 70, ("cloud-a", 100): 2, ("cloud-b", 0): 80, ("cloud-b", 100): 150}
    points = []
    for index, ((scenario, locality), ms) in enumerate(means_ms.items()):
        p = point(index, "mqtt-st", 10, 1.0, 0.1)
        p["params"] = {"scenario": scenario, "broker.locality_percent": locality}
        p["latency_us"] = dist(ms * 1e3)
        points.append(p)
    curves = {c["name"]: c for c in build_figures(stats(points), spec)["plot-locality"]["data"]}
    cloud = curves["cloud, mean over its locations"]
    assert cloud["x"] == [0, 100] and cloud["y"] == [75.0, 76.0]
    assert curves["mqtt-st (scenario=distributed)"]["y"] == [75.0, 1.0]


def test_the_report_shows_partial_runs_and_points_and_the_scope_shortfall(controller):
    """A failed run's figures and its point read as partial; a scope that made 8 of 20
    acquisitions says so, in the scope table and above it."""
    from mqttbed.analytics.results_files import write_stats
    from mqttbed.api.report import render_report
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.analysis import results_type

    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "partial", "sweep": {"workload.messages": [100, 200]}}))
    shortfall = {"latency_us": dist(90.0), "acquisitions": 8, "requested": 20, "shortfall": 12,
                 "runs": [{"run_id": f"{campaign_id}-r0001", "acquisitions": 8,
                           "requested": 20, "shortfall": 12}]}
    points = [{**point(0, "mosquitto", 2, 1.0, 0.1), "runs": 0, "runs_failed": 1,
               "partial": True},
              point(1, "mosquitto", 2, 1.0, 0.1, scope=shortfall)]
    clock = {"max_fraction_of_spread": 0.1, "flagged": False}
    runs = [{"run_id": f"{campaign_id}-r0000", "point_index": 0, "repetition": 0,
             "params": {}, "backend": "mosquitto", "state": "failed", "partial": True,
             "reason": "agent lost: a0", "clock": clock, "sections": {}},
            {"run_id": f"{campaign_id}-r0001", "point_index": 1, "repetition": 0,
             "params": {}, "backend": "mosquitto", "state": "done", "clock": clock,
             "sections": {}}]
    document = results_type().model_validate({
        "campaign": {"id": campaign_id}, "generated_at": datetime.now(UTC),
        "points": points, "runs": runs})
    write_stats(document, controller.layout.campaign_dir(campaign_id))

    html = render_report(controller, campaign_id, standalone=False)
    assert html.count('<span class="error partial"') == 2  # point 0 and run r0000
    assert f"<td class=\"l\">{campaign_id}-r0000</td>" in html
    assert ('id="scope-shortfall">The scope made fewer acquisitions\nthan asked for in 1 '
            f"run(s), so their scope figures rest on fewer: {campaign_id}-r0001: 8 of 20") in html
    assert "<td>8 of 20</td>" in html


def test_brokers_are_ranked_by_p50_at_each_shared_point_and_a_lossy_one_ranks_last():
    # at 2 subscribers: nats 101 µs < mosquitto 103 µs < amqtt 104 µs, but nats lost some;
    # at 10: mosquitto 100 < nats 102; amqtt was not measured there
    points = [point(3, "mosquitto", 2, 1.0, 0.1), point(1, "nats", 2, 1.0, 0.1),
              point(4, "amqtt", 2, 1.0, 0.1), point(0, "mosquitto", 10, 1.0, 0.1),
              point(2, "nats", 10, 1.0, 0.1)]
    points[1]["lost"] = 7
    rows = broker_ranking(stats(points).points)
    assert [r["backend"] for r in rows] == ["mosquitto", "amqtt", "nats"]
    by = {r["backend"]: r for r in rows}
    assert by["mosquitto"]["mean_rank"] == 1.0 and by["mosquitto"]["ranked_points"] == 2
    assert by["amqtt"]["mean_rank"] == 2.0 and by["amqtt"]["ranked_points"] == 1
    assert by["nats"]["mean_rank"] == 2.5 and by["nats"]["lost"] == 7
    assert by["mosquitto"]["median_p50_us"] == 101.5 and by["mosquitto"]["worst_p99_us"] == 206
    assert broker_ranking(stats([point(0, "mosquitto", 2, 1.0, 0.1)]).points) == []


def test_a_backends_own_figures_come_from_its_declaration():
    # mqtt-st declares the locality plot; a campaign without that sweep gets none
    with_locality = [point(0, "mqtt-st", 2, 1.0, 0.1), point(1, "mqtt-st", 2, 1.0, 0.1)]
    for i, pct in enumerate((0, 100)):   # (the first numeric parameter is the x axis)
        with_locality[i]["params"] = {"broker.locality_percent": pct,
                                      **with_locality[i]["params"]}
    figures = build_figures(stats(with_locality), {})
    (curve,) = figures["plot-locality"]["data"]
    assert curve["x"] == [0, 100] and curve["y"] == [0.1, 0.101]
    assert "plot-locality" not in build_figures(stats([point(0, "mqtt-st", 2, 1.0, 0.1)]), {})


def test_the_brokers_own_rate_is_the_slope_of_its_sys_counters():
    document = stats([point(0, "mosquitto", 2, 1.0, 0.1)])
    document = document.model_copy(update={"series": document.series.model_copy(update={
        "sys_topics": {"r1": {
            "$SYS/broker/messages/received": SysTopicSeries(t_s=[0.0, 1.0, 3.0],
                                                            value=[10.0, 110.0, 510.0]),
            "$SYS/broker/uptime": SysTopicSeries(t_s=[0.0, 1.0], value=[5.0, 6.0])}}})})
    (curve,) = build_figures(document, {})["plot-sys-rates"]["data"]
    assert curve["x"] == [1.0, 3.0] and curve["y"] == [100.0, 200.0]
    assert "plot-sys-rates" not in build_figures(stats([point(0, "fpga", 2, 1.0, 0.1)]), {})
