"""Analysis of a small campaign already measured: Spark's start-up apart from its work.

In one process: start the Spark session (timed), then re-analyse the campaign
``--repeat`` times exactly as ``mqttbed analyze`` does (``analyze_campaign``), each call
timed with its Spark jobs, stages and tasks and the load average. ``--save DOC`` writes
the last call's document (``generated_at`` left out) so that two versions of the code
can be held against each other on the same data.

    .venv/bin/mqttbed run campaigns/quickstart.yaml --data-dir /tmp/sf-data
    .venv/bin/python bench/analyze_small.py --data-dir /tmp/sf-data [latest|ID]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average  # noqa: E402


def jvm_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the Spark JVM has used so far: on a shared machine a
    steadier figure of the work done than the wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    from mqttbed.analytics.spark import get_spark, stop_spark
    from mqttbed.controller.analysis import analyze_campaign
    from mqttbed.controller.cli import _campaign_id
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("id", nargs="?", default="latest")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3, help="warm calls after the first")
    parser.add_argument("--save", type=Path, help="write the last document here (JSON)")
    args = parser.parse_args()

    settings = Settings.from_env(args.data_dir, None)
    controller = create_controller(settings, controller_url="")
    calls = []
    try:
        campaign_id = _campaign_id(controller, args.id, "analyze")
        load = load_average()
        start = time.perf_counter()
        spark = get_spark(settings)
        startup_s = time.perf_counter() - start
        print(f"spark start-up {startup_s:.1f} s (load {load})", flush=True)
        context = spark.sparkContext
        tracker = context.statusTracker()
        jvm_pid = int(context._jvm.java.lang.ProcessHandle.current().pid())
        for call in range(1 + args.repeat):
            group = f"analyze-{call}"
            context.setJobGroup(group, "bench/analyze_small.py")
            load = load_average()
            start, jvm_start, py_start = (time.perf_counter(), jvm_cpu_s(jvm_pid),
                                          time.process_time())
            stats, _, _ = analyze_campaign(controller.sessions, controller.layout,
                                           campaign_id, settings)
            seconds = time.perf_counter() - start
            jvm_s, py_s = jvm_cpu_s(jvm_pid) - jvm_start, time.process_time() - py_start
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
            tasks = sum(stage.numTasks for stage in stages if stage)
            calls.append({"s": round(seconds, 2), "jobs": len(jobs), "stages": len(stages),
                          "tasks": tasks, "load": load, "jvm_cpu_s": round(jvm_s, 2),
                          "python_cpu_s": round(py_s, 2)})
            print(f"{'cold' if call == 0 else 'warm'} call {call}: {seconds:.1f} s, "
                  f"{len(jobs)} jobs, {len(stages)} stages, {tasks} tasks (load {load}); "
                  f"CPU: JVM {jvm_s:.1f} s, Python {py_s:.1f} s", flush=True)
        if args.save:
            document = stats.model_dump(mode="json")
            document.pop("generated_at", None)
            args.save.write_text(json.dumps(document, indent=1, sort_keys=True))
    finally:
        controller.close()
        stop_spark()
    warm = [c["s"] for c in calls[1:]] or [calls[0]["s"]]
    emit("analyze_small", None, {}, {
        "campaign": campaign_id, "spark_startup_s": round(startup_s, 2),
        "cold_s": calls[0]["s"], "warm_median_s": round(statistics.median(warm), 2),
        "jobs": calls[-1]["jobs"], "stages": calls[-1]["stages"], "tasks": calls[-1]["tasks"],
        "warm_jvm_cpu_s": statistics.median(c["jvm_cpu_s"] for c in calls[1:] or calls)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
