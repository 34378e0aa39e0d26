"""One conformance suite for every registered backend, built-in or installed.

A new backend gets these tests by being registered: its declaration is complete and
consistent; it deploys with its example options, is healthy, samples its resources,
records its deployment, tears down twice and leaves nothing running (a broker it did not
start is left running); and a broker killed mid-run fails the run with that reason while
every event that arrived is kept.

The broker-killed run's agents are threads of this process (``inproc_controller``) where
the backend lets the agents run on this machine: the failure is the broker's, met by the
same agent program over the same HTTP routes as a process (tests/test_inproc_agents.py).
A backend that places the agents in its own network (``OwnNetwork``) still gets processes.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest
from pydantic import BaseModel

from mqttbed.brokers.cpu_budget import CpuBudget, cpu_budget_unavailable
from mqttbed.brokers.processes import processes_in_group
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.run_access import run_access
from mqttbed.controller.states import RunState
from mqttbed.core.backends import (
    BackendDeclaration,
    BrokerBackend,
    ConfiguresAccess,
    DeploymentRecord,
    LocalProcesses,
    MultiBroker,
    OwnNetwork,
    backend_names,
    create_backend,
    declaration,
)
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint
from mqttbed.core.run_record import RunRecord, run_record
from tests.conftest import child_processes, wait_until
from tests.test_engine_failures import dataset_rows, only_run, start_campaign, stored_rows

BACKENDS = backend_names()


@pytest.mark.parametrize("name", BACKENDS)
def test_the_declaration_is_complete_and_names_a_backend_that_meets_the_contract(name):
    declared = declaration(name)
    assert isinstance(declared, BackendDeclaration) and declared.name == name
    assert declared.summary.strip(), f"{name}: a one-line summary for listings"
    assert issubclass(declared.options, BaseModel)
    assert declared.options.model_fields["backend"].default == name, \
        "the options model's backend field defaults to the backend's name"
    cls = declared.backend_class()
    assert isinstance(declared.create(), BrokerBackend) and cls.name == name
    assert bool(declared.placements) == issubclass(cls, MultiBroker), \
        "a backend that places clients on several brokers declares its placements"
    assert declared.features.qos <= {0, 1, 2} and declared.features.qos
    reason = declared.unavailable()
    assert reason is None or reason.strip()
    if declared.results_section is not None:
        keys = [declaration(n).results_section.key for n in BACKENDS
                if declaration(n).results_section is not None]
        # two backends may share a section type (p4 reports mqtt-sn's packets), never a key
        # for different types
        same_key = {declaration(n).results_section for n in BACKENDS
                    if declaration(n).results_section is not None
                    and declaration(n).results_section.key == declared.results_section.key}
        assert len(same_key) == 1 and declared.results_section.key in keys


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fits_under_a_cpu_budget(name: str, backend: LocalProcesses,
                             record: DeploymentRecord) -> None:
    """The processes a backend names are its broker's, and all go under a CPU budget."""
    brokers = backend.broker_processes()
    assert brokers, f"{name} is LocalProcesses but names no broker process after deploy"
    roots = [pid for pids in brokers.values() for pid in pids]
    assert record.pid is None or record.pid in roots, \
        f"{name}'s record names pid {record.pid}, its broker_processes {brokers}"
    if cpu_budget_unavailable() is not None:
        return
    budget = CpuBudget.create(f"conformance-{name}-{os.getpid()}", 1.0)
    try:
        for broker, pids in brokers.items():
            budget.add(broker, pids)
            assert set(pids) <= set(budget.members(broker))
    finally:
        budget.remove()


