"""Connection storms on the native engine (agents/connect_storm.py, src/storm.c) against a
real Mosquitto 2.0: clients connect on their intended schedule over TCP and TLS, every
phase is timed from the intended time, all are held then gone; a broker that refuses part
of a storm leaves every connect's outcome with the refusal named; a storm the file limit
cannot hold is refused naming both numbers."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from mqttbed.agents.connect_storm import ConnectStormSession
from mqttbed.agents.native import engine as native
from mqttbed.brokers.certificates import write_server_tls
from mqttbed.core.broker_access import ClientCredentials, EndpointTls
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import Endpoint, StormOutcomes, StormPlan
from tests.conftest import eventually
from tests.generic_support import (
    MOSQUITTO,
    free_port,
    mosquitto_running,
    tls_lines,
    write_password_file,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto"),
              pytest.mark.skipif(native.unavailable_reason() is not None,
                                 reason=f"no native engine: {native.unavailable_reason()}")]

LIMITED = 50  # the max_connections of one listener


@dataclass(frozen=True)
class StormBroker:
    """One Mosquitto with a listener per case."""

    pid: int
    plain: int
    tls: int
    limited: int      # max_connections LIMITED
    password: int     # user "storm", password "right"
    ca_pem: str


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory) -> Iterator[StormBroker]:
    directory = tmp_path_factory.mktemp("storm-mosquitto")
    server_tls = write_server_tls(directory, ["127.0.0.1"])
    passwords = write_password_file(directory / "passwords", {"storm": "right"})
    plain, tls, limited, password = (free_port() for _ in range(4))
    anonymous = ["allow_anonymous true"]
    lines = ["per_listener_settings true", "persistence false",
             f"listener {plain} 127.0.0.1", *anonymous,
             f"listener {tls} 127.0.0.1", *anonymous, *tls_lines(server_tls),
             f"listener {limited} 127.0.0.1", *anonymous, f"max_connections {LIMITED}",
             f"listener {password} 127.0.0.1", "allow_anonymous false",
             f"password_file {passwords}"]
    with mosquitto_running(directory, lines, [plain, tls, limited, password]) as proc:
        yield StormBroker(proc.pid, plain, tls, limited, password, server_tls.ca_pem)


def held_on(pid: int, port: int) -> int:
    """Connections the broker holds on its listener ``port`` now."""
    return sum(1 for c in psutil.Process(pid).net_connections("tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)


def storm(endpoint: Endpoint, clients: int, rate_hz: float | None, *, hold_s: float = 0.3,
          credentials: ClientCredentials | None = None, protocol: str = "3.1.1",
          watch: tuple[int, int] | None = None) -> tuple[StormOutcomes, int]:
    """Run one storm; its outcomes, and the most connections the broker held meanwhile
    (``watch``: the broker's pid and port; 0 without)."""
    plan = StormPlan(client_id_prefix="storm-", first=0, step=1, count=clients, total=clients,
                     rate_hz=rate_hz, hold_s=hold_s, connect_timeout_s=5)
    session = ConnectStormSession(endpoint, plan, protocol=protocol,  # type: ignore[arg-type]
                                  credentials=credentials)
    most = 0
    done = threading.Event()

    def count() -> None:
        nonlocal most
        while watch is not None and not done.wait(0.02):
            most = max(most, held_on(*watch))

    watcher = threading.Thread(target=count)
    watcher.start()
    try:
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 20_000_000_000, abort=lambda: False)
    finally:
        done.set()
        watcher.join()
        session.close()
    return session.outcomes(), most


def plain(port: int) -> Endpoint:
    return Endpoint(host="127.0.0.1", port=port)


