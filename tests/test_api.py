"""The REST API over real HTTP, with real Mosquitto, agents and Spark behind it."""

from __future__ import annotations

import csv
import io
import json
import time
import zipfile
from pathlib import Path

import pytest

from mqttbed.controller.documents import ResultsReady
from tests.conftest import eventually, wait_until

pytestmark = pytest.mark.integration


def test_health_needs_no_token(served):
    with served.client(token=None) as http:
        response = http.get("/api/v1/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


@pytest.mark.parametrize("token, expected", [(None, 401), ("mqb_wrong", 401), ("agent", 403)])
def test_user_routes_refuse_missing_wrong_and_agent_tokens(served, token, expected):
    with served.client(token=token) as http:
        for path in ("/api/v1/campaigns", "/api/v1/agents", "/api/v1/backends",
                     f"/api/v1/campaigns/{served.finished['id']}/stats"):
            assert http.get(path).status_code == expected, path


def test_agent_routes_refuse_user_tokens(served):
    with served.client(token="user") as http:
        response = http.get("/agent/v1/agents/nobody/commands", params={"wait_s": 0})
    assert response.status_code == 403


def test_agent_token_registers_on_the_agent_routes(served):
    hello = {"name": "pi-lab-3", "hostname": "pi3", "pid": 1, "cores": 4,
             "gpio_backend": "virtual", "clock": "CLOCK_MONOTONIC", "clock_resolution_ns": 1}
    with served.client(token="agent") as http:
        registered = http.post("/agent/v1/register", json=hello)
    assert registered.status_code == 200 and registered.json()["agent_id"]
    with served.client() as http:
        agents = http.get("/api/v1/agents").json()
    assert any(a["name"] == "pi-lab-3" and a["hostname"] == "pi3" for a in agents)


def test_bad_spec_is_422_naming_the_field_and_the_value(served):
    with served.client() as http:
        response = http.post("/api/v1/campaigns",
                             json={"name": "bad", "workload": {"rate_hz": -5}})
        yaml_response = http.post("/api/v1/campaigns", content="name: bad\nworkload: {qoz: 1}\n",
                                  headers={"content-type": "application/yaml"})
    assert response.status_code == 422
    assert "workload.rate_hz: bad value -5" in response.json()["detail"]
    assert yaml_response.status_code == 422
    assert "workload.qoz: unknown key" in yaml_response.json()["detail"]


def test_finished_campaign_reports_its_runs_and_stats(served):
    campaign = served.finished
    assert campaign["status"] == "done" and campaign["progress"]["runs_done"] == 2
    assert [r["state"] for r in campaign["runs"]] == ["done", "done"]
    with served.client() as http:
        stats = http.get(f"/api/v1/campaigns/{campaign['id']}/stats").json()
        listed = http.get("/api/v1/campaigns").json()
        backends = http.get("/api/v1/backends").json()
    assert {p["params"]["workload.subscribers"] for p in stats["points"]} == {2, 4}
    for point in stats["points"]:
        assert point["deliveries_expected"] == 90 * point["params"]["workload.subscribers"]
        assert point["deliveries_received"] + point["lost"] == point["deliveries_expected"]
    (in_list,) = [c for c in listed if c["id"] == campaign["id"]]
    assert in_list["spec"] == campaign["spec"] and in_list["runs"] == campaign["runs"]
    mosquitto = next(b for b in backends if b["name"] == "mosquitto")
    assert "max_queued_messages" in mosquitto["options_schema"]["properties"]
    assert all(b["available"] and b["unavailable_reason"] is None for b in backends)


def test_stats_validate_against_the_published_schema_which_the_docs_hold(served):
    import jsonschema

    with served.client() as http:
        schema = http.get("/api/v1/schemas/stats").json()
        stats = http.get(f"/api/v1/campaigns/{served.finished['id']}/stats").json()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(stats, schema)
    # every backend's own section is part of the schema, and the docs carry this schema
    assert "hardware_latency" in schema["$defs"]["BackendSections"]["properties"]
    docs = Path(__file__).parents[1] / "docs" / "stats.schema.json"
    assert json.loads(docs.read_text()) == schema, "run `make docs` to refresh the docs copy"
    # what the schema says of an interval is also what the document holds
    point = stats["points"][0]
    assert point["latency_us"]["p50_ci"] is None or len(point["latency_us"]["p50_ci"]) == 2
    broken = {**stats, "points": [{**point, "lost": "many"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_csv_export_has_one_row_per_delivery(served):
    campaign_id = served.finished["id"]
    with served.client() as http:
        stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
        response = http.get(f"/api/v1/campaigns/{campaign_id}/dataset", params={"format": "csv"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    # every delivery, warm-up included (90 measured + 10 warm-up per subscriber and point)
    assert len(rows) == sum(100 * p["params"]["workload.subscribers"] for p in stats["points"])
    assert {"t_pub_ns", "t_recv_ns", "run_id", "receiver"} <= set(rows[0])
    assert all(int(r["t_recv_ns"]) > int(r["t_pub_ns"]) for r in rows)
    measured = sum(r["warmup"] == "false" for r in rows)
    assert measured == sum(p["deliveries_received"] for p in stats["points"])


def test_parquet_export_is_a_zip_of_the_dataset_with_a_manifest(served):
    campaign_id = served.finished["id"]
    with served.client() as http:
        response = http.get(f"/api/v1/campaigns/{campaign_id}/dataset",
                            params={"format": "parquet"})
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    names = archive.namelist()
    assert any(n.startswith(f"events/campaign_id={campaign_id}/run_id=") for n in names)
    assert any(n.startswith("broker_samples/") for n in names)
    assert "stats.json" in names
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["campaign"]["spec"]["name"] == "api-e2e"
    # deliveries carry the kernel's receive stamp; publishes and SUBACKs the user clock
    assert manifest["clock"]["sources_in_data"] == ["kernel", "user"]
    assert all(b["version"].startswith("2.") and len(b["config_sha256"]) == 64
               for b in manifest["backends"])
    assert manifest["controller_host"]["cpus"] >= 1
    # where every run's timestamps were taken: each agent's host, clock and offset
    for run in manifest["runs"]:
        assert run["agents"], run
        for agent in run["agents"].values():
            assert agent["hostname"] and agent["cores"] >= 1 and agent["clients"]
            assert agent["clock"] == "CLOCK_MONOTONIC"
            assert agent["clock_offset"]["method"] == "same-clock"
            assert agent["gpio"]["backend"] == "virtual"


def stored_rows(served, campaign_id: str) -> int:
    """Event rows of ``campaign_id``'s runs stored so far, by the controller's own record."""
    from mqttbed.controller.db import ChunkRow

    with served.controller.sessions() as s:
        return sum(c.rows for c in s.query(ChunkRow).filter(
            ChunkRow.run_id.like(f"{campaign_id}-%")))


def test_cancel_stops_the_running_run_and_keeps_its_events(served):
    spec = {"name": "to-cancel", "agents": {"count": 1},
            "workload": {"subscribers": 2, "rate_hz": 200, "messages": 4000,
                         "warmup_messages": 0}}
    with served.client() as http:
        campaign_id = http.post("/api/v1/campaigns", json=spec).json()["id"]
        http.post(f"/api/v1/campaigns/{campaign_id}/start")
        deadline = time.monotonic() + 60
        while http.get(f"/api/v1/campaigns/{campaign_id}").json()["runs"][0]["state"] != \
                "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # cancel once a few chunks are stored (they come every second), not after a guess
        assert eventually(lambda: stored_rows(served, campaign_id) > 200, timeout_s=60), \
            "no events stored while the run was running"
        assert http.post(f"/api/v1/campaigns/{campaign_id}/cancel").status_code == 200
        campaign = served.wait_for_status(campaign_id, ("cancelled",), 120)
        (run,) = campaign["runs"]
        assert run["state"] == "interrupted" and run["reason"] == "campaign cancelled"
        exported = http.get(f"/api/v1/campaigns/{campaign_id}/dataset", params={"format": "csv"})
        second_cancel = http.post(f"/api/v1/campaigns/{campaign_id}/cancel")
    rows = exported.text.strip().splitlines()
    assert len(rows) - 1 > 200  # deliveries uploaded before the cancel are kept
    assert second_cancel.status_code == 409


TINY_SPEC = {"name": "tiny", "agents": {"count": 1},
             "workload": {"subscribers": 2, "rate_hz": 200, "messages": 60,
                          "warmup_messages": 0}}


def test_a_client_polling_until_done_gets_the_stats_on_its_next_request(served):
    """done means analysed: running -> analysing -> done, and /stats answers 202 until then."""
    seen: list[str] = []
    pending: dict[str, object] = {}
    with served.client() as http:
        campaign_id = http.post("/api/v1/campaigns", json=TINY_SPEC).json()["id"]
        assert http.post(f"/api/v1/campaigns/{campaign_id}/start").status_code == 200
        deadline = time.monotonic() + 240
        while True:
            status = http.get(f"/api/v1/campaigns/{campaign_id}").json()["status"]
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == "done":
                stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats")
                break
            if status in ("running", "analysing") and status not in pending:
                pending[status] = http.get(f"/api/v1/campaigns/{campaign_id}/stats")
                if status == "analysing":
                    pending["cancel"] = http.post(f"/api/v1/campaigns/{campaign_id}/cancel")
            assert time.monotonic() < deadline, f"campaign stuck: {seen}"
            time.sleep(0.1)
    assert stats.status_code == 200, stats.text
    assert stats.json()["campaign"]["id"] == campaign_id
    assert seen[-3:] == ["running", "analysing", "done"], seen
    for status in ("running", "analysing"):
        answer = pending[status]
        assert answer.status_code == 202, (status, answer.text)
        assert answer.headers["retry-after"] == "5"
        assert answer.json()["status"] == status and answer.json()["retry_after_s"] == 5
    assert pending["cancel"].status_code == 409
    assert "analysing" in pending["cancel"].json()["detail"]
    # the same story in the controller's documents, results announced before done
    assert served.updates.statuses(campaign_id) == ["queued", "running", "analysing", "done"]
    (ready,) = [d for d in served.updates
                if isinstance(d, ResultsReady) and d.campaign_id == campaign_id]
    assert ready.stats_path.exists()


def test_a_failed_analysis_fails_the_campaign_and_keeps_its_events(served, monkeypatch):
    import pyarrow.dataset as ds

    from mqttbed.controller import lifecycle
    from mqttbed.controller.db import ChunkRow

    def analysis_that_breaks(sessions, layout, campaign_id, settings=None):
        # until the client polling below has seen it analysing
        wait_until(lambda: "analysing" in seen, 60, "the client to see the campaign analysing")
        # half-way through writing its files, as a real failure might leave them
        (layout.campaign_dir(campaign_id) / "stats.json").write_text('{"points": [')
        raise RuntimeError("the Spark executor was lost")

    seen: list[str] = []
    monkeypatch.setattr(lifecycle, "analyze_campaign", analysis_that_breaks)
    with served.client() as http:
        campaign_id = http.post("/api/v1/campaigns", json=TINY_SPEC).json()["id"]
        http.post(f"/api/v1/campaigns/{campaign_id}/start")
        campaign = served.wait_for_status(campaign_id, ("failed",), 120, seen=seen, poll_s=0.05)
        stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats")
    assert campaign["reason"] == "analysis failed: RuntimeError: the Spark executor was lost"
    assert [r["state"] for r in campaign["runs"]] == ["done"]
    assert "analysing" in seen and not campaign["stats_ready"]
    assert stats.status_code == 409
    assert "analysis failed: RuntimeError" in stats.json()["detail"]
    core = served.controller
    assert not (core.layout.campaign_dir(campaign_id) / "stats.json").exists()
    with core.sessions() as s:
        stored = sum(c.rows for c in s.query(ChunkRow).filter(
            ChunkRow.run_id.like(f"{campaign_id}-%")))
    on_disk = ds.dataset(core.layout.events / f"campaign_id={campaign_id}",
                         format="parquet").count_rows()
    assert stored == on_disk == 60 + 2 * 60 + 2  # publishes, deliveries, subscriptions


def test_stats_of_a_campaign_never_started_is_409_saying_so(served):
    with served.client() as http:
        campaign_id = http.post("/api/v1/campaigns", json=TINY_SPEC).json()["id"]
        response = http.get(f"/api/v1/campaigns/{campaign_id}/stats")
    assert response.status_code == 409
    assert "has not been started" in response.json()["detail"]


def test_unknown_campaign_is_404(served):
    with served.client() as http:
        assert http.get("/api/v1/campaigns/nope").status_code == 404
        assert http.post("/api/v1/campaigns/nope/start").status_code == 404
