"""A campaign from its start to its final status: its runs, then its statistics.

``running -> analysing -> done | failed | cancelled``. Spark starts in the background as
the runs begin (niced, :func:`mqttbed.analytics.spark.start_spark_in_background`), and a
served controller keeps that one session for its life. What the runs came to (all done,
some failed, cancelled) becomes the campaign's status only after Spark has written
``stats.json``, so a client that sees ``done`` can fetch the statistics at once. Failed
and cancelled campaigns are analysed too: their partial results are kept. An analysis
that raises fails the campaign, keeps every event, and leaves no statistics behind.
"""

from __future__ import annotations

import logging

from mqttbed.analytics.spark import start_spark_in_background
from mqttbed.controller.analysis import ANALYSIS_FAILED, analyze_campaign
from mqttbed.controller.documents import ResultsReady
from mqttbed.controller.engine import RunEngine
from mqttbed.controller.states import CampaignStatus
from mqttbed.controller.storage import DataLayout
from mqttbed.core.settings import Settings

log = logging.getLogger("mqttbed.lifecycle")

# A Spark failure's message carries the whole JVM stack trace; the log keeps it all.
REASON_MAX_CHARS = 1000


def conduct_campaign(engine: RunEngine, layout: DataLayout, campaign_id: str,
                     settings: Settings | None = None) -> CampaignStatus:
    """Run the campaign's runs, then analyse them; return its final status.

    Documents on the way (``engine.ctx.documents``): a RunUpdate per run transition, a
    CampaignUpdate per status (running, analysing, the final one), and ResultsReady
    between the analysis and the final status when it succeeded.
    """
    if engine.is_cancelled(campaign_id):
        return CampaignStatus.CANCELLED  # cancelled while queued: nothing ran
    # The JVM starts (niced) while the first run measures, not after the last one.
    start_spark_in_background(settings)
    engine.run_campaign(campaign_id)
    if engine.stopping is not None:
        # The controller is stopping: the campaign stays running, for the next controller
        # on the data dir to requeue (RunEngine.recover) and finish.
        return CampaignStatus.RUNNING
    outcome, reason = engine.outcome(campaign_id)
    engine.set_campaign_status(campaign_id, CampaignStatus.ANALYSING, reason)
    try:
        stats, json_path, parquet_path = analyze_campaign(engine.ctx.sessions, layout,
                                                          campaign_id, settings)
    except Exception as exc:  # noqa: BLE001 - the campaign fails with the reason, events stay
        log.exception("analysis of campaign %s failed", campaign_id)
        discard_statistics(layout, campaign_id)
        failure = analysis_failure(exc)
        engine.set_campaign_status(campaign_id, CampaignStatus.FAILED,
                                   f"{failure}; {reason}" if reason else failure)
        return CampaignStatus.FAILED
    engine.ctx.documents.emit(ResultsReady(campaign_id, json_path, parquet_path, stats))
    engine.set_campaign_status(campaign_id, outcome, reason)
    return outcome


def analysis_failure(exc: Exception) -> str:
    """The reason a failed analysis gives: ``analysis failed: <type>: <message>``."""
    message = str(exc).strip()
    if len(message) > REASON_MAX_CHARS:
        message = message[:REASON_MAX_CHARS] + " ... (cut; the controller's log has it all)"
    return f"{ANALYSIS_FAILED}: {type(exc).__name__}: {message}"


def discard_statistics(layout: DataLayout, campaign_id: str) -> None:
    """Remove what an analysis that failed half-way wrote: no stats means none."""
    for name in ("stats.json", "stats.parquet"):
        (layout.campaign_dir(campaign_id) / name).unlink(missing_ok=True)
