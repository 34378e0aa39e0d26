"""Spark's start with and without the class archive (mqttbed.analytics.class_archive).

Each trial is a fresh process, as a ``mqttbed`` command is: a Spark session, the warm-up
campaign's analysis (the first analysis of a JVM), the JVM ended. Trials alternate
without the archive (the baseline: ``MQTTBED_SPARK_CLASS_ARCHIVE=false``) and with it.
The stable figure is the CPU the process and its JVM used (user + system, from the
kernel's accounting of waited-for children); wall times are printed too, noisy on a
shared machine. The archive is made first if missing (not timed).

    .venv/bin/python bench/spark_start.py [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, emit, ratio  # noqa: E402

TRIAL = """
import time
from mqttbed.analytics.spark import end_spark, get_spark
from mqttbed.controller.analysis_warm_up import warm_up_analysis
began = time.perf_counter()
spark = get_spark()
up = time.perf_counter()
stats = warm_up_analysis(spark)
analysed = time.perf_counter()
end_spark()
print(f"{up - began:.3f} {analysed - up:.3f}")
"""


def trial(archive: bool) -> tuple[float, float, float]:
    """(CPU s of the process and its JVM, wall s to the session, wall s of the analysis)."""
    env = {**os.environ, "MQTTBED_SPARK_CLASS_ARCHIVE": "true" if archive else "false",
           "PYSPARK_PYTHON": sys.executable}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", TRIAL], env=env, cwd=ROOT, check=True,
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    up, analysed = (float(x) for x in done.stdout.split()[-2:])
    return cpu, up, analysed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "mqttbed.controller.class_archive"], cwd=ROOT,
                   check=True, capture_output=True)
    results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    began = time.perf_counter()
    for _ in range(args.trials):
        for archive in (False, True):
            results[archive].append(trial(archive))
            print(f"archive={archive} cpu={results[archive][-1][0]:.1f} s "
                  f"session={results[archive][-1][1]:.1f} s "
                  f"analysis={results[archive][-1][2]:.1f} s", flush=True)

    def median(archive: bool, i: int) -> float:
        return statistics.median(r[i] for r in results[archive])

    emit("spark_start", "no class archive",
         {"cpu": ratio(median(True, 0), median(False, 0)),
          "session_wall": ratio(median(True, 1), median(False, 1)),
          "analysis_wall": ratio(median(True, 2), median(False, 2))},
         {"trials": args.trials, "seconds": round(time.perf_counter() - began, 1),
          **{f"{'with' if a else 'without'}_{name}_s": round(median(a, i), 2)
             for a in (False, True)
             for i, name in enumerate(("cpu", "session_wall", "analysis_wall"))}})


if __name__ == "__main__":
    main()
