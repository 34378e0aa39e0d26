"""A class-data-sharing archive of the Spark JVM's classes: a cheaper start for every session.

A Spark session's JVM loads, verifies and links some 10,000 classes before the first
analysis is done, and every ``mqttbed`` command, controller and test worker starts one.
Java's class data sharing (JEP 350, dynamic archives) keeps those classes parsed and
verified in a file the JVM maps at start. Measured here (2026-11-29, a loaded 2-core
machine, load 7-10): a session and a small query, 26.0-28.0 s of the JVM's CPU without it,
15.1 s with it; a session and the warm-up campaign's analysis (``bench/spark_start.py``,
medians of two trials each), 64.4 s without, 54.2 s with (0.84x), the session up in 20.1
and 15.1 s.

The archive is made once per install (:mod:`mqttbed.controller.class_archive`, which
``make install`` runs) by a JVM that starts a session, analyses the warm-up campaign and
exits. It belongs to one Java runtime, one set of Spark jars where they are (the JVM
checks its classpath: a copy in another venv does not match, nor the same venv installed
again, whose jars have new modification times) and one heap size (the heap decides how
the JVM compresses its pointers), so its file name carries a digest of those: another
JVM, Spark or venv, a venv made again, or another ``spark_driver_memory`` finds no
archive and starts as before, until ``make install`` makes its own. An unusable archive
is never fatal either: ``-Xshare:auto`` falls back to loading the classes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

ENV_DIR = "MQTTBED_CLASS_ARCHIVE_DIR"   # where archives are kept (default: the user's cache)
# the JVM's archive messages off: a stale archive is a fallback to loading, not a warning
# on every command
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_dir() -> Path:
    """Where archives are kept: ``$MQTTBED_CLASS_ARCHIVE_DIR``, else
    ``$XDG_CACHE_HOME/mqttbed/spark-classes`` (``~/.cache`` by default)."""
    if chosen := os.environ.get(ENV_DIR):
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "mqttbed" / "spark-classes"


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    if home := os.environ.get("JAVA_HOME"):
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    return Path(found) if found is not None else None


def archive_path(driver_memory: str) -> Path | None:
    """The archive for this Java, these Spark jars and this heap (None: no Java found).

    Its name is ``spark-<version>-<place>-<content>.jsa``: the place is where the jars are
    (and the Java and heap), the content what the JVM validates at start. A venv made
    again at the same path keeps the place and changes the content, so its new archive
    replaces the old one (:func:`stale_archives`)."""
    java = java_binary()
    if java is None or not java.exists():
        return None
    import pyspark

    java = java.resolve()
    stat = java.stat()
    jars_dir = (Path(pyspark.__file__).parent / "jars").resolve()
    place = hashlib.sha256("\n".join(
        [str(java), str(jars_dir), pyspark.__version__, driver_memory]).encode()).hexdigest()
    # The JVM checks the classpath it was made with: each jar by its path (another venv's
    # copy of the same jars is another classpath), size and modification time (the same
    # venv installed again has new times, and the JVM silently ignores the old archive).
    jars = sorted(f"{p.resolve()}:{s.st_size}:{s.st_mtime_ns}"
                  for p in jars_dir.glob("*.jar") for s in [p.stat()])
    content = hashlib.sha256("\n".join(
        [str(stat.st_size), str(stat.st_mtime_ns), *jars]).encode()).hexdigest()
    return archive_dir() / f"spark-{pyspark.__version__}-{place[:8]}-{content[:12]}.jsa"


def stale_archives(path: Path) -> list[Path]:
    """The other archives made for ``path``'s place: the same Java, jars' directory and
    heap, whose jars have since been installed again (the JVM would not map them)."""
    version, place, _content = path.stem.rsplit("-", 2)
    return sorted(p for p in path.parent.glob(f"{version}-{place}-*.jsa") if p != path)


def use_options(driver_memory: str) -> str | None:
    """The JVM options that map this install's archive, or None where none was made."""
    path = archive_path(driver_memory)
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET}"


def dump_options(to: Path) -> str:
    """The JVM options that write the archive of what the JVM loaded, at its exit."""
    return f"-XX:ArchiveClassesAtExit={to} {QUIET}"
