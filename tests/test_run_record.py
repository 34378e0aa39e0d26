"""A run's record: one typed document, written validated by the engine, read by everyone;
and the results file's schema version, read on load.

The real run's agents are threads of this process (``inproc_controller``): what the record
holds comes from the engine and the agent program's messages, the same over HTTP from a
thread as from a process (tests/test_inproc_agents.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from mqttbed.analytics.results import SCHEMA_VERSION, CampaignRef
from mqttbed.analytics.results_files import (
    UNVERSIONED,
    StaleResults,
    read_stats,
    read_stats_parquet,
    write_stats,
)
from mqttbed.brokers.mosquitto.backend import MosquittoDeployment
from mqttbed.campaigns.spec import CampaignSpec, Measurement, Workload, parse_spec
from mqttbed.controller.analysis import load_results, results_type, run_info
from mqttbed.controller.db import RunRow
from mqttbed.controller.states import RunState
from mqttbed.core.protocol import ClockEstimate
from mqttbed.core.run_record import BadRunRecord, RunRecord, run_record

# run_metadata of a quickstart-size run (10 subscribers on 2 agents, a virtual scope) as
# the engine wrote it before the record was typed (commit 4abbbdd): rows like it are in
# every data dir made until then.
CAPTURED = Path(__file__).parent / "recorded" / "run_metadata_quickstart_scoped.json"


def captured() -> dict:
    return json.loads(CAPTURED.read_text())


def kept_within(old: object, new: object, where: str = "") -> list[str]:
    """Where ``new`` lost or changed something of ``old`` (fields ``new`` adds are fine)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [miss for key, value in old.items()
                for miss in ([f"{where}.{key} missing"] if key not in new
                             else kept_within(value, new[key], f"{where}.{key}"))]
    return [] if old == new else [f"{where}: {old!r} became {new!r}"]


def test_a_record_written_before_the_typed_record_loads_and_stores_back_unchanged():
    metadata = captured()
    record = run_record(metadata)
    # every value it had is kept as it was; only fields added since (with their defaults,
    # e.g. a generator report's mqtt_client_reason) may be new
    assert kept_within(metadata, record.stored()) == []
    assert run_record(record.stored()) == record
    (publisher_agent,) = [a for a, clients in record.agents.items() if "pub-0" in clients]
    assert record.delivery_counts[publisher_agent].published == \
        record.generators[publisher_agent].open_loop_publishers * 500
    assert record.scope is not None and record.scope.acquisitions == record.scope.requested
    assert all(isinstance(c, ClockEstimate) for c in record.agent_clocks.values())
    assert record.endpoint is not None and record.endpoint.port == record.broker.port


def test_the_keeping_check_sees_a_changed_or_lost_value():
    assert kept_within({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 2, "d": 3}}) == []
    assert kept_within({"a": {"b": 1, "c": 2}}, {"a": {"b": 5}}) == [
        ".a.b: 1 became 5", ".a.c missing"]


def test_a_backends_own_deployment_fields_are_kept_and_read_back_typed():
    record = run_record(captured())
    mosquitto = record.broker.as_type(MosquittoDeployment)
    assert mosquitto.limits.max_queued_messages == \
        captured()["broker"]["limits"]["max_queued_messages"]
    assert mosquitto.config == record.broker.config


@pytest.mark.parametrize("older", [
    {},                                                       # a queued run
    {"retry_of": "c1-r0000"},                                 # a queued retry
    {"broker": {"backend": "mosquitto", "version": "2.0.18"},  # failed after deploying
     "endpoint": {"host": "127.0.0.1", "port": 1883}, "host": "local"},
    # keys and shapes of older versions: subscribe_order (gone), a scope without its
    # counts, clocks without their discipline, counts without upload retries
    {"subscribe_order": {"a0": ["sub-0"]},
     "scope": {"resource": "virtual", "dialect": "rigol-ds1000z", "identity": "x",
               "channels": {"1": "pub-0"}, "acquisitions": 3, "timeouts": 0, "error": None},
     "agent_clocks": {"a0": {"offset_ns": 5, "uncertainty_ns": 2, "method": "ntp"}},
     "delivery_counts": {"a0": {"published": 10, "received": 20}}},
])
def test_rows_of_older_versions_load(older):
    record = run_record(older)
    assert set(record.stored()) == set(older) - {"subscribe_order"}


