"""The report's figures and scope table from stats.json alone (no controller, no browser)."""

from __future__ import annotations

from mqttbed.api.report import build_figures, scope_table


def dist(p50: float, **extra: float) -> dict[str, float]:
    return {"mean": p50, "std": 1.0, "p50": p50, "p90": p50, "p99": p50 * 2, "p999": p50 * 3,
            "max": p50 * 4, **extra}


def point(index: int, backend: str, subscribers: int, cpu: float, cpu_std: float,
          scope: dict | None = None) -> dict:
    return {
        "point_index": index, "backend": backend,
        "params": {"broker.backend": backend, "workload.subscribers": subscribers},
        "latency_us": dist(100.0 + index), "sync_spread_us": dist(10.0 + index),
        "first_last_spread_us": dist(5.0, std=2.5),
        "deliveries_received": 10, "lost": 0, "duplicates": 0, "reordered": 0,
        "broker": {"cpu_percent_mean": cpu, "cpu_percent_std": cpu_std,
                   "net_recv_kb_per_s": 3.0, "net_recv_kb_per_s_std": 0.5,
                   "net_sent_kb_per_s": 4.0, "net_sent_kb_per_s_std": 0.25},
        **({"scope": scope} if scope else {}),
    }


def stats(points: list[dict]) -> dict:
    return {"points": points, "runs": [], "series": {}}


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
    assert bars["scope latency_us p50"] == [90.0, 95.0]
    assert bars["scope sync_spread_us p50"] == [None, 7.0]
    rows = scope_table(stats(points)["points"], show_backend=False)
    assert rows[0]["scope_spread"] is None and rows[0]["spread_difference"] is None
    assert rows[0]["difference"] == 100.0 - 90.0
    assert rows[1]["spread_difference"] == 11.0 - 7.0 and rows[1]["acquisitions"] == 18


def test_a_points_model_latency_combines_all_its_runs_not_the_first():
    from mqttbed.controller.analysis import combine_latency_reports

    def report(packets: int, measured_mean: float, measured_p50: float, measured_max: float):
        modelled = {"mean": 809.2, "p50": 809.2, "p99": 809.2, "max": 809.2}
        return {"publish_packets": packets, "copies_per_publish_mean": 2.0,
                "modelled": {"first_copy": modelled},
                "emulator_measured": {"first_copy": {
                    "mean": measured_mean, "p50": measured_p50, "p99": measured_p50 * 2,
                    "max": measured_max}}}

    combined = combine_latency_reports([report(100, 10_000.0, 9_000.0, 50_000.0),
                                        report(300, 20_000.0, 19_000.0, 90_000.0),
                                        report(100, 30_000.0, 29_000.0, 70_000.0)])
    assert combined["publish_packets"] == 500
    assert combined["modelled"]["first_copy"]["mean"] == 809.2
    measured = combined["emulator_measured"]["first_copy"]
    assert measured["mean"] == (100 * 10_000 + 300 * 20_000 + 100 * 30_000) / 500
    assert measured["p50"] == 19_000.0 and measured["p99"] == 38_000.0
    assert measured["max"] == 90_000.0
    assert combine_latency_reports([{"publish_packets": 0}]) == {"publish_packets": 0}
