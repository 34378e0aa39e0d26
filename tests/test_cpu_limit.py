"""``broker.cpu_limit``: a run's brokers under a real cgroup CPU quota on this machine.

A CPU-bound process tree under a 0.2-core budget gets 0.2 of a core, measured from /proc,
and its cgroup is gone afterwards; a real Mosquitto campaign runs with its broker inside
the run's cgroup and records the budget; specs that cannot have a budget are refused
before anything runs, naming ``broker.cpu_limit`` and why.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mqttbed.api.app import create_app
from mqttbed.api.report import render_report
from mqttbed.brokers import cpu_budget
from mqttbed.brokers.cpu_budget import (
    CgroupVersion,
    CpuBudget,
    CpuBudgetError,
    CpuBudgetRecord,
    find_cpu_controller,
    quota_files,
)
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow
from mqttbed.controller.documents import RunUpdate
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.backends import CPU_PERIOD_US, MIN_CPU_LIMIT
from mqttbed.core.errors import SpecError
from mqttbed.core.settings import Settings

NO_CGROUPS = cpu_budget.cpu_budget_unavailable()
needs_cgroups = pytest.mark.skipif(NO_CGROUPS is not None, reason=f"{NO_CGROUPS}")

BUDGET_CORES = 0.2
# What the tree may use, measured: the quota plus the measuring window's edges (a period
# that straddles the window's start or end adds up to one quota to a 2 s window).
MEASURED_CEILING_CORES = 0.3
WINDOW_S = 2.0

# A parent that forks a child, both spinning: the budget covers the whole tree.
SPINNING_TREE = ("import os\n"
                 "child = os.fork()\n"
                 "if child: print(child, flush=True)\n"
                 "while True: pass\n")
# Spins alone for a moment, then forks: the child is born after the tree was moved.
FORKS_LATER = ("import os, sys, time\n"
               "sys.stdin.readline()\n"
               "child = os.fork()\n"
               "if child: print(child, flush=True)\n"
               "time.sleep(60)\n")  # window: lives until the test kills it


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_cgroup_of(pid: int) -> str:
    """The cgroup ``pid`` is in under the CPU controller, as /proc/PID/cgroup says."""
    v1 = find_cpu_controller().version == CgroupVersion.V1
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "cpu" in controllers.split(",")) or (not v1 and controllers == ""):
            return path
    raise AssertionError(f"no cpu cgroup line for {pid}")


def relative(path: str) -> str:
    """A cgroup directory as /proc/PID/cgroup names it (relative to the mount)."""
    return "/" + str(Path(path).relative_to(find_cpu_controller().mount))


@pytest.fixture
def budget_name() -> str:
    return f"test-{secrets.token_hex(4)}"


@needs_cgroups
def test_a_cpu_bound_tree_under_a_0_2_core_budget_uses_at_most_0_3_of_a_core_and_its_cgroup_goes(
        budget_name):
    # its own session: the child it forks is killed with it (a spinning orphan took a core
    # from every later test of a CI run)
    tree = subprocess.Popen([sys.executable, "-c", SPINNING_TREE], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    budget = None
    try:
        child = int(tree.stdout.readline())
        budget = CpuBudget.create(budget_name, BUDGET_CORES)
        moved = budget.add("spinner", [tree.pid])
        assert sorted(moved) == sorted([tree.pid, child])
        assert sorted(budget.members("spinner")) == sorted([tree.pid, child])
        cgroup = budget.record().brokers["spinner"].path
        cpus = budget.record().brokers["spinner"].cpus
        if len(os.sched_getaffinity(0)) > 1:   # both spinners on one CPU, as on a small host
            assert cpus is not None and len(cpus) == 1
            assert os.sched_getaffinity(tree.pid) == os.sched_getaffinity(child) == set(cpus)
        assert cpu_cgroup_of(tree.pid) == cpu_cgroup_of(child) == relative(cgroup)

        before = time.monotonic(), cpu_seconds(tree.pid) + cpu_seconds(child)
        time.sleep(WINDOW_S)  # window: the CPU use is measured over it
        after = time.monotonic(), cpu_seconds(tree.pid) + cpu_seconds(child)
        used_cores = (after[1] - before[1]) / (after[0] - before[0])
        assert used_cores <= MEASURED_CEILING_CORES, used_cores

        record = budget.record()
        assert record.cores == BUDGET_CORES
        assert record.quota_us == round(BUDGET_CORES * CPU_PERIOD_US)
        # the quota, not the other work on this machine, is what held the tree back
        assert record.brokers["spinner"].throttled_periods > 0
        assert record.brokers["spinner"].throttled_s > 0
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
        if budget is not None:
            budget.remove()
    assert not Path(budget.path).exists()
    budget.remove()   # twice: a no-op


@needs_cgroups
def test_a_child_forked_after_the_move_is_born_under_the_budget(budget_name):
    parent = subprocess.Popen([sys.executable, "-c", FORKS_LATER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    budget = CpuBudget.create(budget_name, 0.5)
    try:
        assert budget.add("broker", [parent.pid]) == [parent.pid]
        parent.stdin.write("fork now\n")
        parent.stdin.flush()
        child = int(parent.stdout.readline())
        assert sorted(budget.members("broker")) == sorted([parent.pid, child])
        # confined to one CPU (half a core), the child born so as well
        cpus = budget.record().brokers["broker"].cpus
        assert cpus is not None and len(cpus) == 1 and cpus[0] in os.sched_getaffinity(0)
        assert os.sched_getaffinity(parent.pid) == os.sched_getaffinity(child) == set(cpus)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)   # the child too
        parent.wait()
        budget.remove()
    assert not budget.path.exists()


@needs_cgroups
def test_a_process_still_running_at_removal_is_moved_out_and_the_cgroup_removed(budget_name):
    sleeper = subprocess.Popen(["sleep", "30"])
    budget = CpuBudget.create(budget_name, 0.5)
    try:
        budget.add("broker", [sleeper.pid])
        budget.remove()
        assert not budget.path.exists()
        assert cpu_cgroup_of(sleeper.pid) == "/"
        assert sleeper.poll() is None   # moved out, never killed: stopping is the backend's
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_cgroups
def test_a_broker_process_that_is_gone_is_a_clear_error(budget_name):
    gone = subprocess.Popen(["true"])
    gone.wait()
    budget = CpuBudget.create(budget_name, 0.5)
    try:
        with pytest.raises(CpuBudgetError, match=rf"broker.cpu_limit: broker process "
                                                 rf"{gone.pid} is gone"):
            budget.add("broker", [gone.pid])
    finally:
        budget.remove()


@needs_cgroups
def test_a_dead_controllers_empty_cgroups_are_reaped_and_a_live_ones_are_left(budget_name):
    # a controller that died without removing its run's cgroup: its owner is gone (a
    # reaped child's pid; were the pid reused, start time 1 would still not match)
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = (find_cpu_controller().mount / cpu_budget.PARENT_NAME
            / f"{budget_name}-left.{dead.pid}-1")
    left.mkdir(parents=True)
    (left / "broker").mkdir()                    # its broker died with it: empty
    # a live controller's: one about to move its broker in (empty), one running it
    fresh = CpuBudget.create(f"{budget_name}-fresh", 0.5)
    busy = CpuBudget.create(f"{budget_name}-busy", 0.5)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        busy.add("broker", [sleeper.pid])
        assert cpu_budget.owner_alive(fresh.path.name) and not cpu_budget.owner_alive(left.name)
        removed = cpu_budget.reap_stale()
        assert str(left) in removed and not left.exists()
        assert fresh.path.is_dir(), "an empty cgroup of a live owner was removed"
        assert busy.path.exists() and busy.members("broker") == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
        busy.remove()
        fresh.remove()


# -- a real campaign --------------------------------------------------------------------

@pytest.mark.integration
@needs_cgroups
def test_a_mosquitto_campaign_under_cpu_limit_runs_its_broker_in_the_runs_cgroup_and_records_it(
        tmp_path):
    seen: dict[str, list[int]] = {}
    affinity: dict[int, set[int]] = {}

    def look_inside(document: object) -> None:
        # while the run measures: which processes the run's cgroups hold, on which CPUs
        if isinstance(document, RunUpdate) and document.state == "running":
            (run_dir,) = (find_cpu_controller().mount / cpu_budget.PARENT_NAME).glob(
                f"{document.run_id}.*")
            seen.update({cgroup.name: [int(p) for p in (cgroup / "cgroup.procs")
                                       .read_text().split()]
                         for cgroup in run_dir.iterdir() if cgroup.is_dir()})
            affinity.update({pid: os.sched_getaffinity(pid)
                             for pids in seen.values() for pid in pids})

    spec = parse_spec({"name": "cpu-limit", "broker": {"backend": "mosquitto",
                                                       "cpu_limit": 0.25},
                       "workload": {"publishers": 1, "subscribers": 1, "rate_hz": 100,
                                    "messages": 100, "warmup_messages": 0}})
    with create_controller(Settings(data_dir=tmp_path / "data"),
                           listeners=[look_inside]) as controller:
        campaign_id = controller.engine.create_campaign(spec)
        assert controller.engine.run_campaign(campaign_id) == "done"
        run_id = f"{campaign_id}-r0000"
        with controller.sessions() as s:
            metadata = s.get(RunRow, run_id).run_metadata
        stored = json.loads((controller.layout.run_dir(campaign_id, run_id) / "run.json")
                            .read_text())["metadata"]
        report = render_report(controller, campaign_id, standalone=False)

    broker_pid = metadata["broker"]["pid"]
    assert seen == {"mosquitto": [broker_pid]}, "the broker ran inside the run's cgroup"
    record = CpuBudgetRecord.model_validate(metadata["cpu_budget"])
    assert stored["cpu_budget"] == metadata["cpu_budget"]
    assert record.cores == 0.25 and record.quota_us == round(0.25 * CPU_PERIOD_US)
    assert record.mechanism == find_cpu_controller().version
    assert Path(record.path) == (find_cpu_controller().mount / cpu_budget.PARENT_NAME
                                 / f"{run_id}.{cpu_budget.owner_tag(os.getpid())}")
    assert record.brokers["mosquitto"].pids == [broker_pid]
    assert record.brokers["mosquitto"].periods is not None
    if len(os.sched_getaffinity(0)) > 1:
        assert affinity == {broker_pid: set(record.brokers["mosquitto"].cpus or [])}
        assert len(record.brokers["mosquitto"].cpus or []) == 1
    assert not Path(record.path).exists(), "the run's cgroup is removed at teardown"
    budget = record.brokers["mosquitto"]
    assert (f"0.25 cores per broker ({record.mechanism}): mosquitto throttled in "
            f"{budget.throttled_periods} of {budget.periods} periods") in report
    if budget.cpus:
        assert f"s), on CPU {budget.cpus[0]}" in report


@pytest.mark.parametrize("cores, index, allowed, cpus", [
    (0.05, 0, [0, 1], [0]),            # under a core: one CPU
    (0.05, 1, [0, 1], [1]),            # the run's next broker: the next CPU
    (0.05, 2, [0, 1], [0]),            # round-robin
    (1.0, 0, [0, 1, 2, 3], [0]),
    (1.5, 1, [0, 1, 2, 3], [2, 3]),    # ceil(cores) CPUs each
    (1.5, 0, [0, 1], None),            # as many as there are: not confined
    (0.5, 0, [3], None),
    (0.25, 3, [2, 5, 7], [2]),         # the controller's own set, not 0..n
])
def test_a_budget_confines_each_broker_to_ceil_cores_cpus_round_robin(cores, index, allowed,
                                                                      cpus):
    assert cpu_budget.cpus_for(cores, index, allowed) == cpus


# -- refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("broker, says", [
    ({"backend": "external", "url": "mqtt://127.0.0.1:1883", "cpu_limit": 0.25},
     "backend external starts no broker process on this machine"),
    ({"backend": "mosquitto", "host": "pi-1", "cpu_limit": 0.25},
     "the broker runs on lab host 'pi-1'"),
    ({"cpu_limit": 0}, "bad value 0: cores must be at least"),
    ({"cpu_limit": -0.5}, "bad value -0.5: cores must be at least"),
    ({"cpu_limit": MIN_CPU_LIMIT / 2}, f"cores must be at least {MIN_CPU_LIMIT}"),
    ({"cpu_limit": "half"}, "bad value 'half'"),
])
def test_a_spec_asking_a_budget_it_cannot_have_is_refused_naming_the_field(broker, says):
    with pytest.raises(SpecError) as refused:
        parse_spec({"name": "refused", "broker": broker})
    assert "broker.cpu_limit" in str(refused.value) and says in str(refused.value)


def test_cpu_limit_is_no_backend_option_and_sweeps_like_one():
    spec = parse_spec({"name": "sweep", "broker": {"cpu_limit": 0.5},
                       "sweep": {"broker.cpu_limit": [0.25, 1.0]}})
    assert "cpu_limit" not in spec.broker.options().model_dump()
    from mqttbed.campaigns.spec import expand_points

    assert [p.spec.broker.cpu_limit for p in expand_points(spec)] == [0.25, 1.0]
    assert parse_spec({"name": "none"}).broker.cpu_limit is None


def without_cpu_controller(tmp_path: Path) -> Path:
    """This machine's mountinfo with every cgroup mount offering 'cpu' left out."""
    kept = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if not (" - cgroup" in line and ("cpu" in line.split(" - ")[1].split()[2]
                                            .split(",") or "cgroup2" in line))]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(kept) + "\n")
    return path


