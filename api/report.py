"""The campaign report: summary rows and Plotly figures built from ``stats.json``.

The same context renders the live web page and the self-contained HTML file of
``mqttbed report`` (Plotly inlined, nothing fetched from anywhere).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from mqttbed.controller.controller import Controller
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.states import CampaignStatus

TEMPLATES = Path(__file__).with_name("templates")
MAX_TIMELINE_RUNS = 40
_AXIS_US = {"title": {"text": "µs"}}
_NOT_SWEPT = ("broker.backend", "scenario")


def plotly_js_path() -> Path:
    """The Plotly bundle shipped inside the plotly package (no CDN: labs are often offline)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def templates() -> Environment:
    return Environment(loader=FileSystemLoader(TEMPLATES),
                       autoescape=select_autoescape(["html"]))


def point_label(point: dict[str, Any], show_backend: bool) -> str:
    parts = [f"{k.split('.')[-1]}={v}" for k, v in point["params"].items()
             if k != "broker.backend"]
    if show_backend:
        parts.insert(0, point["backend"])
    return ", ".join(parts) or "all runs"


def _numeric_axis(points: list[dict[str, Any]]) -> str | None:
    """The swept parameter to put on an x axis: the first one with numbers only."""
    keys = [k for k in (points[0]["params"] if points else {}) if k not in _NOT_SWEPT]
    for key in keys:
        if all(isinstance(p["params"].get(key), int | float) for p in points):
            return key
    return None


def _series_key(point: dict[str, Any], x_key: str | None) -> str:
    """Which curve a point belongs to: everything but the x parameter (without a numeric
    parameter the x axis names the points, and there is one curve per backend)."""
    if x_key is None:
        return point["backend"]
    rest = {k: v for k, v in point["params"].items() if k not in (x_key, "broker.backend")}
    name = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in rest.items())
    return f"{point['backend']}" + (f" ({name})" if name else "")


def _versus_parameter(points: list[dict[str, Any]], figure: str, title: str,
                      references: list[dict[str, Any]], show_backend: bool) -> dict[str, Any]:
    """p50 with p99 whiskers of ``figure`` against the swept parameter, a curve per backend."""
    x_key = _numeric_axis(points)
    curves: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        curves.setdefault(_series_key(point, x_key), []).append(point)
    data = []
    for name, members in curves.items():
        members = [m for m in members if m[figure]["p50"] is not None]
        if x_key:
            members.sort(key=lambda m: m["params"][x_key])
        xs = [m["params"][x_key] if x_key else point_label(m, False) for m in members]
        p50 = [m[figure]["p50"] for m in members]
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{name}: p50",
                     "x": xs, "y": p50,
                     "error_y": {"type": "data", "symmetric": False,
                                 "array": [m[figure]["p99"] - m[figure]["p50"] for m in members],
                                 "arrayminus": [0] * len(members)}})
        if figure == "sync_spread_us":
            # The seed papers' own measure (mean ± std of last-subscribed minus
            # first-subscribed arrival): the one to hold against their reference points.
            data.append({"type": "scatter", "mode": "lines+markers", "name":
                         f"{name}: first→last subscribed, mean ± std",
                         "line": {"dash": "dot"}, "x": xs,
                         "y": [m["first_last_spread_us"]["mean"] for m in members],
                         "error_y": {"type": "data", "array": [
                             m["first_last_spread_us"].get("std") or 0 for m in members]}})
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


