"""The driver JVM's options mqttbed adds: the class archive and the JIT's quick tier."""

from __future__ import annotations

import pytest

from mqttbed.analytics import class_archive
from mqttbed.analytics.spark import QUICK_JIT, session_conf, spark_jvm_pid
from mqttbed.core.settings import Settings

KEY = "spark.driver.extraJavaOptions"


def test_the_quick_jit_goes_first_and_the_users_own_options_stay_after_it():
    own = {KEY: "-Dmine=1", "spark.sql.ansi.enabled": "true"}
    quick = session_conf(Settings(spark_quick_jit=True, spark_class_archive=False,
                                  spark_conf=own))
    assert quick == {KEY: f"{QUICK_JIT} -Dmine=1", "spark.sql.ansi.enabled": "true",
                     "spark.executor.extraJavaOptions": QUICK_JIT}
    assert session_conf(Settings(spark_quick_jit=False, spark_class_archive=False,
                                 spark_conf=own)) == own
    assert KEY not in session_conf(Settings(spark_quick_jit=False, spark_class_archive=False))


def test_the_archive_comes_before_the_quick_jit_where_one_was_made(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ENV_DIR, str(tmp_path))
    settings = Settings(spark_quick_jit=True, spark_class_archive=True)
    path = class_archive.archive_path(settings.spark_driver_memory)
    if path is None:
        pytest.skip("no java: no archive can be named")
    assert session_conf(settings)[KEY] == QUICK_JIT   # none made yet
    assert session_conf(settings)["spark.executor.extraJavaOptions"] == QUICK_JIT
    path.write_bytes(b"")
    options = session_conf(settings)[KEY]
    assert options == f"{class_archive.use_options(settings.spark_driver_memory)} {QUICK_JIT}"
    assert f"-XX:SharedArchiveFile={path}" in options


@pytest.mark.integration
def test_the_sessions_jvm_runs_with_the_option_the_settings_ask_for(spark):
    # tests/conftest.py turns the quick JIT on for every JVM the tests start
    assert Settings.load().spark_quick_jit
    with open(f"/proc/{spark_jvm_pid(spark)}/cmdline", "rb") as cmdline:
        arguments = cmdline.read().decode().split("\0")
    assert QUICK_JIT in arguments
