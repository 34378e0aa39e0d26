"""A small fork/pipe vs Mosquitto comparison through the real run engine and real agents.

The same shape as ``campaigns/forkpipe-vs-mosquitto.yaml`` (an idle scenario and a
publishers + subscribers scenario, swept over both backends), scaled down to 5 + 5 so it
runs in seconds. Statistics (Spark) are left to the end-to-end test of the spine: here
the per-run broker samples that feed them are checked.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.instruments.resources import summarize
from tests.conftest import child_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SPEC = {
    "name": "forkpipe-vs-mosquitto-small",
    "broker": {"backend": "mosquitto"},
    "workload": {"topic": "bench/forkpipe", "payload_bytes": 64, "rate_hz": 100,
                 "messages": 3, "warmup_messages": 0, "qos": 0},
    "scenarios": [
        {"name": "idle", "workload.publishers": 0, "workload.subscribers": 0,
         "workload.min_window_s": 1.0},
        {"name": "5+5", "workload.publishers": 5, "workload.subscribers": 5},
    ],
    "sweep": {"broker.backend": ["mosquitto", "forkpipe"]},
    "repetitions": 1,
    "agents": {"count": 2},
    # Other work on a small machine can delay a heartbeat; a lost agent is not under test.
    "timing": {"heartbeat_timeout_s": 10},
}


def test_small_comparison_measures_both_backends_and_counts_every_forked_process(controller):
    spec = parse_spec(SPEC)
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "done"

    with controller.sessions() as s:
        runs = {(r.params["scenario"], r.params["broker.backend"]): r
                for r in s.query(RunRow).filter_by(campaign_id=campaign_id)}
    assert set(runs) == {(sc, b) for sc in ("idle", "5+5") for b in ("mosquitto", "forkpipe")}

    def samples(run: RunRow) -> list[BrokerResourceSample]:
        path = controller.layout.run_samples(campaign_id, run.id) / "samples.parquet"
        return [BrokerResourceSample(**row) for row in pq.read_table(path).to_pylist()]

    for (scenario, backend), run in runs.items():
        assert run.state == "done", run.reason
        broker = run.run_metadata["broker"]
        assert broker["backend"] == backend
        figures = summarize(samples(run))
        assert figures["cpu_percent_mean"] is not None and figures["window_s"] > 0
        assert figures["net_recv_kb_per_s"] is not None
        if backend == "forkpipe":
            assert broker["leftovers"] == {"processes": 0, "pipes": 0}
        if scenario == "5+5":
            counts = run.run_metadata["delivery_counts"].values()
            assert sum(c["published"] for c in counts) == 5 * 3
            assert sum(c["received"] for c in counts) == 5 * 3 * 5

    # The idle fork/pipe broker is its listener alone; under load the sampler sees the
    # listener, one process per client and one per subscription.
    assert {s.processes for s in samples(runs[("idle", "forkpipe")])} == {1}
    assert max(s.processes for s in samples(runs[("5+5", "forkpipe")])) == 1 + 10 + 5
    assert max(s.processes for s in samples(runs[("5+5", "mosquitto")])) == 1
    # The fork/pipe broker's bytes are its socket bytes over all its processes: each
    # delivery once (its copy through a pipe is not network traffic), plus the small
    # CONNACK/SUBACK/PINGRESP packets; Mosquitto's are its syscall bytes (with its log).
    publish_bytes = 2 + 2 + len("bench/forkpipe") + 64
    delivery_bytes = 5 * 3 * 5 * publish_bytes
    forkpipe = summarize(samples(runs[("5+5", "forkpipe")]))
    assert delivery_bytes <= forkpipe["bytes_sent"] <= delivery_bytes + 1000
    assert 5 * 3 * publish_bytes <= forkpipe["bytes_recv"] <= 5 * 3 * publish_bytes + 2000
    assert summarize(samples(runs[("5+5", "mosquitto")]))["bytes_sent"] >= delivery_bytes

    assert child_processes("mqttbed-forkpipe") == []
    assert child_processes("mosquitto") == []
