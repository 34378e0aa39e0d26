"""``make bench``: run every benchmark, each in its own process, and tabulate the JSON line
each one ends with (bench, baseline, ratios, figures).

    .venv/bin/python bench/run_all.py [--only NAME ...] [--skip NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (script, what it holds to a target); in the order they run
BENCHES = [
    ("latency_floor.py", "P1: lean p50 <= 0.5x, p99 <= 0.7x paho + TCP_NODELAY"),
    ("arrival_spread.py", "P2: spread p50 <= 0.25x paho, one process"),
    ("publish_capacity.py", "P3: >= 2.5x a paho publish() loop; Mosquitto saturates first"),
    ("native_engine.py", "P3: native >= 10x a paho publish() loop, Mosquitto >= 90 %, "
                         "engine <= 50 %; P3b: <= 0.15x the lean client's instructions"),
    ("native_tls.py", "issue 40: native over TLS >= 5x a paho TLS publish() loop, Mosquitto "
                      ">= 90 %, engine <= 50 %; P3b over TLS beside plain"),
    ("drain_profile.py", "issue 27: the native drain's CPU per event (cProfile), edges as bytes"),
    ("scale.py", "P4: 1,000 + 1,000 clients, no loss, no process left"),
    ("chunk_upload.py", "an agent's chunk upload: same bytes, less CPU than json.dumps"),
    ("quickstart.py", "P6: POST -> report <= 60 s"),
    ("spark_start.py", "issue 42: a session + first analysis on less CPU with the class archive"),
    ("api_load.py", "50 API clients, 60 s, 1,000-client run: 0 errors, 0 lost"),
    ("analysis.py", "Spark vs DuckDB, same figures"),
    ("analysis_growth.py", "issue 24: 10 M -> 100 M rows, time <= 12x, 2 GB driver (~1 h)"),
    ("hdr_export.py", "HdrHistogram logs: export <= 1x the analysis, figures within 0.1 %"),
    ("compaction.py", "compacted runs: Spark scan <= chunk files' scan; s per run"),
    ("cpu_budget.py", "broker.cpu_limit: Mosquitto throttled, then behind, as the budget shrinks"),
    ("capacity_rerun.py", "issue 25: a search's found rate passes by hand, 1.2x it fails"),
]


def last_json(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        if line.startswith("{") and '"bench"' in line:
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="script names to run")
    parser.add_argument("--skip", nargs="*", default=[], help="script names to leave out")
    args = parser.parse_args()
    rows = []
    for script, target in BENCHES:
        name = script.removesuffix(".py")
        if (args.only is not None and name not in args.only) or name in args.skip:
            continue
        print(f"== {script}: {target}", flush=True)
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(HERE / script)], capture_output=True,
                              text=True)
        sys.stdout.write(done.stdout)
        sys.stdout.flush()
        if done.returncode:
            sys.stdout.write(done.stderr[-2000:])
        rows.append((script, target, last_json(done.stdout), done.returncode,
                     time.monotonic() - started))
    print("\n| bench | target | ratios | load avg | exit | wall s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for script, target, result, code, wall in rows:
        if result is None:
            print(f"| {script} | {target} | (no JSON line) | | {code} | {wall:.0f} |")
            continue
        ratios = ", ".join(f"{k} x{v:.2f}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in result["ratios"].items()) or "-"
        load = result["figures"].get("load_average", "")
        print(f"| {result['bench']} | {target} | {ratios} | {load} | {code} | {wall:.0f} |")
    return max((code for *_, code, _ in rows), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
