"""Shared fixtures: a controller on a temporary data dir, one Spark session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
import pytest

from mqttbed.agents.deploy import Agents, Site
from mqttbed.controller.controller import Controller, create_controller
from mqttbed.controller.documents import CampaignUpdate, Document, RunUpdate
from mqttbed.core.procfs import with_environment
from mqttbed.core.settings import Settings

if TYPE_CHECKING:
    from mqttbed.agents.in_process import InProcessAgents

T = TypeVar("T")

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The warm-up analysis of a fresh session (controller/analysis_warm_up.py) is tested by
# itself; beside two test workers it held a served controller's first run 170-210 s.
os.environ.setdefault("MQTTBED_SPARK_WARM_UP", "0")
# Likewise each run's own analysis between runs (controller.lifecycle.RunAnalyses): tested
# by itself, it would add a Spark analysis to every run of every campaign test.
os.environ.setdefault("MQTTBED_ANALYSIS_PER_RUN", "0")
# Every JVM a test starts (its worker's session, each command's and controller's) lives
# for a few analyses of a few thousand events: the JIT's quick tier alone saves a third of
# each JVM's CPU (Settings.spark_quick_jit), on a machine whose two cores the tests share.
os.environ.setdefault("MQTTBED_SPARK_QUICK_JIT", "1")


# Fixtures that start a real component: every test using one is an integration test
# (`pytest -m "not integration"` is the fast unit run), marked here so none is forgotten.
REAL_FIXTURES = {"spark": "Spark", "served": "Mosquitto, agent processes and Spark",
                 "postgres": "PostgreSQL"}


# Session fixtures that run a whole campaign (with Spark's start) before their first user.
SESSION_CAMPAIGNS = {"served"}
SESSION_CAMPAIGN_TIMEOUT_S = 480


# make test deals its tests to pytest-xdist's workers by group (`--dist loadgroup`), and
# a test of no group is given its module's: a module's tests then run on one worker, whose
# module fixtures (a dataset and its analysis, campaigns) are made once, not once on each
# worker some of its tests were dealt to (`--dist load`). A named group (tests of several
# modules sharing a per-process fixture) wins. The system tests keep test-by-test dealing:
# their modules hold long tests that are better spread over the workers.
@pytest.hookimpl(tryfirst=True)   # before pytest-xdist names each test by its group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (item.get_closest_marker("system") is None
                and item.get_closest_marker("xdist_group") is None):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        if REAL_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        # A session fixture is set up within the timeout of whichever of its users runs
        # first, and which one that is depends on the order (and, with pytest-xdist, on the
        # worker): every user of one that runs a campaign gets the time its setup needs.
        if (SESSION_CAMPAIGNS & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("timeout") is None):
            item.add_marker(pytest.mark.timeout(SESSION_CAMPAIGN_TIMEOUT_S))


class UpdateLog(list[Document]):
    """Every document the controller emitted, in order."""

    def states(self, run_id: str) -> list[str]:
        """The states ``run_id`` went through."""
        return [u.state for u in self if isinstance(u, RunUpdate) and u.run_id == run_id]

    def statuses(self, campaign_id: str) -> list[str]:
        """The statuses ``campaign_id`` went through."""
        return [u.status for u in self
                if isinstance(u, CampaignUpdate) and u.campaign_id == campaign_id]


@pytest.fixture
def updates() -> UpdateLog:
    return UpdateLog()


@pytest.fixture
def controller(request, tmp_path, updates) -> Iterator[Controller]:
    """A started controller serving its agent routes itself, as in ``mqttbed run``; on
    SQLite in its data dir, or, in a test that asks for ``db_url`` too, on that database
    (SQLite and PostgreSQL in turn)."""
    database = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else None
    with create_controller(Settings(data_dir=tmp_path / "data", database_url=database),
                           listeners=[updates.append]) as ctl:
        yield ctl


class InProcessStarts:
    """The ``start_agents`` of an in-process controller: every run's agents on threads
    (``mqttbed.agents.in_process``), each pool kept to check that no thread outlives it."""

    def __init__(self) -> None:
        self.pools: list[Agents] = []

    def __call__(self, sites: list[Site], controller_url: str, token: str, run_id: str,
                 log_dir: Path, *, gpio: str, gpio_chip: str,
                 env: dict[str, str] | None) -> Agents:
        from mqttbed.agents.in_process import start_agents  # the agent program: lazily

        pool = start_agents(sites, controller_url, token, run_id, log_dir, gpio=gpio,
                            gpio_chip=gpio_chip, env=env)
        self.pools.append(pool)
        return pool

    def in_process(self) -> list[InProcessAgents]:
        """The pools that ran on threads (others were sites a thread cannot stand in for)."""
        from mqttbed.agents.in_process import InProcessAgents

        return [pool for pool in self.pools if isinstance(pool, InProcessAgents)]

    def running(self) -> list[str]:
        """Agent threads of every pool still running."""
        return [thread for pool in self.in_process() for thread in pool.running()]


@pytest.fixture
def inproc_starts() -> InProcessStarts:
    """How ``inproc_controller`` started each run's agents (its pools, their threads)."""
    return InProcessStarts()


