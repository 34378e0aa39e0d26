"""Make the Spark JVM's class archive for this install (:mod:`mqttbed.analytics.class_archive`).

``python -m mqttbed.controller.class_archive`` (``make install`` runs it) starts a Spark
session whose JVM writes the classes it loaded to the archive when it exits, analyses the
warm-up campaign (:mod:`mqttbed.controller.analysis_warm_up`: every class an analysis
loads), and ends. It does nothing where the archive exists already; ``--force`` makes it
again. About a minute here, once per install: an archive left by an earlier install of
the same venv (or the listed one ``make demo`` made) is deleted once its successor is made.

``--from-list`` dumps the classes mqttbed's class list names instead (``make demo``, while
pip installs the rest: it needs only Java and pyspark, so this module imports the
analysis's modules only where it runs one); ``--write-list`` writes that list again, from
what a session and the warm-up analysis load (after a Spark upgrade).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from mqttbed.analytics import class_archive
from mqttbed.core.settings import Settings

log = logging.getLogger("mqttbed.analysis")


def make_archive(settings: Settings, force: bool = False) -> str:
    """Make the archive for ``settings``' driver memory; return what was done, in words.

    Must run in a process that has no Spark session yet (its JVM's options are set at
    its start) and ends the JVM it starts."""
    path = class_archive.archive_path(settings.spark_driver_memory)
    if path is None:
        return class_archive.NO_JAVA
    if path.is_file() and not force:
        return f"class archive present: {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # renamed once whole
    try:
        _run_warm_up(settings, class_archive.dump_options(partial))
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
    parser.add_argument("--from-list", action="store_true",
                        help="dump the classes of mqttbed's class list (half a minute of"
                             " a core, no session), where this install has no archive yet")
    parser.add_argument("--write-list", metavar="FILE", type=Path,
                        help="write the classes a session and the warm-up analysis load to"
                             " FILE (the class list mqttbed ships), and make no archive")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = Settings.load()
    if args.write_list is not None:
        print(write_class_list(settings, args.write_list))
    elif args.from_list:
        print(class_archive.dump_listed(settings.spark_driver_memory))
    else:
        print(make_archive(settings, force=args.force))
    return 0


def write_class_list(settings: Settings, to: Path) -> str:
    """Write the classes a session and the warm-up analysis load to ``to``, as the JVM
    lists them (``-XX:DumpLoadedClassList``) under a header naming the Spark and Java."""
    import pyspark

    partial = to.with_name(f"{to.name}.{os.getpid()}.tmp")
    try:
        _run_warm_up(settings, f"-XX:DumpLoadedClassList={partial}")
        listed = [line for line in partial.read_text().splitlines()
                  if line and not line.startswith("#")]
    finally:
        partial.unlink(missing_ok=True)
    java = class_archive.java_binary()
    to.write_text(
        f"# The classes a Spark {pyspark.__version__} session and mqttbed's warm-up analysis"
        f" load ({java.resolve() if java else 'java'}),\n"
        "# in load order: what `make demo` has Java archive (mqttbed.analytics.class_archive).\n"
        "# Written by `python -m mqttbed.controller.class_archive --write-list FILE`.\n"
        + "".join(f"{line}\n" for line in listed))
    return f"{len(listed)} classes listed in {to}"


def _run_warm_up(settings: Settings, java_options: str) -> None:
    """Start a session whose JVM has ``java_options`` (and no archive), analyse the warm-up
    campaign, and end the JVM: what the archive and the class list are made from."""
    from mqttbed.analytics.spark import end_spark, get_spark
    from mqttbed.controller.analysis_warm_up import warm_up_analysis

    conf = {**settings.spark_conf, "spark.driver.extraJavaOptions": java_options}
    started = settings.model_copy(update={"spark_class_archive": False, "spark_conf": conf,
                                          "spark_master": "local[*]"})
    warm_up_analysis(get_spark(started))
    end_spark(wait_s=120.0)   # the JVM writes what it was asked to as it exits


if __name__ == "__main__":
    sys.exit(main())
