"""The controller itself fails: killed with SIGKILL, or stopped with SIGTERM, mid-run.

Real ``mqttbed serve`` processes on loopback over one temporary data dir, real Mosquitto,
real local agents. What each controller started is read from its process journal
(``DATA/processes/TAG.json``, :mod:`mqttbed.core.process_journal`): every check that
nothing is left is scoped to those process groups and that tag, never machine-wide.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mqttbed.agents.main import EXIT_CONTROLLER_LOST
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow, database_url, open_database
from mqttbed.controller.states import CampaignStatus
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.process_journal import JOURNAL_SUBDIR, reap_stale, tagged_processes
from mqttbed.core.settings import Settings
from tests.conftest import wait_until

CLI = str(Path(sys.executable).parent / "mqttbed")
HEARTBEAT_TIMEOUT_S = 2.0
MESSAGES, RATE_HZ = 300, 100  # a 3 s window: long enough to be caught running

SPEC = f"""
name: controller-faults
broker: {{backend: mosquitto}}
workload: {{publishers: 1, subscribers: 1, rate_hz: {RATE_HZ}, messages: {MESSAGES},
           warmup_messages: 0, qos: 1}}
sweep: {{workload.subscribers: [1, 2]}}
agents: {{count: 2}}
timing: {{heartbeat_timeout_s: {HEARTBEAT_TIMEOUT_S}, drain_s: 0.5}}
retries: 2
"""


def group_members(pgid: int) -> list[int]:
    """Live, non-zombie pids whose process group is ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
        except OSError:
            continue
        if fields[0] not in "ZX" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