@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_storm_of_200_at_2000_per_s_times_every_phase_from_the_intended_time_holds_all_then_leaves(
        mosquitto, transport):
    endpoint = plain(mosquitto.plain) if transport == "tcp" else Endpoint(
        host="127.0.0.1", port=mosquitto.tls, tls=EndpointTls(ca_pem=mosquitto.ca_pem))
    port = endpoint.port
    outcomes, most_held = storm(endpoint, 200, 2000, watch=(mosquitto.pid, port))

    assert Counter(outcomes.outcome) == {"connected": 200}
    # client k intended k / 2000 s after the start, every phase after it and in order
    assert outcomes.intended_ns == [k * 500_000 for k in range(200)]
    for n in range(200):
        phases = [outcomes.connect_ns[n], outcomes.tcp_ns[n],
                  *([outcomes.tls_ns[n]] if transport == "tls" else []),
                  outcomes.mqtt_sent_ns[n], outcomes.connack_ns[n]]
        assert all(p is not None for p in phases), (n, phases)
        assert 0 <= phases[0] <= phases[1] <= phases[-2] < phases[-1], (n, phases)
        assert (outcomes.tls_ns[n] is None) == (transport == "tcp")
        assert outcomes.ended_ns[n] is None  # held until the storm left
    # every connection held at once, then every one gone
    assert most_held == 200
    assert outcomes.t_all_done_ns is not None and outcomes.t_left_ns is not None
    assert outcomes.t_left_ns - outcomes.t_all_done_ns >= 300_000_000  # hold_s
    assert eventually(lambda: held_on(mosquitto.pid, port) == 0, 5)


def test_all_at_once_storm_opens_every_connect_at_the_start(mosquitto):
    outcomes, _ = storm(plain(mosquitto.plain), 300, None, hold_s=0.0)

    assert Counter(outcomes.outcome) == {"connected": 300}
    assert set(outcomes.intended_ns) == {0}
    # all in flight together: the last connect() is called long before the first
    # storm of 300 sequential handshakes could have finished
    assert max(c for c in outcomes.connect_ns if c is not None) < sum(
        c for c in outcomes.connack_ns if c is not None)


def test_a_broker_refusing_part_of_a_storm_keeps_every_outcome_and_names_the_refusal(mosquitto):
    outcomes, _ = storm(plain(mosquitto.limited), 2 * LIMITED, 2000)

    counts = Counter(outcomes.outcome)
    assert counts["connected"] == LIMITED
    assert sum(counts.values()) == 2 * LIMITED
    refused = {o for o in outcomes.outcome if o != "connected"}
    # Mosquitto accepts the TCP connection past max_connections, then closes it
    assert refused <= {"closed", "reset"}, outcomes.details
    for why in refused:
        assert outcomes.details[why], why
    for n, outcome in enumerate(outcomes.outcome):
        if outcome != "connected":
            assert outcomes.connack_ns[n] is None and outcomes.ended_ns[n] is not None


# Mosquitto 2.0 answers a wrong password with "not authorized" in both versions (3.1.1's
# return code 5; MQTT 5's reason code 0x87, not 0x86 Bad User Name or Password)
@pytest.mark.parametrize(("protocol", "code"), [("3.1.1", 5), ("5", 0x87)])
def test_a_wrong_password_is_refused_by_connack_with_its_code(mosquitto, protocol, code):
    credentials = ClientCredentials(username="storm", password="wrong")
    outcomes, _ = storm(plain(mosquitto.password), 20, 1000, credentials=credentials,
                        protocol=protocol)

    assert Counter(outcomes.outcome) == {"connack": 20}
    assert set(outcomes.code) == {code}
    assert "CONNACK refused" in outcomes.details["connack"]


def test_more_clients_than_the_file_limit_is_refused_naming_both_numbers(mosquitto):
    # in a child whose hard limit is 256: this process's limit stays as it is
    child = ("import resource, sys\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
             "from mqttbed.agents.connect_storm import ConnectStormSession, StormRefused\n"
             "from mqttbed.core.protocol import Endpoint, StormPlan\n"
             "plan = StormPlan(client_id_prefix='s-', first=0, step=1, count=1000, "
             "total=1000, rate_hz=None, hold_s=0)\n"
             "try:\n"
             f"    ConnectStormSession(Endpoint(host='127.0.0.1', port={mosquitto.plain}), plan)\n"
             "except StormRefused as exc:\n"
             "    print(exc)\n"
             "    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=30)

    assert done.returncode == 3, done.stderr
    assert "1,000 connections" in done.stdout and "RLIMIT_NOFILE is 256" in done.stdout
