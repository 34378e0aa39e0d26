"""API under load: 50 concurrent API clients for 60 s while a campaign with 1,000 clients
runs and uploads its events (issue 14, "Load").

``mqttbed serve`` on loopback; a campaign of 500 publishers and 500 subscribers
(per-publisher topics, 2 Hz each, ~65 s) is submitted over REST; while it runs, 50
threads each loop over GET campaigns, GET the campaign, GET agents and GET health for
60 s. Reported: requests, errors (exceptions and non-2xx), p50/p99/max response time;
then, once the runs have ended, lost events: rows stored against what the agents said
they published and received. Targets: 0 errors, 0 lost events.

    .venv/bin/python bench/api_load.py [--clients 50] [--seconds 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, free_port, load_average, served_controller  # noqa: E402

SPEC = {"name": "api-load",
        "workload": {"publishers": 500, "subscribers": 500, "topics": "per-publisher",
                     "topic": "load/t", "rate_hz": 2, "messages": 130, "warmup_messages": 0},
        "agents": {"count": 2}, "timing": {"setup_timeout_s": 300}}


def hammer(url: str, token: str, campaign_id: str, until: float,
           times: list[float], errors: list[str]) -> None:
    paths = ["/api/v1/campaigns", f"/api/v1/campaigns/{campaign_id}", "/api/v1/agents",
             "/api/v1/health"]
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                      timeout=30) as http:
        n = 0
        while time.monotonic() < until:
            path = paths[n % len(paths)]
            n += 1
            started = time.monotonic()
            try:
                status = http.get(path).status_code
            except httpx.HTTPError as exc:
                errors.append(f"{path}: {type(exc).__name__}: {exc}")
                continue
            times.append(time.monotonic() - started)
            if status >= 300:
                errors.append(f"{path}: HTTP {status}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    load = load_average()
    times: list[float] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, \
            served_controller(Path(tmp), free_port()) as (url, token, _proc):
        http = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                            timeout=60)
        created = http.post("/api/v1/campaigns", content=yaml.safe_dump(SPEC),
                            headers={"content-type": "application/yaml"})
        created.raise_for_status()
        campaign_id = created.json()["id"]
        http.post(f"/api/v1/campaigns/{campaign_id}/start").raise_for_status()
        while http.get(f"/api/v1/campaigns/{campaign_id}").json()["runs"][0]["state"] \
                not in ("running", "collecting", "done", "failed"):
            time.sleep(0.2)   # the load starts once the run does: connected, subscribed
        until = time.monotonic() + args.seconds
        threads = [threading.Thread(target=hammer, args=(url, token, campaign_id, until,
                                                         times, errors))
                   for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        load_during = load_average()
        while (campaign := http.get(f"/api/v1/campaigns/{campaign_id}").json())["runs"][0][
                "state"] not in ("done", "failed", "interrupted"):
            time.sleep(0.5)
        run = campaign["runs"][0]
        import pyarrow.compute as pc
        import pyarrow.dataset as ds
        table = ds.dataset(Path(tmp) / "events", partitioning="hive").to_table(
            columns=["kind"])
        stored = {kind: int(pc.sum(pc.equal(table["kind"], kind)).as_py() or 0)
                  for kind in ("publish", "delivery")}
        expected = SPEC["workload"]["publishers"] * SPEC["workload"]["messages"]
    lat = np.array(times) * 1e3
    figures = {
        "api_clients": args.clients, "seconds": args.seconds, "requests": len(times),
        "requests_per_s": round(len(times) / args.seconds, 1), "errors": len(errors),
        "first_errors": errors[:5],
        "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 1) if len(lat) else None,
        "max_ms": round(float(lat.max()), 1) if len(lat) else None,
        "run_state": run["state"], "run_reason": run["reason"],
        "events_stored": stored, "events_expected": {"publish": expected,
                                                     "delivery": expected},
        "lost_events": 2 * expected - stored["publish"] - stored["delivery"],
        "load_average_before": load, "load_average_during": load_during,
    }
    print(f"{args.clients} API clients for {args.seconds:g} s during a 1,000-client run:")
    for key, value in figures.items():
        print(f"  {key:22} {value}")
    emit("API under load", None, {}, figures)
    return 0 if not errors and figures["lost_events"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
