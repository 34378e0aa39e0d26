"""The comparison page: two campaigns side by side per matching sweep point.

Served at ``/compare?ids=ID1,ID2`` and written by ``mqttbed compare ID1 ID2 --out F``.
"""

from __future__ import annotations

from mqttbed.analytics.compare import Comparison, compare_results
from mqttbed.analytics.results_files import StaleResults
from mqttbed.api.report import templates
from mqttbed.controller.analysis import load_results
from mqttbed.controller.storage import DataLayout
from mqttbed.core.names import UnsafeName


class NotComparable(LookupError):
    """A campaign to compare is unknown or has no results yet."""


def comparison_of(layout: DataLayout, first_id: str, second_id: str) -> Comparison:
    """Compare the stored results of two campaigns; NotComparable names what is missing."""
    results = []
    for campaign_id in (first_id, second_id):
        try:
            found = load_results(layout, campaign_id)
        except (UnsafeName, StaleResults) as exc:
            raise NotComparable(str(exc)) from None
        if found is None:
            raise NotComparable(f"campaign {campaign_id!r} has no results in "
                                f"{layout.root} (unknown, or not analysed yet)")
        results.append(found)
    return compare_results(*results)


def render_comparison(comparison: Comparison, *, standalone: bool) -> str:
    """The comparison as an HTML page (nothing loaded from elsewhere)."""
    return templates().get_template("compare.html").render(c=comparison, standalone=standalone)
