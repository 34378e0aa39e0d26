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

``make demo`` cannot wait for that minute: a newcomer's machine has no archive, and its
quickstart's JVM paid ~20 s more for it (issue 42). So mqttbed ships the list of classes
such a JVM loads (:data:`CLASS_LIST`, written by ``python -m
mqttbed.controller.class_archive --write-list``), and ``make demo`` has Java dump them into
a static archive (``-Xshare:dump``, :func:`dump_listed`) while pip installs the rest of
its packages: the same load and verification, but overlapping pip's downloads instead of
the quickstart. A listed archive stands in until ``make install`` makes the dynamic one,
which replaces it. Classes of another Spark that the list does not name are loaded as
before; names it has that this Spark lacks are skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ENV_DIR = "MQTTBED_CLASS_ARCHIVE_DIR"   # where archives are kept (default: the user's cache)
# the JVM's archive messages off: a stale archive is a fallback to loading, not a warning
# on every command
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# the classes a session and the warm-up analysis load, in the order the JVM loaded them
CLASS_LIST = Path(__file__).with_name("spark-classes.txt")
NO_JAVA = "no Java found: no class archive made (Spark needs Java 17)"
LAUNCHER_TIMEOUT_S = 60.0
DUMP_TIMEOUT_S = 600.0


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


def listed_path(archive: Path) -> Path:
    """Where the archive dumped from :data:`CLASS_LIST` is kept, beside ``archive`` (the
    dynamic one, for the same Java, jars and heap): one of the same place, so the dynamic
    archive's :func:`stale_archives` includes it."""
    return archive.with_name(f"{archive.stem}.listed.jsa")


def made_archive(driver_memory: str) -> Path | None:
    """This install's archive: the dynamic one, else the one dumped from the class list,
    else None."""
    path = archive_path(driver_memory)
    return _made_at(path) if path is not None else None


def _made_at(path: Path) -> Path | None:
    """The archive made for ``path``'s Java, jars and heap: ``path`` (the dynamic one),
    else its listed one, else None."""
    return next((p for p in (path, listed_path(path)) if p.is_file()), None)


def use_options(driver_memory: str) -> str | None:
    """The JVM options that map this install's archive, or None where none was made."""
    path = made_archive(driver_memory)
    if path is None:
        return None
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET}"


def dump_options(to: Path) -> str:
    """The JVM options that write the archive of what the JVM loaded, at its exit."""
    return f"-XX:ArchiveClassesAtExit={to} {QUIET}"


def driver_command(driver_memory: str) -> list[str]:
    """The java command and JVM options Spark's own launcher gives a PySpark driver with
    this heap, without its main class and arguments.

    A static archive is mapped only by a JVM whose class path begins with the one it was
    dumped with, entry by entry; Spark's launcher writes that path (its conf directory,
    one jar before the rest, a wildcard the java launcher expands in directory order), so
    the dump asks the launcher rather than writing it again here."""
    import pyspark

    java = java_binary()
    if java is None or not java.exists():
        raise FileNotFoundError("no java found (Spark needs Java 17): set JAVA_HOME")
    home = Path(pyspark.__file__).parent.resolve()
    main = "org.apache.spark.deploy.SparkSubmit"
    # what bin/spark-class does before it runs the command the launcher prints
    script = ('. "$SPARK_HOME/bin/load-spark-env.sh" && exec "$0" -Xmx128m'
              ' -cp "$SPARK_HOME/jars/*" org.apache.spark.launcher.Main "$@"')
    built = subprocess.run(
        ["bash", "-c", script, str(java), main, "--conf", f"spark.driver.memory={driver_memory}",
         "pyspark-shell"], env={**os.environ, "SPARK_HOME": str(home)}, capture_output=True,
        timeout=LAUNCHER_TIMEOUT_S, check=False)
    # the launcher prints a line of one NUL (spark-class's marker), then the command's
    # words, each followed by a NUL
    _lines, _marker, command = built.stdout.partition(b"\0\n")
    words = [w.decode() for w in command.split(b"\0") if w]
    if built.returncode != 0 or main not in words:
        raise RuntimeError(f"Spark's launcher gave no driver command (exit {built.returncode}):"
                           f" {built.stderr.decode(errors='replace').strip()[-400:]}")
    return words[:words.index(main)]


def dump_listed(driver_memory: str, classes: Path = CLASS_LIST) -> str:
    """Dump the classes ``classes`` names into this install's listed archive, where it has
    no archive yet; return what was done, in words. Half a minute of a core here."""
    path = archive_path(driver_memory)
    if path is None:
        return NO_JAVA
    if (made := _made_at(path)) is not None:
        return f"class archive present: {made}"
    target = listed_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")   # renamed once whole
    try:
        # an archive is a cheaper start, never a condition of one: what fails here is
        # said, and the JVM starts as before
        try:
            dumped = subprocess.run(
                [*driver_command(driver_memory), "-Xshare:dump",
                 f"-XX:SharedClassListFile={classes}", f"-XX:SharedArchiveFile={partial}",
                 *QUIET.split()],
                capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, check=False)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
            return f"no class archive made ({e}): the JVM starts as before"
        if dumped.returncode != 0 or not partial.is_file():
            return (f"the JVM dumped no class archive (exit {dumped.returncode}): its start"
                    f" stays as it was: {dumped.stderr.strip()[-400:]}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    size = target.stat().st_size / 2**20
    return f"class archive made from {classes.name}: {target} ({size:.0f} MiB)"
