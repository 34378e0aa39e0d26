"""The campaign report: summary rows and Plotly figures built from the results model.

The same context renders the live web page and the self-contained HTML file of
``mqttbed report`` (Plotly inlined, nothing fetched from anywhere).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from mqttbed.analytics.results import (
    BrokerResources,
    CampaignStats,
    LatencyDistribution,
    PointStats,
    SpreadDistribution,
    present_sections,
)
from mqttbed.analytics.results_files import StaleResults
from mqttbed.api.report_connect_storm import connect_storm_figures, connect_storm_tables
from mqttbed.api.report_connections import CONNECT_PHASES, connection_figure, connection_rows
from mqttbed.api.report_legends import readable_legend
from mqttbed.api.report_retained import retained_report_figures
from mqttbed.api.report_search import VERDICT_COLOURS, search_figures
from mqttbed.api.report_sessions import away_figures, away_tables
from mqttbed.api.report_streams import stream_latency_cdf, stream_rows
from mqttbed.api.report_subscriptions import subscription_figures
from mqttbed.api.report_sys import sys_rate_figure
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import Controller
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.states import CampaignStatus
from mqttbed.core.backends import declaration
from mqttbed.core.report_figures import (
    FigurePoint,
    ReportFigures,
    flat_figures,
    numeric_axis,
    scalar_versus_parameter,
    series_key,
)
from mqttbed.core.report_figures import point_label as label_of
from mqttbed.core.run_record import run_record
from mqttbed.core.sections import Distribution

TEMPLATES = Path(__file__).with_name("templates")
MAX_TIMELINE_RUNS = 40
_AXIS_US = {"title": {"text": "µs"}}


def plotly_js_path() -> Path:
    """The Plotly bundle shipped inside the plotly package (no CDN: labs are often offline)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def templates() -> Environment:
    return Environment(loader=FileSystemLoader(TEMPLATES),
                       autoescape=select_autoescape(["html"]))


def point_label(point: PointStats, show_backend: bool) -> str:
    return label_of(point.params, point.backend, show_backend)


def figure_point(point: PointStats) -> FigurePoint:
    """A point as backends' report figures (and the scalar plots here) see it."""
    return FigurePoint(point.point_index, point.backend, point.params,
                       flat_figures(point.model_dump(mode="json")))


def _interval_bars(values: list[float | None], intervals: list[tuple[float, float] | None]
                   ) -> dict[str, Any]:
    """Asymmetric error bars from each value to its interval's ends (none without one)."""
    return {"type": "data", "symmetric": False,
            "array": [0 if ci is None or v is None else max(ci[1] - v, 0) for v, ci in
                      zip(values, intervals, strict=True)],
            "arrayminus": [0 if ci is None or v is None else max(v - ci[0], 0) for v, ci in
                           zip(values, intervals, strict=True)]}


def _versus_parameter(points: list[PointStats],
                      figure: Callable[[PointStats], LatencyDistribution | SpreadDistribution],
                      title: str, references: list[dict[str, Any]], *,
                      first_last: bool = False) -> dict[str, Any]:
    """p50 with its 95 % interval across runs, and p99, of ``figure`` against the swept
    parameter; a curve per backend."""
    x_key = numeric_axis([p.params for p in points])
    curves: dict[str, list[PointStats]] = {}
    for point in points:
        curves.setdefault(series_key(point.params, point.backend, x_key), []).append(point)
    data = []
    for name, members in curves.items():
        members = [m for m in members if figure(m).p50 is not None]
        if x_key:
            members.sort(key=lambda m: m.params[x_key])
        xs = [m.params[x_key] if x_key else point_label(m, False) for m in members]
        stats = [figure(m) for m in members]
        p50 = [s.p50 for s in stats]
        data.append({"type": "scatter", "mode": "lines+markers",
                     "name": f"{name}: p50 (95 % CI over runs)", "x": xs, "y": p50,
                     "error_y": _interval_bars(p50, [s.p50_ci for s in stats])})
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{name}: p99",
                     "line": {"dash": "dash"}, "x": xs, "y": [s.p99 for s in stats]})
        if first_last:
            # The seed papers' own measure (mean ± std of last-subscribed minus
            # first-subscribed arrival): the one to hold against their reference points.
            # A spread cannot be negative, so the lower bar stops at zero.
            means = [m.first_last_spread_us.mean for m in members]
            stds = [m.first_last_spread_us.std or 0 for m in members]
            data.append({"type": "scatter", "mode": "lines+markers", "name":
                         f"{name}: first→last subscribed, mean ± std (clipped at 0)",
                         "line": {"dash": "dot"}, "x": xs, "y": means,
                         "error_y": {"type": "data", "symmetric": False, "array": stds,
                                     "arrayminus": [min(s, m or 0) for s, m in
                                                    zip(stds, means, strict=True)]}})
    by_label: dict[str, list[dict[str, Any]]] = {}
    for ref in references:
        by_label.setdefault(ref["label"], []).append(ref)
    for label, refs in by_label.items():
        data.append({"type": "scatter", "mode": "markers", "name": label,
                     "marker": {"symbol": "diamond-open", "size": 12},
                     "x": [r["x"] for r in refs], "y": [r["y_us"] for r in refs],
                     "error_y": {"type": "data",
                                 "array": [r.get("std_us") or 0 for r in refs]}})
    return {"data": data, "layout": {
        "title": {"text": title}, "yaxis": _AXIS_US,
        "xaxis": {"title": {"text": x_key or "sweep point"}}}}