class Serve:
    """One ``mqttbed serve`` on the data dir, in a session of its own, output to a log."""

    def __init__(self, data: Path, log: Path):
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [CLI, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.journal_dir = data / JOURNAL_SUBDIR
        deadline = time.monotonic() + 30
        while not (found := re.search(r"mqttbed controller on (http://127\.0\.0\.1:\d+)",
                                      log.read_text())) \
                or "Application startup complete" not in log.read_text():
            assert self.proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        self.url = found[1]

    def journal(self) -> tuple[str, list[dict]]:
        """This controller's journal: its tag and the process groups it has running."""
        for path in self.journal_dir.glob("*.json"):
            document = json.loads(path.read_text())
            if document["pid"] == self.proc.pid:
                return path.stem, document["groups"]
        raise AssertionError(f"no journal of pid {self.proc.pid} in {self.journal_dir}")

    def kill_session(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)


@pytest.fixture
def lab(tmp_path, db_url, monkeypatch):
    """A data dir, a user token, and a way to start ``mqttbed serve`` on them; the database
    SQLite in the data dir (the default) or PostgreSQL (``MQTTBED_DATABASE_URL``, which
    each serve inherits)."""
    data = tmp_path / "data"
    data.mkdir()
    if db_url.startswith("sqlite"):
        monkeypatch.delenv("MQTTBED_DATABASE_URL")
        db_url = database_url(data)
    sessions = open_database(db_url)
    token = create_token(sessions, "faults", TokenRole.USER)
    sessions.kw["bind"].dispose()
    started: list[Serve] = []

    def serve() -> Serve:
        started.append(Serve(data, tmp_path / f"serve-{len(started)}.log"))
        return started[-1]

    yield data, token, serve
    for server in started:
        server.kill_session()
    reap_stale(data)  # anything a failing test left behind


def runs_of(url: str, token: str, campaign_id: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/campaigns/{campaign_id}", timeout=10,
                         headers={"authorization": f"Bearer {token}"})
    response.raise_for_status()
    return response.json()["runs"]


def wait_for_run(url: str, token: str, campaign_id: str, run_id_suffix: str, state: str,
                 timeout_s: float = 120) -> dict:
    """The run once it is in ``state``. A served controller's first run is held (deploying)
    until its analysis JVM has started (RunEngine.hold_measurements): a setup wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = {r["id"].removeprefix(campaign_id): r for r in runs_of(url, token, campaign_id)}
        if (run := runs.get(run_id_suffix)) is not None and run["state"] == state:
            return run
        assert time.monotonic() < deadline, f"{run_id_suffix} never {state}: {runs}"
        time.sleep(0.1)


def wait_until_gone(groups: list[int], tag: str, timeout_s: float) -> list[int]:
    """Wait until no process of ``groups`` nor any carrying ``tag`` lives; return the
    survivors at the deadline (empty: all gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = sorted({pid for group in groups for pid in group_members(group)}
                      | set(tagged_processes(tag)))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.system
@pytest.mark.timeout(240)
@pytest.mark.integration
def test_killed_then_stopped_controller_leaves_nothing_and_the_campaign_completes_once(
        lab, spark):
    data, token, serve = lab
    headers = {"authorization": f"Bearer {token}"}

    # 1. A controller killed with SIGKILL mid-run: its broker and agents die with it.
    first = serve()
    created = httpx.post(f"{first.url}/api/v1/campaigns", content=SPEC, timeout=10,
                         headers={**headers, "content-type": "application/yaml"})
    assert created.status_code == 201, created.text
    campaign_id = created.json()["id"]
    assert httpx.post(f"{first.url}/api/v1/campaigns/{campaign_id}/start", headers=headers,
                      timeout=10).status_code == 200
    wait_for_run(first.url, token, campaign_id, "-r0000", "running")
    # the attempt has data: a chunk of its events stored (chunk interval 1 s)
    partition = data / "events" / f"campaign_id={campaign_id}" / f"run_id={campaign_id}-r0000"
    wait_until(lambda: any(partition.glob("*.parquet")), 30,
               f"a chunk of the first attempt's events in {partition}")
    tag, groups = first.journal()
    brokers = [g for g in groups if Path(g["argv"][0]).name == "mosquitto"]
    agents = [g for g in groups if "--controller" in g["argv"]]
    assert (len(brokers), len(agents), len(groups)) == (1, 2, 3), groups
    pgids = [g["pgid"] for g in groups]
    assert all(group_members(pgid) for pgid in pgids)  # all running before the kill
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(5)
    killed_at = time.monotonic()
    left = wait_until_gone(pgids, tag, HEARTBEAT_TIMEOUT_S + 1.0)
    print(f"SIGKILL: everything it started gone after {time.monotonic() - killed_at:.2f} s")
    assert left == [], f"still running {HEARTBEAT_TIMEOUT_S + 1:.0f} s after the kill: {left}"
    assert (first.journal_dir / f"{tag}.json").exists()  # the dead one's journal stays

    # 2. The next controller reaps the dead one's journal, retries the interrupted run as
    #    attempt 1, and is stopped with SIGTERM while that attempt runs.
    second = serve()
    assert not (second.journal_dir / f"{tag}.json").exists()
    runs = {r["id"].removeprefix(campaign_id): r for r in runs_of(second.url, token,
                                                                 campaign_id)}
    assert runs["-r0000"]["state"] == "interrupted"
    assert runs["-r0000"]["reason"] == "controller restarted during the run"
    wait_for_run(second.url, token, campaign_id, "-r0000-retry1", "running")
    tag2, groups2 = second.journal()
    assert len(groups2) == 3, groups2
    stopped_at = time.monotonic()
    second.proc.send_signal(signal.SIGTERM)
    code = second.proc.wait(10)
    exit_s = time.monotonic() - stopped_at
    print(f"SIGTERM: serve exited after {exit_s:.2f} s")
    assert code == 0, second.log.read_text()[-3000:]
    assert exit_s < 5.0, f"serve took {exit_s:.1f} s to exit after SIGTERM"
    assert wait_until_gone([g["pgid"] for g in groups2], tag2, 0) == []
    assert not (second.journal_dir / f"{tag2}.json").exists()  # closed: nothing left

    # 3. A third controller on the data dir runs attempt 2 and the second run: the
    #    campaign completes. In this process, so that its analysis uses the session's
    #    warm Spark rather than starting a JVM of its own (most of a cold serve's time).
    started = time.monotonic()
    with create_controller(Settings(data_dir=data)) as third:
        assert third.engine.recover() == 0  # nothing was active: SIGTERM left it clean
        assert third.run_campaign(campaign_id) == CampaignStatus.DONE
        with third.sessions() as s:
            attempts = [(r.id.removeprefix(campaign_id), r.attempt, r.state, r.reason)
                        for r in s.query(RunRow).filter_by(campaign_id=campaign_id)
                        .order_by(RunRow.ordinal, RunRow.attempt)]
        results = load_results(third.layout, campaign_id)
    print(f"third controller: campaign done after {time.monotonic() - started:.1f} s")
    assert attempts == [
        ("-r0000", 0, "interrupted", "controller restarted during the run"),
        ("-r0000-retry1", 1, "interrupted", "controller stopped by SIGTERM"),
        ("-r0000-retry2", 2, "done", None), ("-r0001", 0, "done", None)]
    # The killed attempt's events stay on disk, outside the results.
    assert list(partition.glob("*.parquet")), "the killed attempt uploaded no chunk"
    assert [r.run_id.removeprefix(campaign_id) for r in results.runs] == \
        ["-r0000-retry2", "-r0001"]
    for point, subscribers in zip(results.points, (1, 2), strict=True):
        assert (point.runs, point.runs_failed) == (1, 0)
        assert point.messages_sent == MESSAGES
        assert point.deliveries_expected == MESSAGES * subscribers
        assert point.deliveries_received == MESSAGES * subscribers
        assert (point.duplicates, point.lost) == (0, 0)


@pytest.mark.integration
def test_an_agent_exits_once_its_controller_is_silent_past_the_heartbeat_timeout(controller):
    """The agent's side, which PDEATHSIG hides for local agents: a lab agent started
    over SSH has no parent on the controller's machine to die with."""
    token = create_token(controller.sessions, "pi", TokenRole.AGENT)
    agent = subprocess.Popen(
        [sys.executable, "-m", "mqttbed.agents", "--controller", controller.url,
         "--name", "orphan", "--gpio", "virtual"],
        env={**os.environ, "MQTTBED_AGENT_TOKEN": token}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not any(r.hello.name == "orphan" for r in controller.agent_registry.agents()):
            assert agent.poll() is None, agent.stdout.read()
            assert time.monotonic() < deadline, "the agent did not register"
            time.sleep(0.05)
        controller.stop()  # its port closes: every request is refused from now on
        code = agent.wait(3.0 + 5.0)  # the default heartbeat timeout, and a margin
        output = agent.stdout.read()
        assert code == EXIT_CONTROLLER_LOST, output
        assert re.search(r"controller http://127\.0\.0\.1:\d+ silent for \d\.\d s "
                         r"\(timeout 3\.0 s\): exiting", output), output
    finally:
        agent.kill()
        agent.wait()
