"""CPU budgets for brokers: a run's broker processes under a cgroup CPU quota.

``broker.cpu_limit: 0.25`` gives each broker of a run a quarter of one core, as if it ran
on a small host of its own, while the agents and the controller share the rest of this
machine. A run gets one cgroup, ``<cpu controller>/mqttbed/<run id>.<pid>-<start>`` (the
run id holds the campaign's; pid and start time name the process that made it, its
owner), with one child per broker the backend started (``LocalProcesses``), each
under the quota: a backend deploying several brokers (mqtt-st) gets one budget per
broker, as on the paper's separate machines. A broker's processes and their children are
moved in once it is deployed; whatever they fork later is born inside.

The kernel's CPU controller is found in ``/proc/self/mountinfo``: cgroup v2's ``cpu.max``
where the unified hierarchy has the ``cpu`` controller, else cgroup v1's
``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``. The quota is enforced per period (100 ms):
a broker that used its share waits for the next period, which ``cpu.stat`` counts as a
throttled period; the run records those counts, so a saturated broker is visible.

A budget of less than a core also confines the broker to one CPU (its processes' affinity;
``ceil(cores)`` CPUs in general), as on the small host it stands for. Left to spread over
CPUs, a broker of several processes (fork/pipe, MQTT-ST's trees, a threaded broker) is
throttled long before it has used its quota: the kernel hands quota to each CPU in slices
(``sched_cfs_bandwidth_slice_us``, 5 ms), so at 0.05 cores (5 ms a period) the first CPU
takes the whole period's quota and the broker's processes on the other CPU wait for the
next period. Measured here, fork/pipe at 0.05 cores and 120 msg/s to 10 subscribers:
throttled in 30 of 76 periods (1.77 s) spread over two CPUs, 11 of 76 (0.13 s) on one.
Brokers of one run get different CPUs where there are enough (round-robin).

A controller that starts removes the empty run cgroups of controllers that died
(:func:`reap_stale`). Whose a cgroup is, is in its name: one whose owner still runs is
never touched, though it may be empty for seconds, between its creation and the moment
its broker is deployed and moved in (another controller on this machine, or a parallel
test, was removing such a cgroup under a run that was about to use it).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from mqttbed.core import procfs
from mqttbed.core.backends import CPU_PERIOD_US as PERIOD_US
from mqttbed.core.backends import check_cpu_limit
from mqttbed.core.errors import MqttbedError
from mqttbed.core.run_record import BrokerBudget, CgroupVersion, CpuBudgetRecord

MOUNTINFO = Path("/proc/self/mountinfo")
PARENT_NAME = "mqttbed"          # every run's cgroup is below this one
# A tree that forks while it is moved is listed again; a broker settles within a few.
MOVE_ATTEMPTS = 20
# An exiting process leaves its cgroup a moment after it was reaped.
REMOVE_TIMEOUT_S = 2.0
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_OWNER = re.compile(r"\.(\d+)-(\d+)$")   # <name>.<pid>-<start time>: who made the cgroup


class CpuBudgetError(MqttbedError):
    """No CPU budget can be set here, or one could not be applied; the message says why."""


@dataclass(frozen=True)
class CpuController:
    """Where the kernel's CPU controller is mounted, and which version it is."""

    version: CgroupVersion
    mount: Path


def quota_files(version: CgroupVersion, cores: float) -> dict[str, str]:
    """The files that limit a cgroup to ``cores`` and what each gets, in writing order."""
    check_cpu_limit(cores)
    quota_us = round(cores * PERIOD_US)
    if version == CgroupVersion.V2:
        return {"cpu.max": f"{quota_us} {PERIOD_US}"}
    return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota_us)}


def find_cpu_controller(mountinfo: Path | None = None) -> CpuController:
    """The CPU controller this process can create cgroups in; CpuBudgetError if none.

    cgroup v2 is taken where its unified hierarchy offers ``cpu`` (a v2-only host, or a
    hybrid one that moved ``cpu`` there), else the v1 hierarchy mounted with ``cpu``.
    """
    mountinfo = mountinfo or MOUNTINFO
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError as exc:
        raise CpuBudgetError(f"broker.cpu_limit needs cgroups, and {mountinfo} cannot be "
                             f"read: {exc}") from None
    v1: Path | None = None
    v2: Path | None = None
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2" and "cpu" in _controllers(mount):
            v2 = mount
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            v1 = mount
    if v2 is not None:
        found = CpuController(CgroupVersion.V2, v2)
    elif v1 is not None:
        found = CpuController(CgroupVersion.V1, v1)
    else:
        raise CpuBudgetError("broker.cpu_limit needs the kernel's cgroup CPU controller, and "
                             "none is mounted here (no cgroup2 hierarchy offering 'cpu', no "
                             "cgroup v1 hierarchy mounted with 'cpu', per "
                             f"{mountinfo}); leave broker.cpu_limit out, or run on a host "
                             "with cgroups (a container needs them mounted read-write)")
    if not os.access(found.mount, os.W_OK):
        raise CpuBudgetError(f"broker.cpu_limit: the cgroup CPU controller at {found.mount} "
                             f"({found.version}) is not writable by uid {os.geteuid()}; run "
                             "the controller as root, or leave broker.cpu_limit out")
    return found