def test_the_missing_figures_of_an_older_row_take_the_records_defaults():
    record = run_record({"scope": {"resource": "virtual", "dialect": "rigol-ds1000z"},
                         "delivery_counts": {"a0": {"published": 1, "received": 2}}})
    assert record.scope.requested is None and record.scope.shortfall == 0
    assert record.delivery_counts["a0"].upload_retries == 0
    assert record.t_start_ns is None and record.faults == [] and record.generators == {}


def test_a_record_that_does_not_load_names_the_run_and_the_field():
    metadata = captured() | {"t_start_ns": "soon"}
    with pytest.raises(BadRunRecord, match=r"run c1-r0003.*t_start_ns"):
        run_record(metadata, "c1-r0003")


def test_every_fact_is_validated_when_the_engine_records_it():
    record = RunRecord()
    with pytest.raises(ValidationError, match="t_start_ns"):
        record.t_start_ns = "soon"  # type: ignore[assignment]
    with pytest.raises(ValidationError, match="published"):
        record.delivery_counts = {"a0": {"received": 3}}  # type: ignore[dict-item]
    record.t_start_ns = 12
    assert record.stored() == {"t_start_ns": 12}


# -- the engine writes it, the analysis reads it -----------------------------------------


@pytest.mark.integration
def test_a_real_run_stores_a_complete_record_and_its_retry_says_what_it_retries(
        inproc_controller):
    controller = inproc_controller
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "recorded", "agents": {"count": 2},
         "workload": {"subscribers": 3, "rate_hz": 50, "messages": 30, "warmup_messages": 5}}))
    first = f"{campaign_id}-r0000"
    with controller.sessions() as s:
        s.get(RunRow, first).state = RunState.RUNNING   # its controller died mid-run
        s.commit()
    controller.engine.recover()
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        retry = s.get(RunRow, f"{first}-retry1")
        assert retry.state == RunState.DONE, retry.reason
        record = run_record(retry.run_metadata, retry.id)
        interrupted = run_record(s.get(RunRow, first).run_metadata)
    assert (record.retry_of, interrupted.retried_as) == (first, retry.id)
    assert record.broker is not None and record.broker.backend == "mosquitto"
    assert record.endpoint is not None and record.t_start_ns is not None
    assert sorted(c for clients in record.agents.values() for c in clients) == \
        ["pub-0", "sub-0", "sub-1", "sub-2"]
    assert set(record.agent_clocks) == set(record.gpio) == set(record.delivery_counts) \
        == set(record.agents)
    assert sum(c.received for c in record.delivery_counts.values()) == 3 * 30
    run_json = json.loads((controller.layout.run_dir(campaign_id, retry.id)
                           / "run.json").read_text())
    assert run_json["metadata"] == retry.run_metadata


def test_the_analysis_takes_spec_defaults_from_the_spec_model_and_facts_from_the_record():
    spec = CampaignSpec(name="older").model_dump(mode="json")
    del spec["measurement"]          # a spec stored before the section existed
    spec["workload"].pop("mode")
    record = captured() | {"faults": [{"at_ns": captured()["t_start_ns"] + 2_500_000_000,
                                       "what": "killed the broker"}]}
    row = RunRow(id="c1-r0000", campaign_id="c1", ordinal=0, point_index=0, repetition=0,
                 params={}, spec=spec, state="done", run_metadata=record)
    info = run_info(row)
    defaults = Measurement()
    assert info.max_clock_uncertainty_fraction == defaults.max_clock_uncertainty_fraction
    assert info.receive_clock == defaults.receive_clock
    assert info.mode == Workload().mode
    assert (info.fault, info.fault_at_s) == ("killed the broker", 2.5)
    assert info.scope is not None and info.scope.acquisitions == record["scope"]["acquisitions"]
    assert info.agent_clocks == record["agent_clocks"]
    assert info.generator is not None and info.generator["rate_kept"] is True


def test_the_analysis_reads_what_the_spec_sets():
    spec = parse_spec({"name": "set", "measurement": {"receive_clock": "user",
                                                      "max_clock_uncertainty_fraction": 0.5},
                       "workload": {"mode": "time-sync"}})
    row = RunRow(id="c1-r0000", campaign_id="c1", ordinal=0, point_index=0, repetition=0,
                 params={}, spec=spec.model_dump(mode="json"), state="done", run_metadata={})
    info = run_info(row)
    assert (info.receive_clock, info.max_clock_uncertainty_fraction, info.mode) == \
        ("user", 0.5, "time-sync")
    assert info.generator is None and info.scope is None and info.fault is None


# -- the results file's schema version -----------------------------------------------------