def build_figures(stats: dict[str, Any], spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every plot of the report as a Plotly figure (data + layout), keyed by element id."""
    points = stats["points"]
    series = stats.get("series", {})
    show_backend = len({p["backend"] for p in points}) > 1
    labels = {p["point_index"]: point_label(p, show_backend) for p in points}
    references = spec.get("report", {}).get("reference", [])
    figures: dict[str, dict[str, Any]] = {}

    cdf = series.get("latency_cdf_us", {})
    levels = [i / 100 for i in range(101)]
    figures["plot-latency-cdf"] = {"data": [
        {"type": "scatter", "mode": "lines", "name": labels[int(k)], "x": values, "y": levels}
        for k, values in sorted(cdf.items(), key=lambda kv: int(kv[0]))],
        "layout": {"title": {"text": "Latency CDF per sweep point"},
                   "xaxis": {"title": {"text": "latency (µs)"}, "type": "log"},
                   "yaxis": {"title": {"text": "fraction of deliveries"}}}}

    figures["plot-sync-spread"] = _versus_parameter(
        points, "sync_spread_us", "Sync spread (max − min arrival over subscribers)",
        [r for r in references if r["plot"] == "sync_spread"], show_backend)
    figures["plot-latency"] = _versus_parameter(
        points, "latency_us", "Publisher → subscriber latency",
        [r for r in references if r["plot"] == "latency"], show_backend)

    run_label = {r["run_id"]: f"{labels.get(r['point_index'], '?')} #{r['repetition']}"
                 for r in stats["runs"]}
    timeline = series.get("latency_timeline", {})
    figures["plot-latency-time"] = {"data": [
        {"type": "scatter", "mode": "lines", "name": run_label.get(run_id, run_id),
         "x": t["t_s"], "y": t["p50_us"]}
        for run_id, t in list(timeline.items())[:MAX_TIMELINE_RUNS]],
        "layout": {"title": {"text": "Median latency over time per run (100 ms bins)"
                             + (f", first {MAX_TIMELINE_RUNS} runs"
                                if len(timeline) > MAX_TIMELINE_RUNS else "")},
                   "xaxis": {"title": {"text": "time since first measured publish (s)"}},
                   "yaxis": _AXIS_US}}

    names = [labels[p["point_index"]] for p in points]
    figures["plot-delivery"] = {"data": [
        {"type": "bar", "name": key, "x": names, "y": [p[key] for p in points]}
        for key in ("deliveries_received", "lost", "duplicates", "reordered")],
        "layout": {"title": {"text": "Delivery accounting (warm-up excluded; log scale, "
                                     "zero counts draw no bar)"},
                   "barmode": "group", "yaxis": {"title": {"text": "deliveries"},
                                                 "type": "log"}}}

    def broker_bars(keys: tuple[tuple[str, str, str], ...], title: str, unit: str
                    ) -> dict[str, Any]:
        """Bars per point; with several backends, the backends side by side per point."""
        groups = ({p["backend"] for p in points} if show_backend else {None})
        data = []
        for backend in sorted(groups, key=str):
            members = [p for p in points if backend is None or p["backend"] == backend]
            for key, std_key, name in keys:
                data.append({
                    "type": "bar", "name": f"{backend}: {name}" if backend else name,
                    "x": [point_label(p, False) for p in members],
                    "y": [p["broker"][key] for p in members],
                    "error_y": {"type": "data", "array": [p["broker"].get(std_key) or 0
                                                          for p in members]}})
        return {"data": data, "layout": {"title": {"text": title}, "barmode": "group",
                                         "yaxis": {"title": {"text": unit}}}}

    scoped = [p for p in points if p.get("scope")]
    if scoped:
        scoped_names = [labels[p["point_index"]] for p in scoped]
        # A scope watching one subscriber measures no spread: that pair of bars is left out.
        figures["plot-scope"] = {"data": [
            {"type": "bar", "name": f"{source} {figure} p50", "x": scoped_names,
             "y": [_p50((p["scope"] if source == "scope" else p).get(figure)) for p in scoped]}
            for figure in ("latency_us", "sync_spread_us")
            if any(p["scope"].get(figure) for p in scoped) for source in ("software", "scope")],
            "layout": {"title": {"text": "Software timestamps against the oscilloscope (p50)"},
                       "barmode": "group", "yaxis": _AXIS_US}}

    figures["plot-broker-cpu"] = broker_bars(
        (("cpu_percent_mean", "cpu_percent_std", "CPU %"),),
        "Broker CPU, whole process tree (mean ± std over runs)", "% of one core")
    figures["plot-broker-net"] = broker_bars(
        (("net_recv_kb_per_s", "net_recv_kb_per_s_std", "received"),
         ("net_sent_kb_per_s", "net_sent_kb_per_s_std", "sent")),
        "Broker I/O (mean ± std over runs)", "kB/s")
    return figures


def report_context(core: Controller, campaign_id: str) -> dict[str, Any]:
    """Everything the report template shows for one campaign."""
    with core.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        if campaign is None:
            raise KeyError(campaign_id)
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    stats_path = core.layout.campaign_dir(campaign_id) / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    ended = campaign.status in (CampaignStatus.DONE, CampaignStatus.FAILED,
                                CampaignStatus.CANCELLED)
    show_backend = bool(stats) and len({p["backend"] for p in stats["points"]}) > 1
    import yaml

    scope_rows = scope_table(stats["points"], show_backend) if stats else []
    model_rows = [{"label": point_label(p, show_backend),
                   **p["broker_reported"]["hardware_latency_ns"]}
                  for p in (stats["points"] if stats else []) if p.get("broker_reported")]
    flagged = [run for p in (stats["points"] if stats else [])
               for run in p.get("clock_flagged_runs", [])]
    scope_errors = [f"{r['run_id']}: {r['error']}" for p in (stats["points"] if stats else [])
                    for r in p.get("scope_runs", []) if r.get("error")]
    return {
        "scope_rows": scope_rows, "clock_flagged": flagged, "model_rows": model_rows,
        "scope_errors": scope_errors,
        "campaign": campaign, "runs": runs, "stats": stats,
        "spec_yaml": yaml.safe_dump(campaign.spec, sort_keys=False),
        "points": [{"label": point_label(p, show_backend), **p} for p in stats["points"]]
        if stats else [],
        "figures": build_figures(stats, campaign.spec) if stats else {},
        "live": not (ended and stats),
        "finished": sum(r.state in ("done", "failed", "interrupted") for r in runs),
    }


def scope_table(points: list[dict[str, Any]], show_backend: bool) -> list[dict[str, Any]]:
    """Per point measured by a scope: software and scope figures and their differences."""
    rows = []
    for point in points:
        if not point.get("scope"):
            continue
        software, scope = point["latency_us"]["p50"], point["scope"]["latency_us"]["p50"]
        software_spread = _p50(point["sync_spread_us"])
        scope_spread = _p50(point["scope"].get("sync_spread_us"))  # None: one line watched
        rows.append({
            "label": point_label(point, show_backend),
            "acquisitions": point["scope"]["acquisitions"],
            "software_p50": software, "scope_p50": scope,
            "difference": _difference(software, scope),
            "software_spread": software_spread, "scope_spread": scope_spread,
            "spread_difference": _difference(software_spread, scope_spread)})
    return rows


def _p50(distribution: dict[str, Any] | None) -> float | None:
    return None if not distribution else distribution.get("p50")


def _difference(software: float | None, scope: float | None) -> float | None:
    return None if software is None or scope is None else software - scope


def script_json(value: Any) -> str:
    """JSON safe to put inside a <script> element."""
    return json.dumps(value).replace("</", "<\\/")


def render_report(core: Controller, campaign_id: str, *, standalone: bool) -> str:
    """The report page; ``standalone`` inlines Plotly and drops live updates and links."""
    context = report_context(core, campaign_id)
    plotly_inline = plotly_js_path().read_text() if standalone else None
    return templates().get_template("report.html").render(
        **context, standalone=standalone, plotly_inline=plotly_inline,
        figures_json=script_json(context["figures"]))
