"""The broker's own message rate, from the ``$SYS`` counters it publishes during a run.

The sampler subscribes to ``$SYS/#`` when the broker is deployed, often long before the
run starts (the first run's deploy can wait half a minute or more for the analysis JVM),
so a run's series keep samples from before its start, at negative times. They stay in
the results; the plot draws only the update intervals that lie wholly in the run (from
its start on), and its x axis starts at the run's start: a rate averaged over idle time
before the run would read as the broker's rate during it.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import CampaignStats, SysTopicSeries
from mqttbed.api.report_legends import series_style

# Mosquitto's cumulative message counters on $SYS: their slope is the broker's own rate.
SYS_COUNTERS = {"$SYS/broker/messages/received": "received",
                "$SYS/broker/messages/sent": "sent"}


def rates_in_run(series: SysTopicSeries) -> list[tuple[float, float]]:
    """(end of interval s, messages/s over it) for each interval between two updates of a
    counter that begins at or after the run's start."""
    pairs = list(zip(series.t_s, series.value, strict=True))
    return [(t1, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1)
            in zip(pairs, pairs[1:], strict=False) if t1 > t0 >= 0]


def sys_rate_figure(stats: CampaignStats, run_label: dict[str, str], max_runs: int
                    ) -> dict[str, Any] | None:
    """Messages/s the broker itself counted, per run of the first ``max_runs`` over the
    run's time (a run's two counters in one colour, one legend entry); None when no run
    has a whole update interval of those counters in it."""
    data: list[dict[str, Any]] = []
    counted, too_short = 0, 0
    for index, (run_id, topics) in enumerate(list(stats.series.sys_topics.items())[:max_runs]):
        style = series_style(index)
        counters = {direction: topics[topic] for topic, direction in SYS_COUNTERS.items()
                    if topic in topics}
        counted += bool(counters)
        drawn = 0
        for direction, series in counters.items():
            if not (rates := rates_in_run(series)):
                continue
            # markers: a short run may have a single whole interval, a line of one point
            data.append({
                "type": "scatter", "mode": "lines+markers",
                "name": run_label.get(run_id, run_id),
                "legendgroup": run_id, "showlegend": drawn == 0,
                "line": {"color": style["color"],
                         "dash": "solid" if direction == "received" else "dot"},
                "marker": {"color": style["color"], "symbol": style["symbol"], "size": 5},
                "hovertemplate": f"{direction}: %{{y:.0f}} messages/s at %{{x:.1f}} s",
                "x": [t for t, _ in rates], "y": [r for _, r in rates]})
            drawn += 1
        too_short += bool(counters) and drawn == 0
    if not data:
        return None
    shorter = (f"<br>not drawn: {too_short} of {counted} runs, too short for a whole "
               "update interval" if too_short else "")
    return {"data": data, "layout": {
        "title": {"text": "Broker's own message rate ($SYS counters, per update interval)"},
        "legend": {"title": {"text": f"per run: solid received, dotted sent{shorter}",
                             "side": "top"}},
        "xaxis": {"title": {"text": "time since the run's start (s)"}, "rangemode": "tozero"},
        "yaxis": {"title": {"text": "messages/s"}}}}