def results_of_version(out_dir: Path, campaign_id: str, version: int | None) -> Path:
    """A stats.json (and stats.parquet) of ``version`` (None: from before versions)."""
    stats = results_type()(campaign=CampaignRef(id=campaign_id, name="old"),
                           generated_at=datetime.now(UTC), points=[], runs=[])
    json_path, _ = write_stats(stats.model_copy(update={"schema_version": version or 0}),
                               out_dir)
    if version is None:
        document = json.loads(json_path.read_text())
        del document["schema_version"]
        json_path.write_text(json.dumps(document))
    return json_path


@pytest.mark.parametrize("version, found, says", [
    (SCHEMA_VERSION - 1, SCHEMA_VERSION - 1, "recompute it from the campaign's events"),
    (None, UNVERSIONED, "recompute it from the campaign's events"),
    (SCHEMA_VERSION + 1, SCHEMA_VERSION + 1, "read it with a newer mqttbed"),
])
def test_a_results_file_of_another_version_names_both_versions_and_the_upgrade(
        tmp_path, version, found, says):
    path = results_of_version(tmp_path, "c0123", version)
    with pytest.raises(StaleResults) as caught:
        read_stats(path, results_type())
    message = str(caught.value)
    assert f"schema version {found};" in message
    assert f"reads version {SCHEMA_VERSION}" in message
    assert says in message and "mqttbed analyze c0123" in message
    if version is not None:   # stats.parquet carries its version too
        with pytest.raises(StaleResults, match=f"schema version {found};"):
            read_stats_parquet(tmp_path / "stats.parquet")


def test_a_results_file_of_this_version_reads_back_as_written(tmp_path):
    path = results_of_version(tmp_path, "c0123", SCHEMA_VERSION)
    stats = read_stats(path, results_type())
    assert stats.schema_version == SCHEMA_VERSION and stats.campaign.id == "c0123"
    assert stats.model_dump_json() == results_type().model_validate_json(
        path.read_bytes()).model_dump_json()
    assert read_stats_parquet(tmp_path / "stats.parquet") == []


@pytest.mark.integration
@pytest.mark.parallel
@pytest.mark.system  # a campaign, its Spark analysis, then `mqttbed analyze` in a process
@pytest.mark.timeout(400)
def test_an_older_results_file_is_refused_by_api_and_report_and_mqttbed_analyze_upgrades_it(
        tmp_path):
    from fastapi.testclient import TestClient

    from mqttbed.api.app import create_app
    from mqttbed.api.report import render_report
    from mqttbed.controller.cli import main
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.states import CampaignStatus
    from mqttbed.controller.tokens import TokenRole, create_token
    from mqttbed.core.settings import Settings

    data_dir = tmp_path / "data"
    with create_controller(Settings(data_dir=data_dir)) as ctl:
        campaign_id = ctl.engine.create_campaign(parse_spec(
            {"name": "older", "workload": {"subscribers": 2, "rate_hz": 50, "messages": 30,
                                           "warmup_messages": 5}}))
        assert ctl.engine.run_campaign(campaign_id) == CampaignStatus.DONE
        ctl.engine.set_campaign_status(campaign_id, CampaignStatus.DONE)
        results_of_version(ctl.layout.campaign_dir(campaign_id), campaign_id,
                           SCHEMA_VERSION - 1)
        upgrade = f"mqttbed analyze {campaign_id}"
        with pytest.raises(StaleResults, match=upgrade):
            load_results(ctl.layout, campaign_id)
        assert upgrade in render_report(ctl, campaign_id, standalone=True)
        token = create_token(ctl.sessions, "tester", TokenRole.USER)
        # no lifespan: this controller is started already
        answer = TestClient(create_app(ctl, run_campaigns=False)).get(
            f"/api/v1/campaigns/{campaign_id}/stats", headers={"authorization": f"Bearer {token}"})
        assert answer.status_code == 409 and upgrade in answer.json()["detail"]

    assert main(["analyze", campaign_id, "--data-dir", str(data_dir)]) == 0
    with create_controller(Settings(data_dir=data_dir), controller_url="") as ctl:
        upgraded = load_results(ctl.layout, campaign_id)
        rows = read_stats_parquet(ctl.layout.campaign_dir(campaign_id) / "stats.parquet")
    assert upgraded is not None and upgraded.schema_version == SCHEMA_VERSION
    (point,) = upgraded.points
    assert point.deliveries_received == 2 * 25
    assert {row["campaign_id"] for row in rows} == {campaign_id}
