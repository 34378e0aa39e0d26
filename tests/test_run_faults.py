"""Faults around a run, on real processes: the data dir, the uploads, the scope, the network.

Each test is one row of the fault table in docs/explanation/faults.md. The data dir's event
store is a small tmpfs mounted for the test (full, or read-only); the scope is the virtual
SCPI scope made to stop answering; the network cut is an iptables DROP inside the namespace
of an agent.

The data dir and scope rows run their agents on threads of this process
(``inproc_controller``): the faults are the controller's store and its scope, met by
the same agent program over the same HTTP routes as a process (tests/test_inproc_agents.py).
The network cut needs agent processes: its agents run in a network namespace.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.compaction import COMPACTED_NAME, compacted_chunks
from mqttbed.controller.db import ChunkRow, RunRow
from mqttbed.controller.states import RunState
from mqttbed.core.run_record import run_record
from mqttbed.instruments.scope.virtual import VirtualScope
from tests.conftest import child_processes, wait_until

pytestmark = pytest.mark.integration

WORKLOAD = {"publishers": 1, "subscribers": 2, "rate_hz": 200, "warmup_messages": 0}


def start_campaign(controller, spec_data) -> tuple[str, threading.Thread]:
    campaign_id = controller.engine.create_campaign(parse_spec(spec_data))
    thread = threading.Thread(target=controller.engine.run_campaign, args=(campaign_id,))
    thread.start()
    return campaign_id, thread


def run_campaign(controller, spec_data) -> tuple[str, RunRow]:
    campaign_id, thread = start_campaign(controller, spec_data)
    thread.join(90)
    assert not thread.is_alive()
    return campaign_id, only_run(controller, campaign_id)


def only_run(controller, campaign_id) -> RunRow:
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        return run



def run_events(controller, campaign_id: str, run_id: str):
    path = controller.layout.run_events(campaign_id, run_id)
    if not path.exists() or not any(path.glob("*.parquet")):
        return None
    return ds.dataset(path, format="parquet").to_table()


def assert_store_consistent(controller, campaign_id: str, run_id: str) -> int:
    """Every chunk row has its file and every file its row, or (the run compacted when it
    ended) the one compacted file holds exactly the chunks with a row; no temporary file
    is left. Return the rows stored."""
    with controller.sessions() as s:
        chunks = s.query(ChunkRow).filter_by(run_id=run_id).all()
    directory = controller.layout.run_events(campaign_id, run_id)
    files = sorted(directory.glob("*")) if directory.exists() else []
    if directory / COMPACTED_NAME in files:
        assert files == [directory / COMPACTED_NAME]
        assert compacted_chunks(files[0]) == {Path(c.path).name for c in chunks}
    else:
        assert sorted(Path(c.path) for c in chunks) == files
    table = run_events(controller, campaign_id, run_id)
    stored = 0 if table is None else table.num_rows
    assert stored == sum(c.rows for c in chunks)
    return stored


@pytest.fixture
def mount_events(inproc_controller) -> Iterator[Callable[[str], Path]]:
    """Mount a tmpfs with the given options on the controller's event store; unmounted
    (and the store left as it was) after the test."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        events = inproc_controller.layout.events
        events.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "mqttbed-faults", str(events)],
                       check=True)
        mounted.append(events)
        return events

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=True)


def lost_counts(reason: str, run_id: str) -> dict[str, int]:
    """agent name (a0, a1) -> the events its reason says were lost."""
    return {f"a{n}": int(lost) for n, lost in
            re.findall(rf"agent agent-\d+-{run_id}-a(\d): (\d+) events lost", reason)}


def test_full_data_dir_fails_the_run_naming_the_path_and_keeps_the_store_consistent(
        inproc_controller, mount_events):
    controller = inproc_controller
    """Fault row "data dir full": the event store fills mid-run."""
    events = mount_events("size=64k")
    spec = {"name": "full", "agents": {"count": 2}, "workload": {**WORKLOAD, "messages": 1000},
            "timing": {"upload_interval_s": 0.25}}
    campaign_id, run = run_campaign(controller, spec)

    assert run.state == RunState.FAILED
    partition = controller.layout.run_events(campaign_id, run.id)
    assert re.search(rf"chunk \d+ of agent-\d+-{run.id}-a\d cannot be stored: No space left on "
                     rf"device: {re.escape(str(partition))}/agent-\d+-{run.id}-a\d-\d{{6}}"
                     r"\.parquet", run.reason), run.reason
    assert lost_counts(run.reason, run.id), run.reason  # never silent: a count per agent
    stored = assert_store_consistent(controller, campaign_id, run.id)
    assert stored > 0  # what fitted before the disk filled is kept
    assert events.is_mount()
    assert child_processes("mqttbed.agents") == [] and child_processes("mosquitto") == []


def test_final_flush_into_a_read_only_data_dir_fails_the_run_naming_the_events_lost(
        inproc_controller, mount_events):
    """Fault rows "data dir read-only" and "uploader cannot flush at the end": with one
    upload at the end of the run, every event of each agent is counted as lost."""
    controller = inproc_controller
    mount_events("size=64k,ro")
    spec = {"name": "read-only", "agents": {"count": 2},
            "workload": {**WORKLOAD, "messages": 100},
            "timing": {"upload_interval_s": 600, "drain_s": 0.5}}
    campaign_id, run = run_campaign(controller, spec)

    assert run.state == RunState.FAILED
    partition = controller.layout.run_events(campaign_id, run.id)
    # the first directory it could not create
    assert f"cannot be stored: Read-only file system: {partition.parent})" in run.reason, \
        run.reason
    # a0 plays pub-0 and sub-1: 100 publishes, 100 deliveries, 1 subscription; a1 sub-0.
    # Both flush at the same moment, so both losses are in the reason.
    assert lost_counts(run.reason, run.id) == {"a0": 201, "a1": 101}, run.reason
    assert "not uploaded when the run ended" in run.reason
    assert assert_store_consistent(controller, campaign_id, run.id) == 0


