"""The driver JVM's options mqttbed adds: the class archive and the JIT's quick tier, which
`mqttbed run` takes for a small campaign where the setting is left unset."""

from __future__ import annotations

import pytest

from mqttbed.analytics import class_archive
from mqttbed.analytics.spark import QUICK_JIT, QUICK_JIT_MAX_EVENTS, session_conf, spark_jvm_pid
from mqttbed.campaigns.library import spec_path
from mqttbed.campaigns.spec import load_spec
from mqttbed.controller.analysis import settings_for_one_campaign
from mqttbed.controller.assignments import campaign_events_bound
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


def test_a_campaigns_events_are_bounded_by_its_publishes_and_their_copies():
    spec = load_spec(spec_path("quickstart"))
    w = spec.workload
    # every PUBLISH (the warm-up's among them) and one copy per subscriber, every run
    by_hand = spec.repetitions * sum(w.publishers * w.messages * (1 + subscribers)
                                     for subscribers in spec.sweep["workload.subscribers"])
    assert campaign_events_bound(spec) == by_hand
    # a search's probes are chosen as it runs: no bound before it
    assert campaign_events_bound(load_spec(spec_path("capacity-search"))) is None


def test_mqttbed_run_takes_the_quick_tier_for_a_small_campaign_and_not_for_a_big_one():
    unset = Settings(spark_quick_jit=None, spark_class_archive=False)
    small = load_spec(spec_path("quickstart"))
    assert campaign_events_bound(small) <= QUICK_JIT_MAX_EVENTS
    assert settings_for_one_campaign(unset, small).spark_quick_jit is True
    assert QUICK_JIT in session_conf(settings_for_one_campaign(unset, small))[KEY].split()
    big = small.model_copy(update={"workload": small.workload.model_copy(
        update={"messages": small.workload.messages * 100})})
    assert campaign_events_bound(big) > QUICK_JIT_MAX_EVENTS
    assert settings_for_one_campaign(unset, big).spark_quick_jit is False
    search = load_spec(spec_path("capacity-search"))
    assert settings_for_one_campaign(unset, search).spark_quick_jit is False
    # the user's own choice stands, either way
    for chosen in (True, False):
        asked = Settings(spark_quick_jit=chosen, spark_class_archive=False)
        assert settings_for_one_campaign(asked, small).spark_quick_jit is chosen
        assert settings_for_one_campaign(asked, big).spark_quick_jit is chosen
    # a served controller, or any JVM not started for one campaign, leaves it unset: off
    assert KEY not in session_conf(unset)