def cpu_budget_unavailable() -> str | None:
    """Why no CPU budget can be set on this machine, or None."""
    try:
        find_cpu_controller()
    except CpuBudgetError as exc:
        return str(exc)
    return None


def _controllers(mount: Path) -> list[str]:
    try:
        return (mount / "cgroup.controllers").read_text().split()
    except OSError:
        return []


class CpuBudget:
    """One run's cgroup: a child per broker, each limited to ``cores``.

    :meth:`create`, then :meth:`add` each broker's process trees, :meth:`record` (the
    throttle counts are read then), :meth:`remove` at teardown (safe to call twice).
    """

    def __init__(self, controller: CpuController, path: Path, cores: float):
        self.controller = controller
        self.path = path
        self.cores = cores
        self._brokers: dict[str, list[int]] = {}
        self._cpus: dict[str, list[int] | None] = {}
        self.removed = False

    @classmethod
    def create(cls, name: str, cores: float,
               controller: CpuController | None = None) -> CpuBudget:
        """Make the run's cgroup ``mqttbed/<name>.<owner>`` in the CPU controller (found if
        None); this process is its owner."""
        check_cpu_limit(cores)
        controller = controller or find_cpu_controller()
        parent = controller.mount / PARENT_NAME
        try:
            parent.mkdir(exist_ok=True)
            if controller.version == CgroupVersion.V2:
                # v2 hands a controller down one level at a time
                _enable_cpu(controller.mount)
                _enable_cpu(parent)
            path = parent / f"{_SAFE_NAME.sub('_', name)}.{owner_tag(os.getpid())}"
            path.mkdir()
            if controller.version == CgroupVersion.V2:
                _enable_cpu(path)
        except OSError as exc:
            raise CpuBudgetError(f"broker.cpu_limit: cannot create a cgroup under {parent} "
                                 f"({controller.version}): {exc}") from None
        return cls(controller, path, cores)

    def add(self, broker: str, roots: list[int]) -> list[int]:
        """Move each root pid and all its descendants into ``broker``'s cgroup (made here,
        under the quota); return the pids moved. CpuBudgetError if a root is gone."""
        cgroup = self.path / _SAFE_NAME.sub("_", broker)
        try:
            cgroup.mkdir(exist_ok=True)
            for file, value in quota_files(self.controller.version, self.cores).items():
                (cgroup / file).write_text(value)
        except OSError as exc:
            raise CpuBudgetError(f"broker.cpu_limit {self.cores}: cannot set the quota of "
                                 f"{cgroup}: {exc}") from None
        moved: list[int] = []
        for root in roots:
            moved += [pid for pid in _move_tree(cgroup, root) if pid not in moved]
        cpus = cpus_for(self.cores, len(self._brokers), sorted(os.sched_getaffinity(0)))
        if cpus is not None:
            for pid in moved:
                _pin(pid, cpus)
        self._brokers[broker] = moved
        self._cpus[broker] = cpus
        return moved

    def members(self, broker: str) -> list[int]:
        """The processes in ``broker``'s cgroup now."""
        return _members(self.path / _SAFE_NAME.sub("_", broker))

    def record(self) -> CpuBudgetRecord:
        """What this budget is, with each broker's throttle counts so far."""
        brokers = {}
        for broker, pids in self._brokers.items():
            cgroup = self.path / _SAFE_NAME.sub("_", broker)
            stat = _cpu_stat(cgroup)
            throttled_ns = (stat["throttled_time"] if "throttled_time" in stat
                            else stat["throttled_usec"] * 1000 if "throttled_usec" in stat
                            else None)
            brokers[broker] = BrokerBudget(
                path=str(cgroup), pids=pids, periods=stat.get("nr_periods"),
                throttled_periods=stat.get("nr_throttled"),
                throttled_s=None if throttled_ns is None else throttled_ns / 1e9,
                cpus=self._cpus.get(broker))
        return CpuBudgetRecord(cores=self.cores, mechanism=self.controller.version,
                               period_us=PERIOD_US, quota_us=round(self.cores * PERIOD_US),
                               path=str(self.path), brokers=brokers)

    def remove(self) -> None:
        """Move out whatever is left (to the controller's root cgroup), then delete the
        run's cgroups. Raises CpuBudgetError if one stays busy."""
        if self.removed:
            return
        children = [p for p in self.path.iterdir() if p.is_dir()] if self.path.exists() else []
        for cgroup in [*children, self.path]:
            _empty_and_remove(cgroup, self.controller.mount)
        self.removed = True


