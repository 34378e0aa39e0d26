"""The Spark JVM's class archive (mqttbed.analytics.class_archive): found by what it was
made for, mapped by the session's JVM, and harmless when stale."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqttbed.analytics import class_archive
from mqttbed.analytics.spark import spark_jvm_pid
from mqttbed.core.settings import Settings


def test_an_archive_is_used_only_for_the_java_spark_and_heap_it_was_made_for(
        tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ENV_DIR, str(tmp_path))
    two = class_archive.archive_path("2g")
    assert two is not None and two.parent == tmp_path
    assert class_archive.archive_path("40g") != two   # another heap, other pointers
    assert class_archive.use_options("2g") is None    # not made yet: Spark starts as before
    two.write_bytes(b"made")
    options = class_archive.use_options("2g")
    assert options is not None and f"-XX:SharedArchiveFile={two}" in options.split()
    assert class_archive.use_options("40g") is None
    # the same Spark in another venv: another classpath, another archive
    import pyspark

    elsewhere = tmp_path / "venv" / "pyspark"
    (elsewhere / "jars").mkdir(parents=True)
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):
        (elsewhere / "jars" / jar.name).write_bytes(b"")
    monkeypatch.setattr(pyspark, "__file__", str(elsewhere / "__init__.py"))
    there = class_archive.archive_path("2g")
    assert there not in (None, two)
    assert there is not None
    # the same venv installed again: the jars' times change and the JVM would not map the
    # archive made before (what CI's fresh venv at the same path met), so another name
    # for the same place, and the earlier one is stale
    there.write_bytes(b"made")
    jar = next((elsewhere / "jars").glob("*.jar"))
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    again = class_archive.archive_path("2g")
    assert again is not None and again != there
    assert again.name.rsplit("-", 1)[0] == there.name.rsplit("-", 1)[0]   # the same place
    assert class_archive.stale_archives(again) == [there]
    assert class_archive.stale_archives(two) == []     # another venv's is not stale
    # another Java: another archive
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert class_archive.archive_path("2g") is None


def test_a_stale_or_broken_archive_is_a_silent_fallback(tmp_path, monkeypatch):
    broken = tmp_path / "broken.jsa"
    broken.write_bytes(b"not an archive" * 100)
    monkeypatch.setattr(class_archive, "archive_path", lambda memory: broken)
    options = class_archive.use_options("2g")
    assert options is not None
    java = class_archive.java_binary()
    assert java is not None
    started = subprocess.run([str(java), *options.split(), "-version"], capture_output=True,
                             text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    # the version, and nothing about the archive on the JVM's output
    assert "version" in started.stderr and "shared" not in started.stderr.lower()
    assert started.stdout == ""


@pytest.mark.integration
def test_the_session_maps_the_archive_make_install_made(spark):
    path = class_archive.archive_path(Settings.load().spark_driver_memory)
    if path is None or not path.is_file():
        pytest.skip(f"no class archive at {path}: `make install` makes it "
                    "(python -m mqttbed.controller.class_archive)")
    maps = open(f"/proc/{spark_jvm_pid(spark)}/maps").read()
    assert str(path) in maps


def test_the_listed_archive_stands_in_until_the_dynamic_one_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ENV_DIR, str(tmp_path))
    dynamic = class_archive.archive_path("2g")
    assert dynamic is not None
    listed = class_archive.listed_path(dynamic)
    assert listed.parent == tmp_path and listed != dynamic
    listed.write_bytes(b"dumped from the list")
    assert class_archive.made_archive("2g") == listed
    assert f"-XX:SharedArchiveFile={listed}" in (class_archive.use_options("2g") or "").split()
    # make demo does not dump again where an archive is made
    assert class_archive.dump_listed("2g") == f"class archive present: {listed}"
    dynamic.write_bytes(b"made by make install")
    assert class_archive.made_archive("2g") == dynamic
    # the dynamic archive's maker deletes the listed one: the same Java, jars and heap
    assert class_archive.stale_archives(dynamic) == [listed]


def test_a_dump_that_cannot_run_says_why_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ENV_DIR, str(tmp_path))

    def no_launcher(memory: str) -> list[str]:
        raise RuntimeError("Spark's launcher gave no driver command (exit 1): no jars")

    monkeypatch.setattr(class_archive, "driver_command", no_launcher)
    said = class_archive.dump_listed("2g")
    assert said.startswith("no class archive made (Spark's launcher gave no driver command")
    assert list(tmp_path.iterdir()) == [] and class_archive.use_options("2g") is None


@pytest.mark.integration
def test_a_session_maps_the_archive_dumped_from_the_class_list(tmp_path, monkeypatch):
    # a part of the shipped list, for time: the JDK's first classes and some of Spark's
    # (classes of the application class path are what make the JVM compare class paths:
    # an archive dumped with another class path than Spark's launcher gives is not mapped)
    names = [line for line in class_archive.CLASS_LIST.read_text().splitlines()
             if line and not line.startswith(("#", "@"))]
    spark_classes = [n for n in names if n.startswith("org/apache/spark/")]
    assert len(spark_classes) > 1000   # the list is of a Spark session, not of a bare JVM
    part = tmp_path / "classes.txt"
    part.write_text("".join(f"{n}\n" for n in [*names[:800], *spark_classes[:300]]))
    archives = tmp_path / "archives"
    monkeypatch.setenv(class_archive.ENV_DIR, str(archives))
    memory = Settings.load().spark_driver_memory
    said = class_archive.dump_listed(memory, part)
    assert said.startswith("class archive made from classes.txt"), said
    made = class_archive.made_archive(memory)
    assert made is not None and made.name.endswith(".listed.jsa")
    # a session started as mqttbed starts one (PySpark, spark-submit, Spark's launcher)
    started = subprocess.run(
        [sys.executable, "-c",
         "from mqttbed.analytics.spark import end_spark, get_spark, spark_jvm_pid\n"
         "from mqttbed.core.settings import Settings\n"
         "spark = get_spark(Settings.load())\n"
         "print(open(f'/proc/{spark_jvm_pid(spark)}/maps').read())\n"
         "end_spark(wait_s=60.0)\n"],
        capture_output=True, text=True, timeout=300, env={**os.environ})
    assert started.returncode == 0, started.stderr[-3000:]
    assert str(made) in started.stdout
