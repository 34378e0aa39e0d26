"""P6, quickstart turnaround: POST the quickstart campaign to a served controller, until
its report page is served; and where the time goes.

``mqttbed serve`` on loopback (fresh data dir, Spark as configured), then over REST:
POST campaigns/quickstart.yaml, start it, poll its status every 0.2 s, and GET its web
report once it is done. Phases from the polls and the runs' own start/end times:
queued (until the first run starts), the runs' holds for the analysis (their run records'
``analysis_start_wait_s``: the first run's while Spark starts and warms up, each later
run's while the run before is analysed, ``analysis_per_run``), runs (sum of run
durations less those holds),
between runs (deploy, agents, barriers and teardown not inside a run's recorded span),
analysis (Spark: from the last run's end to ``done``), report.
Target: <= 60 s.

    .venv/bin/python bench/quickstart.py [--spec campaigns/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, emit, free_port, load_average, served_controller  # noqa: E402


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def analysis_start_wait_s(data_dir: Path, campaign_id: str) -> float:
    """Seconds the campaign's runs held their measurement for the analysis (the run
    records' ``analysis_start_wait_s``), read from the controller's SQLite database."""
    import json
    import sqlite3

    with sqlite3.connect(data_dir / "mqttbed.sqlite") as db:
        rows = db.execute("SELECT run_metadata FROM runs WHERE campaign_id = ?",
                          (campaign_id,)).fetchall()
    return sum(json.loads(metadata or "{}").get("analysis_start_wait_s") or 0.0
               for (metadata,) in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "campaigns" / "quickstart.yaml"))
    args = parser.parse_args()
    body = Path(args.spec).read_bytes()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp, \
            served_controller(Path(tmp), free_port()) as (url, token, _proc):
        http = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                            timeout=60)
        t0 = time.monotonic()
        created = http.post("/api/v1/campaigns", content=body,
                            headers={"content-type": "application/yaml"})
        created.raise_for_status()
        campaign_id = created.json()["id"]
        http.post(f"/api/v1/campaigns/{campaign_id}/start").raise_for_status()
        seen: dict[str, float] = {}
        while True:
            campaign = http.get(f"/api/v1/campaigns/{campaign_id}").json()
            seen.setdefault(campaign["status"], time.monotonic() - t0)
            if campaign["status"] in ("done", "failed", "cancelled"):
                break
            if time.monotonic() - t0 > 1800:
                raise SystemExit("quickstart did not finish within 30 minutes")
            time.sleep(0.2)
        done_s = time.monotonic() - t0
        page = http.get(f"/campaigns/{campaign_id}", cookies={"mqttbed_token": token})
        report_s = time.monotonic() - t0
        held_s = analysis_start_wait_s(Path(tmp), campaign_id)
    runs = campaign["runs"]
    run_s = [seconds(r["started_at"], r["ended_at"]) for r in runs
             if r["started_at"] and r["ended_at"]]
    analysing_at = seen.get("analysing", done_s)
    running_at = seen.get("running", 0.0)
    figures = {
        "status": campaign["status"], "reason": campaign["reason"],
        "run_reasons": sorted({r["reason"] for r in runs if r["reason"]}),
        "runs": len(runs), "report_http": page.status_code,
        "turnaround_s": round(report_s, 1),
        "phases_s": {
            "until running": round(running_at, 1),
            "runs held for the analysis (Spark's start, earlier runs)": round(held_s, 1),
            "runs (sum of run spans, less those holds)": round(sum(run_s) - held_s, 1),
            "around runs (deploy, agents, barriers, teardown)":
                round(analysing_at - running_at - sum(run_s), 1),
            "analysis (Spark)": round(done_s - analysing_at, 1),
            "report page": round(report_s - done_s, 1)},
        "run_s_mean": round(sum(run_s) / max(len(run_s), 1), 2),
        "load_average_before": load, "target_s": 60,
    }
    print(f"quickstart ({len(runs)} runs): {figures['turnaround_s']} s POST -> report "
          f"(target 60 s), status {campaign['status']} {campaign['reason'] or ''}, "
          f"report HTTP {page.status_code}")
    for phase, value in figures["phases_s"].items():
        print(f"  {phase:50} {value:7.1f} s")
    # issue 24: results ready within 10 s of the last run's end
    emit("P6 quickstart turnaround", None,
         {"turnaround_vs_target": report_s / 60,
          "results_after_last_run_vs_10s": (done_s - analysing_at) / 10}, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