def cpus_for(cores: float, index: int, allowed: list[int]) -> list[int] | None:
    """The CPUs the ``index``-th broker of a run with ``cores`` each is confined to:
    ``ceil(cores)`` of ``allowed``, round-robin over the brokers; None (no confinement)
    when that is all of them."""
    wanted = math.ceil(cores)
    if wanted >= len(allowed):
        return None
    start = index * wanted
    return sorted(allowed[(start + i) % len(allowed)] for i in range(wanted))


def _pin(pid: int, cpus: list[int]) -> None:
    """Confine every thread of ``pid`` to ``cpus`` (threads and processes it starts later
    inherit it); a process or thread that is gone meanwhile is skipped."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue
        except OSError as exc:
            raise CpuBudgetError(f"broker.cpu_limit: cannot confine process {pid} (thread "
                                 f"{tid}) to CPUs {cpus}: {exc}") from None


def _enable_cpu(cgroup: Path) -> None:
    """Let ``cgroup``'s children use the cpu controller (cgroup v2)."""
    control = cgroup / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def _members(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _write_pid(cgroup: Path, pid: int) -> bool:
    """Move process ``pid`` (all its threads) into ``cgroup``; False if it is gone."""
    try:
        # one write per pid: the kernel takes one pid per write(2)
        (cgroup / "cgroup.procs").write_text(str(pid))
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return False
        raise CpuBudgetError(f"broker.cpu_limit: cannot move process {pid} into {cgroup}: "
                             f"{exc}") from None
    return True


def _move_tree(cgroup: Path, root_pid: int) -> list[int]:
    """Move ``root_pid`` and its descendants into ``cgroup`` until none is left outside
    (a child forked meanwhile is listed on the next pass); return the tree's pids."""
    try:
        root = psutil.Process(root_pid)
    except psutil.NoSuchProcess:
        raise CpuBudgetError(f"broker.cpu_limit: broker process {root_pid} is gone; it "
                             "cannot be put under a CPU budget") from None
    for _ in range(MOVE_ATTEMPTS):
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            raise CpuBudgetError(f"broker.cpu_limit: broker process {root_pid} exited while "
                                 "it was moved under its CPU budget") from None
        inside = set(_members(cgroup))
        outside = [p.pid for p in tree if p.pid not in inside]
        if not outside:
            return [p.pid for p in tree]
        for pid in outside:
            _write_pid(cgroup, pid)
    raise CpuBudgetError(f"broker.cpu_limit: the process tree of {root_pid} kept forking "
                         f"while it was moved into {cgroup} ({MOVE_ATTEMPTS} passes)")


def _cpu_stat(cgroup: Path) -> dict[str, int]:
    try:
        text = (cgroup / "cpu.stat").read_text()
    except OSError:
        return {}
    stat = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            stat[key] = int(value)
    return stat


def _empty_and_remove(cgroup: Path, root: Path) -> None:
    """Move ``cgroup``'s processes to ``root``, then remove it (waiting for exiting ones)."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        for pid in _members(cgroup):
            _write_pid(root, pid)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CpuBudgetError(f"cannot remove the CPU budget's cgroup {cgroup}: "
                                     f"{exc}; processes still in it: "
                                     f"{_members(cgroup) or 'none listed'}") from None
            time.sleep(0.02)


def owner_tag(pid: int) -> str:
    """``pid`` as the owner part of a cgroup's name: pid and start time, so a later process
    that got the same pid is not taken for the owner."""
    return f"{pid}-{procfs.start_time(pid)}"


def owner_alive(cgroup_name: str) -> bool:
    """Whether the process that made the cgroup of this name still runs (False for a name
    with no owner: a cgroup made before cgroups were named by their owner)."""
    found = _OWNER.search(cgroup_name)
    if found is None:
        return False
    pid = int(found[1])
    return procfs.is_live(pid) and procfs.start_time(pid) == int(found[2])


def reap_stale(controller: CpuController | None = None) -> list[str]:
    """Remove the run cgroups a controller that died left behind (their brokers died with
    it, so they are empty). One whose owner still runs is left alone, as is a busy one.
    Return the paths removed."""
    try:
        controller = controller or find_cpu_controller()
    except CpuBudgetError:
        return []
    removed = []
    parent = controller.mount / PARENT_NAME
    for run in sorted(parent.iterdir()) if parent.is_dir() else []:
        if not run.is_dir() or owner_alive(run.name):
            continue
        try:
            for child in [p for p in run.iterdir() if p.is_dir()]:
                child.rmdir()
            run.rmdir()
        except OSError:
            continue  # busy: a broker still runs in it (another controller's run)
        removed.append(str(run))
    return removed