def test_scope_that_stops_answering_marks_the_run_and_keeps_software_figures(
        inproc_controller, monkeypatch):
    controller = inproc_controller
    """Fault row "scope stops answering mid-run"."""
    scopes: list[VirtualScope] = []
    start = VirtualScope.start

    def start_and_keep(self: VirtualScope) -> VirtualScope:
        scopes.append(self)
        return start(self)

    monkeypatch.setattr(VirtualScope, "start", start_and_keep)
    spec = {"name": "scope-hangs", "agents": {"count": 2},
            "workload": {**WORKLOAD, "messages": 600},
            "measurement": {"scope": {"resource": "virtual", "acquisitions": 20,
                                      "measure_timeout_s": 1}}}
    campaign_id, thread = start_campaign(controller, spec)
    # the recorder reads an acquisition's delays after it completed: after the third has
    # completed, at least two were read
    wait_until(lambda: scopes and scopes[0].completed >= 3, 30, "three scope acquisitions")
    scopes[0].stop_answering()
    thread.join(60)
    assert not thread.is_alive()

    run = only_run(controller, campaign_id)
    scope = run_record(run.run_metadata, run.id).scope
    assert scope is not None and scope.error is not None and scope.acquisitions is not None
    assert run.state == RunState.DONE
    assert run.reason == f"scope error: {scope.error}"
    assert scope.error.startswith("VisaIOError: VI_ERROR_TMO"), scope.error
    assert 2 <= scope.acquisitions < 20
    assert (scope.requested, scope.shortfall) == (20, 20 - scope.acquisitions)
    table = run_events(controller, campaign_id, run.id)
    sources = table.group_by("clock_source").aggregate([("kind", "count")]).to_pylist()
    by_source = {row["clock_source"]: row["kind_count"] for row in sources}
    # software: every publish and both subscriptions on the user clock, both deliveries
    # of each publish on the kernel's receive stamp; the scope: one row (its one watched
    # subscriber) per acquisition made before it hung
    assert by_source == {"user": 600 + 2, "kernel": 2 * 600, "scope": scope.acquisitions}


def test_short_run_flags_the_scope_shortfall_after_the_measure_timeout(inproc_controller):
    controller = inproc_controller
    """Scope acquisitions: the measure phase waits (bounded by the spec) for what is
    missing; what still is, is flagged."""
    spec = {"name": "scope-short", "agents": {"count": 2},
            "workload": {**WORKLOAD, "messages": 100},
            "measurement": {"scope": {"resource": "virtual", "acquisitions": 500,
                                      "measure_timeout_s": 0.5,
                                      "acquisition_timeout_s": 0.3}}}
    _, run = run_campaign(controller, spec)
    scope = run_record(run.run_metadata, run.id).scope
    assert scope is not None and scope.acquisitions is not None
    assert run.state == RunState.DONE and run.reason is None
    assert scope.error is None and 0 < scope.acquisitions < 100
    assert (scope.requested, scope.shortfall) == (500, 500 - scope.acquisitions)


def iptables_in(namespace: str, *rule: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-w", *rule], check=True)


@pytest.mark.system
@pytest.mark.parallel   # the one parallel test that builds a network (its subnet is unlocked)
def test_network_cut_to_the_controller_for_10_s_retries_chunks_and_stores_each_once(
        controller, updates):
    """Fault row "agent's network to the controller cut for 10 s": the subscribers' agent
    runs in a namespace; everything it sends to the root namespace but its broker traffic
    is dropped for 10 s while the run goes on."""
    spec = {"name": "cut", "agents": {"count": 2},
            "workload": {**WORKLOAD, "rate_hz": 100, "messages": 300},
            "network": {"impairments": [{"group": "subscribers"}]},
            "timing": {"heartbeat_timeout_s": 20, "upload_interval_s": 0.25}}
    campaign_id, thread = start_campaign(controller, spec)
    run_id = f"{campaign_id}-r0000"
    wait_until(lambda: RunState.RUNNING in updates.states(run_id), 30, "run to start")
    network = run_record(only_run(controller, campaign_id).run_metadata).network
    assert network is not None
    group = network.groups["subscribers"]
    assert group.namespace is not None and group.proxy is not None
    namespace, broker_port = group.namespace, group.proxy.rsplit(":", 1)[1]
    cut = ("OUTPUT", "-p", "tcp", "!", "--dport", broker_port, "-j", "DROP")
    iptables_in(namespace, "-I", *cut)
    try:
        time.sleep(10)  # window: the fault is a 10 s cut
    finally:
        iptables_in(namespace, "-D", *cut)
    thread.join(60)
    assert not thread.is_alive()

    run = only_run(controller, campaign_id)
    assert run.state == RunState.DONE, run.reason
    record = run_record(run.run_metadata, run.id)
    cut_agent = next(a for a, clients in record.agents.items()
                     if clients == ["sub-0", "sub-1"])
    assert record.delivery_counts[cut_agent].upload_retries > 0  # its chunks were sent again
    # ... and each stored once: every event of the run exactly once
    stored = assert_store_consistent(controller, campaign_id, run.id)
    assert stored == 300 + 2 * 300 + 2
    table = run_events(controller, campaign_id, run.id)
    keys = {(k, p, s, r) for k, p, s, r in zip(
        *(table[c].to_pylist() for c in ("kind", "publisher", "seq", "receiver")), strict=True)}
    assert len(keys) == stored
    assert sum(c.received for c in record.delivery_counts.values()) == 2 * 300
