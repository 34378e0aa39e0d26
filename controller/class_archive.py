"""Make the Spark JVM's class archive for this install (:mod:`mqttbed.analytics.class_archive`).

``python -m mqttbed.controller.class_archive`` (``make install`` runs it) starts a Spark
session whose JVM writes the classes it loaded to the archive when it exits, analyses the
warm-up campaign (:mod:`mqttbed.controller.analysis_warm_up`: every class an analysis
loads), and ends. It does nothing where the archive exists already; ``--force`` makes it
again. About a minute here, once per install: an archive left by an earlier install of
the same venv is deleted once its successor is made.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from mqttbed.analytics import class_archive
from mqttbed.analytics.spark import end_spark, get_spark
from mqttbed.controller.analysis_warm_up import warm_up_analysis
from mqttbed.core.settings import Settings

log = logging.getLogger("mqttbed.analysis")


def make_archive(settings: Settings, force: bool = False) -> str:
    """Make the archive for ``settings``' driver memory; return what was done, in words.

    Must run in a process that has no Spark session yet (its JVM's options are set at
    its start) and ends the JVM it starts."""
    path = class_archive.archive_path(settings.spark_driver_memory)
    if path is None:
        return "no Java found: no class archive made (Spark needs Java 17)"
    if path.is_file() and not force:
        return f"class archive present: {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # renamed once whole
    key = "spark.driver.extraJavaOptions"
    conf = {**settings.spark_conf, key: class_archive.dump_options(partial)}
    dumping = settings.model_copy(update={"spark_class_archive": False, "spark_conf": conf,
                                          "spark_master": "local[*]"})
    try:
        warm_up_analysis(get_spark(dumping))
        end_spark(wait_s=120.0)   # the JVM writes the archive as it exits
        if not partial.is_file():
            return f"the JVM wrote no class archive to {partial}: its start stays as it was"
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    for stale in class_archive.stale_archives(path):   # ~180 MiB each, never mapped again
        stale.unlink(missing_ok=True)
    return f"class archive made: {path} ({path.stat().st_size / 2**20:.0f} MiB)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqttbed.controller.class_archive",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="make it again")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(make_archive(Settings.load(), force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
