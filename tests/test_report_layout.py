"""The report at a glance, as figures and HTML (no browser): legends of many runs, the
$SYS plot from the run's start, category labels with room. The browser's view of the
same: tests/test_browser.py."""

from __future__ import annotations

from datetime import UTC, datetime

from mqttbed.analytics.results import CampaignStats, SysTopicSeries, results_model
from mqttbed.api.report import build_figures
from mqttbed.api.report_legends import PALETTE, PLOT_AREA_PX, TOP_PX, readable_legend
from mqttbed.api.report_sys import sys_rate_figure

RECEIVED, SENT = "$SYS/broker/messages/received", "$SYS/broker/messages/sent"


def lines(count: int, name: str = "scenario=mosquitto-qos1-at-least-once, subscribers=10"
          ) -> dict:
    return {"data": [{"type": "scatter", "mode": "lines", "name": f"{name} #{i}",
                      "x": [0.0, 1.0], "y": [i, i]} for i in range(count)],
            "layout": {"title": {"text": "t"}}}


def test_a_legend_of_twelve_runs_lies_under_the_plot_which_keeps_its_height():
    figure = readable_legend(lines(12))
    layout = figure["layout"]
    assert layout["legend"]["orientation"] == "h" and layout["legend"]["yref"] == "container"
    margin = layout["margin"]
    # the plot area (height less the margins) stays, the legend's rows add below it
    assert layout["height"] - margin["t"] - margin["b"] == PLOT_AREA_PX
    assert margin["b"] >= 80 + 12 * 19   # one long name a row: twelve rows
    assert layout["colorway"] == list(PALETTE)   # 24 hues, not Plotly's 10


def test_series_past_24_are_told_apart_by_their_dash():
    figure = readable_legend(lines(30))
    dashes = [trace.get("line", {}).get("dash") for trace in figure["data"]]
    assert dashes[:24] == [None] * 24 and dashes[24:] == ["dot"] * 6


def test_a_figure_that_places_its_own_legend_or_has_one_entry_is_left_alone():
    placed = lines(12)
    placed["layout"]["legend"] = {"x": 1.02}
    assert "height" not in readable_legend(placed)["layout"]
    single = readable_legend(lines(1))
    assert single["layout"] == {"title": {"text": "t"}}


def test_long_point_names_on_a_category_axis_get_room_below_the_plot():
    names = [f"scenario=mosquitto-qos{q}-at-least-once, subscribers={n}"
             for q in range(3) for n in (2, 10)]
    bars = {"data": [{"type": "bar", "name": "CPU %", "x": names, "y": [1.0] * 6}],
            "layout": {}}
    layout = readable_legend(bars)["layout"]
    assert layout["xaxis"]["tickangle"] == 30
    # half the longest name's width (sin 30°) more than a one-line axis
    assert layout["margin"]["b"] >= 80 + len(names[0]) * 6.5 / 2
    assert layout["height"] == TOP_PX + PLOT_AREA_PX + layout["margin"]["b"]
    short = {"data": [{"type": "bar", "name": "CPU %", "x": ["a", "b"], "y": [1, 2]}],
             "layout": {}}
    assert readable_legend(short)["layout"] == {}


def stats_with_sys(sys_topics: dict[str, dict[str, SysTopicSeries]]) -> CampaignStats:
    document = results_model(()).model_validate({
        "campaign": {"id": "c1"}, "generated_at": datetime.now(UTC), "points": [],
        "runs": []})
    return document.model_copy(update={"series": document.series.model_copy(
        update={"sys_topics": sys_topics})})


def test_sys_samples_from_before_the_run_stay_in_the_results_but_are_not_drawn():
    # deployed 30 s before the start, idle until it; 100 messages/s from the start on
    before = [-30.0, -20.0, -10.0, -0.5]
    during = [1.5, 2.5, 3.5]
    series = SysTopicSeries(t_s=before + during,
                            value=[0.0, 1.0, 2.0, 3.0, 203.0, 303.0, 403.0])
    stats = stats_with_sys({"r1": {RECEIVED: series}})
    figure = sys_rate_figure(stats, {"r1": "run 1"}, 40)
    assert figure is not None
    (curve,) = figure["data"]
    # only the intervals that begin in the run: [1.5, 2.5] and [2.5, 3.5]
    assert curve["x"] == [2.5, 3.5] and curve["y"] == [100.0, 100.0]
    assert figure["layout"]["xaxis"]["rangemode"] == "tozero"
    assert stats.series.sys_topics["r1"][RECEIVED].t_s[0] == -30.0   # kept


def test_a_runs_two_counters_share_a_colour_and_a_legend_entry_and_short_runs_are_named():
    every_second = SysTopicSeries(t_s=[0.0, 1.0, 2.0], value=[0.0, 10.0, 30.0])
    one_update = SysTopicSeries(t_s=[-5.0, 0.4], value=[0.0, 9.0])
    stats = stats_with_sys({f"r{i}": {RECEIVED: every_second, SENT: every_second}
                            for i in range(11)} | {"short": {RECEIVED: one_update}})
    figure = sys_rate_figure(stats, {}, 40)
    assert figure is not None
    traces = figure["data"]
    assert len(traces) == 22 and sum(t["showlegend"] for t in traces) == 11
    assert {t["line"]["color"] for t in traces} == set(PALETTE[:11])
    for received, sent in zip(traces[::2], traces[1::2], strict=True):
        assert received["line"]["color"] == sent["line"]["color"]
        assert (received["line"]["dash"], sent["line"]["dash"]) == ("solid", "dot")
    assert "not drawn: 1 of 12 runs" in figure["layout"]["legend"]["title"]["text"]
    assert sys_rate_figure(stats_with_sys({"short": {RECEIVED: one_update}}), {}, 40) is None


def test_every_figure_of_a_report_goes_through_the_legend_layout():
    point = {"point_index": 0, "backend": "mosquitto", "runs": 1, "runs_failed": 0,
             "run_ids": [], "sections": {}, "params": {"workload.subscribers": 2}}
    stats = results_model(()).model_validate({
        "campaign": {"id": "c1"}, "generated_at": datetime.now(UTC), "points": [point],
        "runs": []})
    figures = build_figures(stats, {})
    # the delivery bars: four counts side by side, their legend under the plot
    assert figures["plot-delivery"]["layout"]["legend"]["orientation"] == "h"