@pytest.fixture
def inproc_controller(request, tmp_path, updates, inproc_starts) -> Iterator[Controller]:
    """The ``controller`` fixture with each run's local agents on threads of the test
    process instead of agent processes: the same agent program, registration, token and
    HTTP routes, without an interpreter start per agent per run. For tests of the engine
    where the process adds nothing; agent loss, resources, GPIO, timing, remote agents
    keep ``controller``. ``inproc_starts`` says which runs ran on threads; no agent
    thread outlives the test."""
    database = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else None
    with create_controller(Settings(data_dir=tmp_path / "data", database_url=database),
                           listeners=[updates.append], start_agents=inproc_starts) as ctl:
        yield ctl
    assert inproc_starts.running() == [], \
        f"agent threads outlived their runs: {inproc_starts.running()}"


@pytest.fixture
def broker():
    """A Mosquitto on this machine for one test: its endpoint (test modules of other
    brokers define their own ``broker``)."""
    from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
    from mqttbed.core.host import LocalHost

    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    yield endpoint
    backend.teardown()


@pytest.fixture(scope="session")
def postgres():
    """One private PostgreSQL cluster for the whole session (tests/postgres_cluster.py),
    started on first use, stopped and deleted at the end: never a running service."""
    from tests.postgres_cluster import temporary_cluster

    cluster = temporary_cluster()
    yield cluster
    cluster.remove()


DATABASES = ["sqlite", pytest.param("postgresql", marks=[pytest.mark.integration,
                                                       pytest.mark.postgres])]