def test_a_host_without_a_cgroup_cpu_controller_is_a_clear_error(tmp_path):
    with pytest.raises(CpuBudgetError, match="broker.cpu_limit needs the kernel's cgroup CPU "
                                             "controller, and none is mounted here"):
        find_cpu_controller(without_cpu_controller(tmp_path))


def test_without_cgroups_a_campaign_asking_a_budget_is_refused_before_any_run(
        controller, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_budget, "MOUNTINFO", without_cpu_controller(tmp_path))
    spec = parse_spec({"name": "no-cgroups", "broker": {"cpu_limit": 0.25}})
    with pytest.raises(SpecError, match="broker.cpu_limit needs the kernel's cgroup CPU"):
        controller.engine.create_campaign(spec)
    with controller.sessions() as s:
        assert s.query(RunRow).count() == 0


def test_cgroup_v2_is_taken_where_the_unified_hierarchy_offers_cpu(tmp_path):
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 / {unified} rw,relatime - cgroup2 cgroup2 rw\n"
                         "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpuacct\n")
    found = find_cpu_controller(mountinfo)
    assert found.version == CgroupVersion.V2 and found.mount == unified
    assert quota_files(CgroupVersion.V2, 0.25) == {"cpu.max": f"25000 {CPU_PERIOD_US}"}
    assert quota_files(CgroupVersion.V1, 0.25) == {"cpu.cfs_period_us": str(CPU_PERIOD_US),
                                                   "cpu.cfs_quota_us": "25000"}


def test_without_cgroups_the_api_answers_422_naming_broker_cpu_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_budget, "MOUNTINFO", without_cpu_controller(tmp_path))
    app = create_app(Settings(data_dir=tmp_path / "data"), "http://127.0.0.1:9",
                     run_campaigns=False)
    token = create_token(app.state.controller.sessions, "u", TokenRole.USER)
    with TestClient(app) as client:
        response = client.post("/api/v1/campaigns",
                               content="name: budget\nbroker: {cpu_limit: 0.25}\n",
                               headers={"authorization": f"Bearer {token}",
                                        "content-type": "application/yaml"})
    assert response.status_code == 422
    assert "broker.cpu_limit needs the kernel's cgroup CPU" in response.json()["detail"]