def backend_figures(backend: str) -> ReportFigures | None:
    """The figures backend ``backend`` adds to a report (None: none, or it is no longer
    installed: its results still show, without its own plots)."""
    try:
        return declaration(backend).report_figures
    except ValueError:
        return None


def build_figures(stats: CampaignStats, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every plot of the report as a Plotly figure (data + layout), keyed by element id."""
    points = stats.points
    show_backend = len({p.backend for p in points}) > 1
    labels = {p.point_index: point_label(p, show_backend) for p in points}
    references = spec.get("report", {}).get("reference", [])
    plain = [figure_point(p) for p in points]
    figures: dict[str, dict[str, Any]] = {}
    if stats.search is not None:   # a capacity search: its probe path first
        figures |= search_figures(stats.search)
    # what each backend of the campaign adds (e.g. MQTT-ST's latency against locality)
    for backend in sorted({p.backend for p in points}):
        if (own := backend_figures(backend)) is not None:
            figures |= own([p for p in plain if p.backend == backend], spec)

    cdf = stats.series.latency_cdf_us
    levels = [i / 100 for i in range(101)]
    figures["plot-latency-cdf"] = {"data": [
        {"type": "scatter", "mode": "lines", "name": labels[int(k)], "x": values, "y": levels}
        for k, values in sorted(cdf.items(), key=lambda kv: int(kv[0]))],
        "layout": {"title": {"text": "Latency CDF per sweep point"},
                   "xaxis": {"title": {"text": "latency (µs)"}, "type": "log"},
                   "yaxis": {"title": {"text": "fraction of deliveries"}}}}

    if (streams := stream_latency_cdf(stats, labels)) is not None:
        figures["plot-stream-latency-cdf"] = streams

    figures["plot-sync-spread"] = _versus_parameter(
        points, lambda p: p.sync_spread_us, "Sync spread (max − min arrival over subscribers)",
        [r for r in references if r["plot"] == "sync_spread"], first_last=True)
    figures["plot-latency"] = _versus_parameter(
        points, lambda p: p.latency_us, "Publisher → subscriber latency",
        [r for r in references if r["plot"] == "latency"])

    if any(p.publication_msgs_per_s is not None for p in points) and spec.get(
            "workload", {}).get("pacing") == "closed-loop":
        # The MQTT-ST paper's Figs. 3-5: QoS 2 publication throughput and mean delay.
        figures["plot-publication"] = scalar_versus_parameter(
            plain, lambda p: p.figures.get("publication_msgs_per_s"),
            lambda p: p.figures.get("publication_msgs_per_s_std"),
            "Publication throughput per publisher, closed loop (mean ± std over publishers)",
            "messages/s")
        figures["plot-mean-delay"] = scalar_versus_parameter(
            plain, lambda p: p.figures.get("latency_us.mean"), lambda p: None,
            "End-to-end delay (mean over deliveries)", "µs")
    if any(p.fault is not None for p in points):
        figures["plot-fault"] = scalar_versus_parameter(
            plain, lambda p: p.figures.get("fault.delivery_resumed_s.mean"),
            lambda p: p.figures.get("fault.delivery_resumed_s.std"),
            "After the fault: until every subscriber received again (mean ± std over runs)",
            "s")

    run_label = {r.run_id: f"{labels.get(r.point_index, '?')} #{r.repetition}"
                 for r in stats.runs}
    timeline = stats.series.latency_timeline
    figures["plot-latency-time"] = {"data": [
        {"type": "scatter", "mode": "lines", "name": run_label.get(run_id, run_id),
         "x": t.t_s, "y": t.p50_us}
        for run_id, t in list(timeline.items())[:MAX_TIMELINE_RUNS]],
        "layout": {"title": {"text": "Median latency over time per run (100 ms bins)"
                             + (f", first {MAX_TIMELINE_RUNS} runs"
                                if len(timeline) > MAX_TIMELINE_RUNS else "")},
                   "xaxis": {"title": {"text": "time since first measured publish (s)"}},
                   "yaxis": _AXIS_US}}

    if (broker_rates := sys_rate_figure(stats, run_label, MAX_TIMELINE_RUNS)) is not None:
        figures["plot-sys-rates"] = broker_rates   # beside latency over time
    if (connects := connection_figure(points, labels)) is not None:
        figures["plot-connections"] = connects
    figures.update(connect_storm_figures(points, labels))  # workload.mode connect
    figures.update(subscription_figures(points, labels))  # shared groups, topic trees
    figures.update(retained_report_figures(points, labels))  # late subscribers' state
    figures.update(away_figures(points, labels))  # persistent sessions, reconnect storms

    names = [labels[p.point_index] for p in points]
    figures["plot-delivery"] = {"data": [
        {"type": "bar", "name": name, "x": names, "y": [count(p) for p in points]}
        for name, count in (("received", lambda p: p.deliveries_received),
                            ("lost", lambda p: p.lost), ("duplicates", lambda p: p.duplicates),
                            ("reordered", lambda p: p.reordered))],
        "layout": {"title": {"text": "Delivery accounting (warm-up excluded; log scale, "
                                     "zero counts draw no bar)"},
                   "barmode": "group", "yaxis": {"title": {"text": "deliveries"},
                                                 "type": "log"}}}

    def broker_bars(keys: tuple[tuple[Callable[[BrokerResources], float | None],
                                      Callable[[BrokerResources], float | None], str], ...],
                    title: str, unit: str) -> dict[str, Any]:
        """Bars per point; with several backends, the backends side by side per point."""
        groups = ({p.backend for p in points} if show_backend else {None})
        data = []
        for backend in sorted(groups, key=str):
            members = [p for p in points if backend is None or p.backend == backend]
            for value, std, name in keys:
                data.append({
                    "type": "bar", "name": f"{backend}: {name}" if backend else name,
                    "x": [point_label(p, False) for p in members],
                    "y": [value(p.broker) for p in members],
                    "error_y": {"type": "data", "array": [std(p.broker) or 0
                                                          for p in members]}})
        return {"data": data, "layout": {"title": {"text": title}, "barmode": "group",
                                         "yaxis": {"title": {"text": unit}}}}

    scoped = [p for p in points if p.scope is not None]
    if scoped:
        scoped_names = [labels[p.point_index] for p in scoped]
        # A scope watching one subscriber measures no spread: that pair of bars is left out.
        pairs = (("latency", lambda p: p.latency_us, lambda p: p.scope.latency_us),
                 ("spread", lambda p: p.sync_spread_us, lambda p: p.scope.sync_spread_us))
        figures["plot-scope"] = {"data": [
            {"type": "bar", "name": f"{source} {name} p50", "x": scoped_names,
             "y": [_p50(measured(p)) for p in scoped]}
            for name, software, scope in pairs if any(scope(p) for p in scoped)
            for source, measured in (("software", software), ("scope", scope))],
            "layout": {"title": {"text": "Software timestamps against the oscilloscope (p50)"},
                       "barmode": "group", "yaxis": _AXIS_US}}

    figures["plot-broker-cpu"] = broker_bars(
        ((lambda b: b.cpu_percent_mean, lambda b: b.cpu_percent_std, "CPU %"),),
        "Broker CPU, whole process tree (mean ± std over runs)", "% of one core")
    figures["plot-broker-net"] = broker_bars(
        ((lambda b: b.net_recv_kb_per_s, lambda b: b.net_recv_kb_per_s_std, "received"),
         (lambda b: b.net_sent_kb_per_s, lambda b: b.net_sent_kb_per_s_std, "sent")),
        "Broker I/O (mean ± std over runs)", "kB/s")
    for figure in figures.values():   # nine runs' labels and more: under the plot
        readable_legend(figure)
    return figures


def section_tables(points: list[PointStats], show_backend: bool) -> list[dict[str, Any]]:
    """One table per backend section any point has: a row per point, a column per figure
    (a distribution shows its p50). Nothing here knows a backend's figures by name."""
    tables: dict[str, dict[str, Any]] = {}
    for point in points:
        for key, section in present_sections(point.sections).items():
            table = tables.setdefault(key, {
                "key": key, "title": type(section).title, "note": type(section).note,
                "fields": [], "rows": []})
            flat = section.flat_figures()
            table["fields"] += [name for name in flat if name not in table["fields"]]
            table["rows"].append({"label": point_label(point, show_backend), "flat": flat})
    for table in tables.values():
        table["columns"] = [name + (" p50" if any(
            isinstance(row["flat"].get(name), Distribution) for row in table["rows"]) else "")
            for name in table["fields"]]
        for row in table["rows"]:
            values = [row["flat"].get(name) for name in table["fields"]]
            row["cells"] = [v.p50 if isinstance(v, Distribution) else v for v in values]
    return list(tables.values())


def broker_ranking(points: list[PointStats]) -> list[dict[str, Any]]:
    """Brokers side by side, best first: at each sweep point every broker measured (the
    same parameters but the broker), brokers are ranked by p50 latency, and a broker that
    lost messages there ranks after every broker that did not. Each row: the mean rank
    over those points, the points it was ranked at, and its median p50 and worst p99
    latency and total loss over all its points. Empty for a campaign of one broker."""
    if len({p.backend for p in points}) < 2:
        return []
    shared: dict[str, list[PointStats]] = {}
    for point in points:
        key = json.dumps({k: v for k, v in point.params.items()
                          if k not in ("broker.backend", "scenario")}, sort_keys=True,
                         default=str)
        shared.setdefault(key, []).append(point)
    ranks: dict[str, list[int]] = {}
    for members in shared.values():
        measured = [m for m in members if m.latency_us.p50 is not None]
        if len({m.backend for m in measured}) < 2:
            continue
        ordered = sorted(measured, key=lambda m: (m.lost > 0, m.latency_us.p50))
        for rank, member in enumerate(ordered, start=1):
            ranks.setdefault(member.backend, []).append(rank)
    rows = []
    for backend in sorted({p.backend for p in points}):
        own = [p for p in points if p.backend == backend]
        p50s = [p.latency_us.p50 for p in own if p.latency_us.p50 is not None]
        p99s = [p.latency_us.p99 for p in own if p.latency_us.p99 is not None]
        mine = ranks.get(backend, [])
        rows.append({"backend": backend,
                     "mean_rank": sum(mine) / len(mine) if mine else None,
                     "ranked_points": len(mine), "points": len(own),
                     "median_p50_us": statistics.median(p50s) if p50s else None,
                     "worst_p99_us": max(p99s) if p99s else None,
                     "lost": sum(p.lost for p in own)})
    return sorted(rows, key=lambda r: (r["mean_rank"] is None, r["mean_rank"] or 0,
                                       r["backend"]))


def report_context(controller: Controller, campaign_id: str) -> dict[str, Any]:
    """Everything the report template shows for one campaign."""
    import yaml

    with controller.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        if campaign is None:
            raise KeyError(campaign_id)
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    try:
        stats, stale = load_results(controller.layout, campaign_id), None
    except StaleResults as exc:   # an older results file: the page says how to upgrade it
        stats, stale = None, str(exc)
    points = stats.points if stats else []
    ended = campaign.status in (CampaignStatus.DONE, CampaignStatus.FAILED,
                                CampaignStatus.CANCELLED)
    show_backend = len({p.backend for p in points}) > 1
    return {
        "scope_rows": scope_table(points, show_backend),
        "clock_flagged": [run for p in points for run in p.clock_flagged_runs],
        "rate_not_kept": [run for p in points for run in p.rate_not_kept_runs],
        # agents on other machines: how each one's offset was found, and how good it was
        "agent_clocks": [(r.run_id, agent_id, clock) for r in stats.runs
                         for agent_id, clock in r.clock.agents.items()
                         if clock.method != "same-clock"] if stats else [],
        "section_tables": section_tables(points, show_backend) + connect_storm_tables(
            [(point_label(p, show_backend), p) for p in points]) + away_tables(
            [(point_label(p, show_backend), p) for p in points]),
        "broker_ranking": broker_ranking(points),
        "scope_errors": [f"{r.run_id}: {r.error}" for p in points if p.scope
                         for r in p.scope.runs if r.error],
        "scope_shortfalls": [f"{r.run_id}: {r.acquisitions} of {r.requested}"
                             for p in points if p.scope for r in p.scope.runs if r.shortfall],
        # runs whose figures cover only what was stored before they ended
        "partial_runs": {r.run_id for r in stats.runs if r.partial} if stats else set(),
        "cpu_budgets": cpu_budget_notes(runs),
        "scope_wiring": scope_wiring_rows(runs),
        "campaign": campaign, "runs": runs, "stats": stats, "stale_results": stale,
        "spec_yaml": yaml.safe_dump(campaign.spec, sort_keys=False),
        "points": [(point_label(p, show_backend), p) for p in points],
        "stream_rows": stream_rows([(point_label(p, show_backend), p) for p in points]),
        "connection_rows": connection_rows([(point_label(p, show_backend), p)
                                            for p in points]),
        "connect_phases": [heading for heading, _ in CONNECT_PHASES],
        "figures": build_figures(stats, campaign.spec) if stats else {},
        "live": not (ended and stats),
        "search": stats.search if stats else None, "verdict_colours": VERDICT_COLOURS,
        "finished": sum(r.state in ("done", "failed", "interrupted") for r in runs),
    }


def cpu_budget_notes(runs: list[RunRow]) -> dict[str, str]:
    """Per run under ``broker.cpu_limit``: the budget, and how often it held each broker
    back (quota periods in which the broker used up its share and waited)."""
    notes = {}
    for run in runs:
        record = run_record(run.run_metadata, run.id).cpu_budget
        if record is None:
            continue
        held = "; ".join(
            f"{name} throttled in {budget.throttled_periods} of {budget.periods} periods"
            + (f" ({budget.throttled_s:.2f} s)" if budget.throttled_s is not None else "")
            + (f", on CPU {', '.join(map(str, budget.cpus))}" if budget.cpus else "")
            for name, budget in record.brokers.items() if budget.periods is not None)
        notes[run.id] = (f"{record.cores:g} cores per broker ({record.mechanism})"
                         + (f": {held}" if held else ""))
    return notes


def scope_wiring_rows(runs: list[RunRow]) -> list[dict[str, Any]]:
    """Where each scope channel's probe was, over the runs a scope watched: one row per
    channel and line (a channel with two rows was rewired within the campaign), with the
    clients it watched and how many runs. Records from before the wiring was kept give
    the channel and client only."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run in runs:
        scope = run_record(run.run_metadata, run.id).scope
        if scope is None:
            continue
        lines: dict[str, tuple[str, str, str | None, int | None, int | None]] = {
            channel: (line.role, line.client, line.host, line.bcm_pin, line.header_pin)
            for channel, line in scope.wiring.items()} or {
            channel: ("", client, None, None, None) for channel, client in scope.channels.items()}
        for channel, (role, client, host, bcm_pin, header_pin) in lines.items():
            row = rows.setdefault((int(channel), role, host, bcm_pin), {
                "channel": f"CH{channel}", "role": role, "clients": [], "host": host,
                "bcm_pin": bcm_pin, "header_pin": header_pin, "runs": 0})
            row["runs"] += 1
            if client not in row["clients"]:
                row["clients"].append(client)
    return [rows[key] for key in sorted(rows, key=lambda k: (k[0], str(k[1:])))]


def scope_table(points: list[PointStats], show_backend: bool) -> list[dict[str, Any]]:
    """Per point measured by a scope: software and scope figures and their differences."""
    rows = []
    for point in points:
        if point.scope is None:
            continue
        software, scope = point.latency_us.p50, point.scope.latency_us.p50
        software_spread = point.sync_spread_us.p50
        scope_spread = _p50(point.scope.sync_spread_us)  # None: one line watched
        rows.append({
            "label": point_label(point, show_backend),
            "acquisitions": point.scope.acquisitions,
            "requested": point.scope.requested, "shortfall": point.scope.shortfall,
            "software_p50": software, "scope_p50": scope,
            "difference": _difference(software, scope),
            "software_spread": software_spread, "scope_spread": scope_spread,
            "spread_difference": _difference(software_spread, scope_spread)})
    return rows


def _p50(distribution: Distribution | None) -> float | None:
    return None if distribution is None else distribution.p50


def _difference(software: float | None, scope: float | None) -> float | None:
    return None if software is None or scope is None else software - scope


def script_json(value: Any) -> str:
    """JSON safe to put inside a <script> element."""
    return json.dumps(value).replace("</", "<\\/")


def render_report(controller: Controller, campaign_id: str, *, standalone: bool) -> str:
    """The report page; ``standalone`` inlines Plotly and drops live updates and links."""
    context = report_context(controller, campaign_id)
    plotly_inline = plotly_js_path().read_text() if standalone else None
    return templates().get_template("report.html").render(
        **context, standalone=standalone, plotly_inline=plotly_inline,
        figures_json=script_json(context["figures"]))