@pytest.fixture(params=DATABASES)
def db_url(request, tmp_path, monkeypatch) -> Iterator[str]:
    """The controller's database, once on SQLite (the default, in the data dir) and once
    on a fresh database of the session's PostgreSQL; ``MQTTBED_DATABASE_URL`` is set to
    it, so a controller, the CLI and ``Settings`` in the test all use it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'mqttbed.sqlite'}"
        monkeypatch.setenv("MQTTBED_DATABASE_URL", url)
        yield url
        return
    cluster = request.getfixturevalue("postgres")
    url = cluster.create_database()
    monkeypatch.setenv("MQTTBED_DATABASE_URL", url)
    yield url
    cluster.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session", autouse=True)
def kernel_receive_stamps_on() -> Iterator[None]:
    """Linux stamps received packets only while some socket wants it, and the first socket
    to ask turns stamping on through a deferred work item (net_enable_timestamp): TCP data
    that arrives in between comes with no stamp (measured: the first read after enabling
    was unstamped in 17 of 30 tries with no other stamping socket open). A test asserting
    that every delivery has its kernel stamp would fail whenever it happened to be that
    first socket (seen in tests/test_mqtt_tcp.py). So one socket asks for the whole
    session, and the session starts once a TCP read of its comes back stamped."""
    import socket

    from mqttbed.agents import rx_timestamps

    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()) as sender:
        receiver, _ = listener.accept()
        with receiver:
            if rx_timestamps.enable(receiver):
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline:
                    sender.sendall(b"x")
                    _data, ancillary, _flags, _addr = receiver.recvmsg(
                        16, rx_timestamps.ANCILLARY_BYTES)
                    if rx_timestamps.realtime_ns(ancillary) is not None:
                        break
                    time.sleep(0.001)
            yield


@pytest.fixture(scope="session")
def spark():
    from mqttbed.analytics.spark import get_spark, stop_spark

    session = get_spark()
    yield session
    stop_spark()


def eventually(check: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    """Poll ``check`` until it holds or ``timeout_s`` passes; return its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def terminate(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """SIGTERM ``proc``, SIGKILL it if it has not ended within ``wait_s``; reap it."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(wait_s)


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               poll_s: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something true, and return that; fail naming
    ``what`` (what did not happen) once ``timeout_s`` has passed without it.

    A test waits on the thing it needs to have happened (a subscription in place, a chunk
    stored, a sample taken, a process gone), never for a fixed time: a sleep is too short
    on a loaded machine and wasted on a quiet one. Fixed windows that check that something
    does *not* happen carry a ``# window: <why>`` comment instead (tests/test_test_hygiene.py).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def child_processes(name_part: str) -> list[psutil.Process]:
    """Descendants of this test process whose command line contains ``name_part``."""
    return processes_mentioning(name_part, psutil.Process().children(recursive=True))


def processes_mentioning(name_part: str, among: Iterable[psutil.Process] | None = None,
                         ) -> list[psutil.Process]:
    """Live processes (``among``, default: all on the machine, orphans included) whose
    command line contains ``name_part``."""
    found = []
    for proc in psutil.process_iter() if among is None else among:
        try:
            if name_part in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


TEST_TAG = "MQTTBED_TEST_TAG"


def processes_tagged(tag: str) -> set[int]:
    """Live processes (orphans included, zombies not) started with ``MQTTBED_TEST_TAG=tag``
    in their environment: everything a CLI run with that tag spawned inherits it, so a
    check for leftovers sees only that run's processes, not those of other work on the
    machine."""
    # procfs reads a process in the middle of an execve again (its environment reads as
    # empty then): a check for leftovers must not miss one that is just starting
    return set(with_environment(f"{TEST_TAG}={tag}"))


def run_tagged(argv: list[str], tag: str, *, timeout_s: float = 300,
               env: dict[str, str] | None = None,
               ) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``argv`` to completion with ``MQTTBED_TEST_TAG=tag``; return it and the command
    lines of the tagged processes seen while it ran (sampled every 0.5 s), so a test can
    check both that its processes were found by the tag and that none is left after."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {}), TEST_TAG: tag})
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in processes_tagged(tag):
            with contextlib.suppress(psutil.Error):
                seen.add(" ".join(psutil.Process(pid).cmdline()))
        try:
            out, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                proc.kill()
                out, err = proc.communicate()
                raise AssertionError(f"{argv} ran past {timeout_s} s: {err[-3000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), seen


class Served:
    """A running ``mqttbed serve`` equivalent: the full app on a real socket."""

    def __init__(self, data_dir, run_campaigns: bool = True, secrets_dir=None):
        from mqttbed.api.app import create_app
        from mqttbed.controller.embedded import BackgroundServer, bind_socket
        from mqttbed.controller.tokens import TokenRole, create_token

        sock = bind_socket("127.0.0.1", 0)
        host, port = sock.getsockname()
        self.url = f"http://{host}:{port}"
        self.updates = UpdateLog()  # every document its controller emits
        # Tests present wrong tokens on purpose, all from 127.0.0.1, to one session-wide
        # server: the per-address limit (its own tests: test_tokens.py) must not trip here.
        settings = Settings(data_dir=data_dir, auth_failures_per_minute=100_000,
                            secrets_dir=secrets_dir)
        self.controller = create_controller(settings, controller_url=self.url,
                                            listeners=[self.updates.append])
        self.app = create_app(self.controller, run_campaigns=run_campaigns)
        self.user_token = create_token(self.controller.sessions, "tester", TokenRole.USER)
        self.agent_token = create_token(self.controller.sessions, "pi-1", TokenRole.AGENT)
        self.server = BackgroundServer(self.app, sock)

    def client(self, token: str | None = "user"):
        import httpx

        headers = {}
        if token is not None:
            value = {"user": self.user_token, "agent": self.agent_token}.get(token, token)
            headers["authorization"] = f"Bearer {value}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def start_yaml_campaign(self, spec_yaml: str) -> str:
        """Create a campaign from a YAML spec over REST and start it; return its id."""
        with self.client() as http:
            created = http.post("/api/v1/campaigns", content=spec_yaml,
                                headers={"content-type": "application/yaml"})
            assert created.status_code == 201, created.text
            campaign_id: str = created.json()["id"]
            assert http.post(f"/api/v1/campaigns/{campaign_id}/start").status_code == 200
        return campaign_id

    def wait_for_status(self, campaign_id: str, statuses: tuple[str, ...], timeout_s: float,
                        seen: list[str] | None = None, poll_s: float = 0.25):
        """Poll the campaign until its status is one of ``statuses``; return it.

        Statuses pass queued, running and analysing (the statistics) on the way to done,
        failed or cancelled; ending in another status than asked fails at once. ``seen``
        collects the statuses read, in order, each once.
        """
        deadline = time.monotonic() + timeout_s
        with self.client() as http:
            while True:
                campaign = http.get(f"/api/v1/campaigns/{campaign_id}").json()
                if seen is not None and (not seen or seen[-1] != campaign["status"]):
                    seen.append(campaign["status"])
                if campaign["status"] in statuses:
                    return campaign
                assert campaign["status"] not in ("done", "failed", "cancelled"), \
                    f"campaign ended {campaign['status']}, not {statuses}: {campaign}"
                assert time.monotonic() < deadline, f"campaign stuck: {campaign}"
                time.sleep(poll_s)


FINISHED_SPEC = """
name: api-e2e
workload: {publishers: 1, subscribers: 3, rate_hz: 200, messages: 100, warmup_messages: 10}
sweep: {workload.subscribers: [2, 4]}
repetitions: 1
agents: {count: 2}
"""


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """The full app, serving, with one campaign submitted over REST and run to the end."""
    served = Served(tmp_path_factory.mktemp("served"))
    with served.server:
        campaign_id = served.start_yaml_campaign(FINISHED_SPEC)
        # Its first user's timeout covers this (SESSION_CAMPAIGNS): with Spark not yet
        # started in the process it took 70 s on a loaded 2-core machine, and more than
        # 200 s in one clean-clone CI run while the RTL build ran beside the tests (its
        # JVM is niced as the RTL build is, and the test workers are not): a wait for
        # the setup, not a figure, so it is bounded generously.
        served.finished = served.wait_for_status(campaign_id, ("done",), 420)
        yield served