@pytest.mark.integration
@pytest.mark.parametrize("name", BACKENDS)
def test_deploy_health_samples_record_and_teardown_twice_leave_nothing_running(name):
    declared = declaration(name)
    if (reason := declared.unavailable()) is not None:
        pytest.skip(f"{name} cannot run here: {reason}")
    with declared.example() as broker:
        spec = parse_spec({"name": f"conformance-{name}", "broker": broker})
        backend = declared.create()
        if isinstance(backend, MultiBroker):
            backend.prepare(spec.workload)
        if isinstance(backend, ConfiguresAccess):
            # as the engine does: an example may need a user (ejabberd's always does)
            backend.configure_access(run_access(spec))
        try:
            endpoint = backend.deploy(spec.broker.options(), LocalHost())
            assert isinstance(endpoint, Endpoint)
            assert backend.health() is None
            record = backend.deployment()
            assert isinstance(record, DeploymentRecord) and record.backend == name
            # what a run stores is JSON that validates back into the same record, also
            # through the run's record (core's view of it, the backend's fields kept)
            assert type(record).model_validate(record.model_dump(mode="json")) == record
            stored = RunRecord(broker=record.model_dump(mode="json")).stored()
            assert run_record(stored).broker.as_type(type(record)) == record
            if isinstance(backend, LocalProcesses):
                _fits_under_a_cpu_budget(name, backend, record)
            deadline = time.monotonic() + 5
            while not backend.resource_samples() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            backend.teardown()
        backend.teardown()   # a second teardown is a no-op, never an error
        record = backend.deployment()
        samples = backend.resource_samples()
        assert samples, f"{name} took no resource sample while it ran"
        assert all(s.cpu_percent >= 0 and s.rss_bytes >= 0 for s in samples)
        if record.pid is not None:
            if record.managed:
                assert not _alive(record.pid), f"{name} left its broker running"
                assert processes_in_group(record.pid) == []
            else:
                assert _alive(record.pid), f"{name} stopped a broker it did not start"
        assert backend.health() is not None   # torn down: no longer usable, and says so


@pytest.mark.integration
@pytest.mark.parametrize("name", BACKENDS)
def test_a_broker_killed_mid_run_fails_the_run_with_that_reason_and_keeps_its_events(
        inproc_controller, inproc_starts, updates, name):
    controller = inproc_controller
    declared = declaration(name)
    if (reason := declared.unavailable()) is not None:
        pytest.skip(f"{name} cannot run here: {reason}")
    with declared.example() as broker:
        spec = {"name": f"kill-{name}", "agents": {"count": 2}, "broker": broker,
                "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 200,
                             "messages": 1000, "warmup_messages": 0,
                             "qos": min(declared.features.qos)},
                "timing": {"heartbeat_timeout_s": 5.0, "upload_interval_s": 0.25}}
        campaign_id, thread, result = start_campaign(controller, spec)
        run_id = f"{campaign_id}-r0000"
        wait_until(lambda: RunState.RUNNING in updates.states(run_id), 60, "run to start")
        wait_until(lambda: sum(stored_rows(controller, run_id).values()) > 50, 15,
                 "some chunks")
        with controller.sessions() as s:
            from mqttbed.controller.db import RunRow

            deployed = run_record(s.get(RunRow, run_id).run_metadata, run_id).broker
        assert deployed is not None, f"{name}'s run recorded no deployment"
        assert deployed.pid is not None, f"{name}'s deployment record names no process"
        victim = psutil.Process(deployed.pid)
        victim.kill()
        thread.join(60)
        assert not thread.is_alive()

    run = only_run(controller, campaign_id)
    assert run.state == RunState.FAILED and result["status"] == "failed"
    assert "broker" in run.reason, run.reason
    if deployed.managed:
        assert f"(pid {victim.pid}) exited with code -9 (killed by SIGKILL)" in run.reason
    stored = sum(stored_rows(controller, run_id).values())
    assert stored > 50 and dataset_rows(controller, campaign_id, run_id) == stored
    assert child_processes("mqttbed.agents") == [] and inproc_starts.running() == []
    # threads wherever the agents run on this machine; processes in a backend's network
    assert bool(inproc_starts.in_process()) != isinstance(create_backend(name), OwnNetwork)
    assert not _alive(victim.pid) and os.getpid() != victim.pid
