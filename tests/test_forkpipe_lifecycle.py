"""Building, deploying, killing and tearing down the fork/pipe broker: nothing is left behind."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from mqttbed.brokers.forkpipe import build
from mqttbed.brokers.forkpipe.backend import ForkPipeBackend, ForkPipeLeftovers, Options
from mqttbed.brokers.processes import processes_in_group
from mqttbed.campaigns.spec import builtin_spec_path, expand_points, load_spec, parse_spec
from mqttbed.core.backends import BrokerBackend, create_backend, options_model
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import MissingSystemDependency, SpecError
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint
from tests.conftest import wait_until
from tests.test_forkpipe_protocol import (
    RawClient,
    assert_clean_teardown,
    deploy,
    eventually,
    publish,
)

pytestmark = pytest.mark.timeout(60)


def fifos_under(path: Path) -> list[Path]:
    if not path.exists():
        return []
    return [p for p in path.rglob("*") if stat.S_ISFIFO(p.lstat().st_mode)]


@pytest.mark.integration  # the C broker
@pytest.mark.parametrize("sanitizers", [False, True], ids=["release", "sanitized"])
def test_kill_9_of_the_listener_leaves_no_process_and_no_pipe(sanitizers):
    deployed = deploy(sanitizers)
    listener = deployed.backend.deployment().pid
    try:
        clients = [deployed.client(f"c{i}") for i in range(4)]
        for n, client in enumerate(clients):
            client.subscribe(f"kill/{n}/a", "kill/+/b")
        assert len(fifos_under(deployed.state)) == 8
        # Listener, one process per client, one per subscription. Eventually: the process
        # that served deploy's port probe may still be exiting (slowly under ASan's leak
        # check, which also clones a tracer task into the group).
        assert eventually(lambda: len(processes_in_group(listener)) == 1 + 4 + 8,
                          timeout_s=10), [p.cmdline() for p in processes_in_group(listener)]
        os.kill(listener, signal.SIGKILL)
        # Each child hears of its parent's death (PR_SET_PDEATHSIG) and cleans up.
        assert eventually(lambda: processes_in_group(listener) == [], timeout_s=10), [
            p.cmdline() for p in processes_in_group(listener)]
        assert fifos_under(deployed.state) == []
        assert not deployed.state.exists(), "the last client out removes the base directory"
        assert all(client.closed_by_broker() for client in clients)
        assert "killed by SIGKILL" in (deployed.backend.health() or "")
    finally:
        assert_clean_teardown(deployed)


@pytest.mark.integration  # the C broker
def test_the_binary_alone_cleans_up_after_kill_9(tmp_path):
    """The same without the backend: `mqttbed-forkpipe --port N --base-dir DIR`."""
    binary = build.ensure_built()
    host = LocalHost()
    port = host.free_port()
    base = tmp_path / "pipes"
    broker = host.spawn([str(binary), "--port", str(port), "--base-dir", str(base)],
                        log_path=tmp_path / "log")
    try:
        assert eventually(lambda: base.exists() and _answers(port))
        client = RawClient(_endpoint(port))
        client.handshake()
        client.subscribe("solo/topic")
        assert len(fifos_under(base)) == 1
        os.kill(broker.pid, signal.SIGKILL)
        assert eventually(lambda: processes_in_group(broker.pid) == [], timeout_s=10)
        assert not base.exists()
    finally:
        broker.stop()


def _endpoint(port: int) -> Endpoint:
    return Endpoint(host="127.0.0.1", port=port)


def _answers(port: int) -> bool:
    try:
        RawClient(_endpoint(port), timeout_s=0.2).close()
    except OSError:
        return False
    return True


@pytest.mark.integration  # the C broker
def test_teardown_with_connected_subscribers_leaves_no_process_no_pipe_no_directory():
    deployed = deploy(sanitizers=False)
    listener = deployed.backend.deployment().pid
    workdir = deployed.state.parent
    clients = [deployed.client(f"c{i}") for i in range(5)]
    for client in clients:
        client.subscribe("td/a", "td/b/#")
    clients[0].send(publish("td/a", b"in flight"))
    deployed.backend.teardown()
    assert deployed.backend.deployment().leftovers == ForkPipeLeftovers(processes=0, pipes=0)
    assert processes_in_group(listener) == []
    assert not workdir.exists()
    deployed.backend.teardown()  # a second teardown is harmless


@pytest.mark.integration  # the C broker
def test_deployment_records_version_binary_hash_command_line_and_build():
    deployed = deploy(sanitizers=False)
    try:
        record = deployed.backend.deployment()
        assert record.backend == "forkpipe" and record.version == "0.1.0"
        assert record.binary_sha256 is not None and len(record.binary_sha256) == 64
        assert record.config is not None
        assert f"--port {deployed.endpoint.port}" in record.config
        assert "--select-timeout-ms 20" in record.config
        assert record.build.variant == "release" and record.build.compiler != "unknown"
        assert record.options.select_timeout_ms == 20
    finally:
        assert_clean_teardown(deployed)


@pytest.mark.integration  # the C broker
def test_stats_count_every_forked_process_of_the_broker():
    deployed = deploy(sanitizers=False, stats_interval_s=0.05)
    try:
        clients = [deployed.client(f"c{i}") for i in range(3)]
        for client in clients:
            client.subscribe("stats/a", "stats/b")
        assert eventually(lambda: any(s.processes == 1 + 3 + 6
                                      for s in deployed.backend.resource_samples()))
    finally:
        assert_clean_teardown(deployed)


@pytest.mark.integration  # the C broker
def test_a_refused_fork_fails_health_with_the_reason():
    deployed = deploy(sanitizers=False)
    try:
        assert deployed.backend.health() is None
        # What the broker writes when the machine refuses it a process (EAGAIN at scale).
        log = deployed.state.parent / "broker.log"
        with log.open("a") as f:
            f.write("mqttbed-forkpipe[1]: cannot fork a client process: Resource temporarily "
                    "unavailable; connection refused\n")
        reason = deployed.backend.health()
        assert reason is not None and "Resource temporarily unavailable" in reason
        deployed.backend.teardown()
        assert "cannot fork" in (deployed.backend.deployment().process_failure or "")
    finally:
        deployed.backend.teardown()


# -- building -----------------------------------------------------------------------------

@pytest.mark.integration  # the C broker
def test_the_binary_is_built_when_missing_and_rebuilt_when_older_than_its_sources(
        tmp_path, monkeypatch):
    monkeypatch.setattr(build, "build_dir", lambda: tmp_path)
    binary = build.ensure_built()
    assert binary == tmp_path / "mqttbed-forkpipe" and os.access(binary, os.X_OK)
    built_at = binary.stat().st_mtime_ns
    assert build.ensure_built().stat().st_mtime_ns == built_at  # up to date: not rebuilt
    oldest_source = min(p.stat().st_mtime for p in build.sources())
    os.utime(binary, (oldest_source - 60, oldest_source - 60))
    assert build.is_stale(binary)
    assert not build.is_stale(build.ensure_built())


@pytest.mark.integration  # the C broker
def test_make_compiles_with_strict_warnings_and_the_sanitizers(tmp_path):
    # A real build (make -n printed the commands and compiled nothing: it could not fail on
    # a warning); both binaries must come out and run.
    make = shutil.which("make")
    assert make is not None
    built = subprocess.run([make, "-B", "-C", str(build.SOURCE_DIR), f"BUILD={tmp_path}",
                            "all", "sanitize"], capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr
    for flag in ("-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined"):
        assert flag in built.stdout
    for binary in ("mqttbed-forkpipe", "mqttbed-forkpipe-asan"):
        ran = subprocess.run([str(tmp_path / binary), "--help"], capture_output=True,
                             text=True, timeout=30)
        assert ran.returncode == 0 and "--port" in ran.stdout + ran.stderr, ran.stderr


def test_a_missing_compiler_is_named_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "build_dir", lambda: tmp_path)
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(MissingSystemDependency, match="apt-get install gcc make"):
        build.ensure_built()


def test_a_configured_binary_that_is_not_executable_is_refused(tmp_path):
    with pytest.raises(MissingSystemDependency, match="not an executable file"):
        ForkPipeBackend().deploy(Options(binary=str(tmp_path / "nope")), LocalHost())


# -- backend registry and campaign ----------------------------------------------------------------

def test_the_backend_registry_creates_a_forkpipe_backend_that_meets_the_contract():
    backend = create_backend("forkpipe")
    assert isinstance(backend, BrokerBackend) and backend.name == "forkpipe"
    assert options_model("forkpipe") is Options


def test_forkpipe_options_reject_an_unknown_key_naming_it():
    with pytest.raises(ValidationError, match="max_queued_messages"):
        Options.model_validate({"backend": "forkpipe", "max_queued_messages": 10})
    with pytest.raises(SpecError, match="broker"):
        parse_spec({"name": "x", "broker": {"backend": "forkpipe", "nonsense": 1}})


def test_the_comparison_campaign_runs_the_seed_scenarios_on_both_backends():
    spec = load_spec(builtin_spec_path("forkpipe-vs-mosquitto"))
    assert spec.repetitions == 3
    points = {(p.params["scenario"], p.params["broker.backend"]): p.spec
              for p in expand_points(spec)}
    assert set(points) == {(scenario, backend) for scenario in ("idle", "50+50", "500+500")
                           for backend in ("mosquitto", "forkpipe")}
    for backend in ("mosquitto", "forkpipe"):
        idle = points[("idle", backend)].workload
        assert (idle.publishers, idle.subscribers, idle.min_window_s) == (0, 0, 30)
        for clients in (50, 500):
            load = points[(f"{clients}+{clients}", backend)].workload
            assert (load.publishers, load.subscribers, load.messages, load.warmup_messages) == (
                clients, clients, 3, 0)
    assert points[("idle", "forkpipe")].broker.backend == "forkpipe"


@pytest.mark.integration  # the C broker
def test_io_of_ended_client_processes_is_counted_once():
    """Bytes a client's processes wrote stay counted, once, after those processes end.

    Each delivery goes onto its socket once (its copy through a pipe is no network
    traffic); after every client has disconnected and its processes have ended, the
    broker's bytes sent must still be one per delivered byte plus the CONNACKs and SUBACK.
    """
    deployed = deploy(sanitizers=False, stats_interval_s=0.05)

    def sampled_at_rest(what: str) -> None:
        """Wait for two samples after now: the second was read wholly after this moment."""
        now_ns = monotonic_ns()   # the samples' clock
        wait_until(lambda: sum(s.t_ns > now_ns for s in deployed.backend.resource_samples())
                   >= 2, 10, f"two resource samples of the broker {what}")

    try:
        assert eventually(lambda: len(deployed.backend.resource_samples()) >= 1)
        subscriber, publisher = deployed.client("sub"), deployed.client("pub")
        subscriber.subscribe("io/count")
        one = publish("io/count", b"x" * 1000)
        for _ in range(200):
            publisher.send(one)
        for _ in range(200):
            subscriber.next_message()
        sampled_at_rest("once every delivery was read (every process at rest)")
        subscriber.close()
        publisher.close()
        assert eventually(lambda: deployed.processes() == 1)
        sampled_at_rest("after its client processes ended")
    finally:
        assert_clean_teardown(deployed)
    samples = deployed.backend.resource_samples()
    written = samples[-1].bytes_sent - samples[0].bytes_sent
    delivered = 200 * len(one)
    assert written == delivered + 4 + 4 + 5, f"{written} B written for {delivered}"


@pytest.mark.integration  # the C broker
def test_teardown_right_after_clients_leave_still_counts_every_byte_once():
    """Like a run's end: clients disconnect, the backend is torn down at once."""
    deployed = deploy(sanitizers=False, stats_interval_s=0.05)
    subscribers = [deployed.client(f"sub{i}") for i in range(10)]
    for subscriber in subscribers:
        subscriber.subscribe("io/burst")
    assert eventually(lambda: len(deployed.backend.resource_samples()) >= 1)
    publisher = deployed.client("pub")
    one = publish("io/burst", b"y" * 500)
    for _ in range(20):
        publisher.send(one)
    for subscriber in subscribers:
        for _ in range(20):
            subscriber.next_message()
        subscriber.close()
    publisher.close()
    assert_clean_teardown(deployed)
    assert deployed.backend.deployment().settled_s is not None
    samples = deployed.backend.resource_samples()
    written = samples[-1].bytes_sent - samples[0].bytes_sent
    delivered = 10 * 20 * len(one)
    # plus at most the 11 CONNACKs and 10 SUBACKs (some may precede the first sample)
    assert delivered <= written <= delivered + 11 * 4 + 10 * 5, f"{written} B for {delivered}"
