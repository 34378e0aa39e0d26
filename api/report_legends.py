"""Legends and axis labels that stay readable with many series and long point names.

Plotly's default legend sits at the right of the plot and takes its width from the
longest name; with nine runs' labels it squeezes the plot to a sliver and scrolls, and
its ten default colours repeat from the eleventh series on. Every figure of the report
goes through :func:`readable_legend` instead: the legend lies horizontally under the x
axis, the figure grows by the legend's height and by its slanted category labels (the
plot area keeps its size), and series past ten take a 24-colour palette, then a dash
pattern per further 24.
"""

from __future__ import annotations

import math
from typing import Any

# plotly's qualitative "Dark24": 24 hues that stay distinct, and dark enough on white
PALETTE = ("#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#222A2A", "#B68100",
           "#750D86", "#EB663B", "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D",
           "#6C7C32", "#778AAE", "#862A16", "#A777F1", "#620042", "#1616A7", "#DA60CA",
           "#6C4516", "#0D2A63", "#AF0038")
PLOTLY_DEFAULT_COLOURS = 10
# past 24 series a line's dash tells it from the one of the same colour 24 before it
DASHES = ("solid", "dot", "dash", "dashdot")

PLOT_AREA_PX = 300     # the plot's own height, kept whatever the legend's
TOP_PX = 60            # the title
AXIS_PX = 80           # the x axis' tick labels (one line) and title, below the plot area
# Text in Plotly's default 12-px font: a legend row's height, the symbol and gap before
# an entry's text, a character's width (in Chromium 56 characters took 350 px), and the
# width a plot has in the report's narrowest grid cell (620 px less the 80-px left and
# 30-px right margins).
ENTRY_ROW_PX = 19
ENTRY_SYMBOL_PX = 45
CHAR_PX = 6.5
PLOT_WIDTH_PX = 500
TICK_ANGLE = 30        # category labels too long to stand side by side slant this much


def legend_entries(figure: dict[str, Any]) -> list[str]:
    """The names the legend shows: one per trace, or per legend group, that shows one."""
    names, groups = [], set()
    for trace in figure.get("data", []):
        if trace.get("showlegend") is False:
            continue
        group = trace.get("legendgroup")
        if group is not None:
            if group in groups:
                continue
            groups.add(group)
        names.append(str(trace.get("name", "")))
    return names


def legend_rows(names: list[str]) -> int:
    """How many rows the horizontal legend takes in the narrowest plot (sized by its
    longest name, so it errs on the tall side)."""
    if not names:
        return 0
    widest = ENTRY_SYMBOL_PX + CHAR_PX * max(len(n) for n in names)
    per_row = max(1, int(PLOT_WIDTH_PX // widest))
    return math.ceil(len(names) / per_row)


def slanted_labels_px(figure: dict[str, Any]) -> int:
    """The extra height the x axis' category labels (point names) need, slanted, when
    they are too long to stand side by side; 0 for a numeric axis or short labels."""
    categories = {x for trace in figure.get("data", []) for x in trace.get("x", [])
                  if isinstance(x, str)}
    if not categories:
        return 0
    widest = CHAR_PX * max(len(c) for c in categories)
    if len(categories) * (widest + 10) <= PLOT_WIDTH_PX:
        return 0
    return math.ceil(widest * math.sin(math.radians(TICK_ANGLE)))


def readable_legend(figure: dict[str, Any]) -> dict[str, Any]:
    """``figure`` with its legend under the plot, sized to show every entry, room for its
    slanted category labels, and distinct colours past Plotly's ten. A figure that places
    its own legend or sets its height is left as it is (a legend title of its own is
    kept); one with a single entry needs no legend."""
    layout = figure.setdefault("layout", {})
    names = legend_entries(figure)
    own = layout.get("legend", {})
    if "height" in layout or {"x", "y", "orientation"} & own.keys():
        return figure
    labels_px = slanted_labels_px(figure)
    legend_px = 0
    if len(names) >= 2:
        title_lines = own.get("title", {}).get("text", "").count("<br>") + 1 if own else 0
        legend_px = (legend_rows(names) + title_lines) * ENTRY_ROW_PX + 10
        # In container coordinates the legend's place does not depend on the figure's
        # height; the bottom margin keeps the axis labels between the plot area and the
        # legend. No gap between legend groups: a row is a row, group or not.
        layout["legend"] = {"orientation": "h", "x": 0, "xanchor": "left",
                            "yref": "container", "y": 0, "yanchor": "bottom",
                            "tracegroupgap": 0, **own}
    elif not labels_px:
        return figure
    if labels_px:
        layout["xaxis"] = {"tickangle": TICK_ANGLE, **layout.get("xaxis", {})}
    bottom = AXIS_PX + labels_px + legend_px
    # slanted labels reach right of their bars: Plotly's own 80 px there, else 30 px
    layout["margin"] = {"t": TOP_PX, "l": 80, "r": 80 if labels_px else 30, "b": bottom}
    layout["height"] = TOP_PX + PLOT_AREA_PX + bottom
    traces = figure.get("data", [])
    if len(traces) > PLOTLY_DEFAULT_COLOURS:
        layout.setdefault("colorway", list(PALETTE))
        for index, trace in enumerate(traces):
            line = trace.get("line", {})
            if index >= len(PALETTE) and trace.get("type") == "scatter" and "dash" not in line:
                trace["line"] = {**line, "dash": DASHES[index // len(PALETTE) % len(DASHES)]}
    return figure


def series_style(index: int) -> dict[str, Any]:
    """The colour (and past 24, the marker) of series ``index`` of a plot whose series
    draw several traces each, so a series' traces share one look."""
    style: dict[str, Any] = {"color": PALETTE[index % len(PALETTE)], "symbol": "circle"}
    if index >= len(PALETTE):
        style["symbol"] = ("circle-open", "square-open", "diamond-open")[
            (index // len(PALETTE) - 1) % 3]
    return style
