"""The FPGA-vs-software campaign: its spec, and a real fpga run through the engine."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

from mqttbed.api.report import render_report
from mqttbed.campaigns.spec import builtin_spec_path, load_spec, parse_spec, plan_runs
from mqttbed.controller.analysis import analyze_campaign
from mqttbed.controller.db import RunRow
from mqttbed.controller.states import RunState
from mqttbed.core.run_record import run_record
from tests.conftest import child_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_the_comparison_campaign_sweeps_three_brokers_over_the_papers_subscriber_counts():
    spec = load_spec(builtin_spec_path("fpga-vs-software"))
    runs = plan_runs(spec)
    assert spec.repetitions == 20 and len(runs) == 3 * 5 * 20
    # (fpga-model leaves engine out: the backend's default, model)
    brokers = {"mosquitto": ("mosquitto", None), "fpga-model": ("fpga", None),
               "fpga-rtl": ("fpga", "rtl")}
    points = {(r.point.params["scenario"], r.point.spec.broker.backend,
               r.point.spec.broker.model_dump().get("engine"), r.point.spec.workload.subscribers)
              for r in runs}
    assert points == {(name, *brokers[name], n) for name in brokers
                      for n in (2, 10, 20, 50, 100)}
    assert {r.point.spec.workload.qos for r in runs} == {0}
    # one run sends for a few seconds
    w = spec.workload
    assert 1 <= w.messages / w.rate_hz <= 5


@pytest.mark.timeout(240)  # and a Spark session for its results
def test_an_fpga_run_measures_over_udp_and_records_the_modelled_latency(controller):
    spec = parse_spec({
        "name": "fpga-smoke", "broker": {"backend": "fpga"}, "agents": {"count": 2},
        "workload": {"publishers": 1, "subscribers": 4, "topic": "sync/pmu",
                     "payload_bytes": 64, "rate_hz": 100, "messages": 60,
                     "warmup_messages": 5},
        "timing": {"start_lead_s": 0.3, "drain_s": 0.5}})
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == RunState.DONE, run.reason
    endpoint = run_record(run.run_metadata, run.id).endpoint
    assert endpoint is not None and endpoint.transport == "mqtt-udp"
    broker = json.loads((controller.layout.run_dir(campaign_id, run.id) / "run.json")
                        .read_text())["metadata"]["broker"]
    assert broker["backend"] == "fpga" and broker["exit_code"] == 0
    latency = broker["hardware_latency_ns"]
    assert latency["publish_packets"] == 60 and latency["copies_per_publish_mean"] == 4
    # 4 copies of a 76-byte PUBLISH: 799.2 ns, then 113.6 ns per further frame
    assert latency["modelled"]["last_copy"]["mean"] == pytest.approx(799.2 + 3 * 113.6)
    events = ds.dataset(controller.layout.run_events(campaign_id, run.id),
                        format="parquet").to_table()
    kinds = events.column("kind").to_pylist()
    assert kinds.count("publish") == 60
    assert kinds.count("delivery") == 4 * 60
    assert kinds.count("subscribe") == 4
    assert child_processes("mqttbed.brokers.fpga") == []
    assert child_processes("mqttbed.agents") == []
    # The model's per-packet latencies reach the results as the backend's own section,
    # pooled by analytics, and the report shows it without knowing its figures.
    results, _, _ = analyze_campaign(controller.sessions, controller.layout, campaign_id)
    (point,) = results.points
    section = point.sections.hardware_latency
    assert section.publish_packets == 60 and section.copies_per_publish == 4
    assert section.modelled_last_copy_ns.count == 60
    assert section.modelled_last_copy_ns.p50 == pytest.approx(799.2 + 3 * 113.6)
    assert section.emulator_first_copy_ns.p50 > 0
    assert results.runs[0].sections.hardware_latency == section   # one run: the same
    html = render_report(controller, campaign_id, standalone=True)
    assert 'id="section-hardware_latency"' in html and "modelled_last_copy_ns p50" in html
