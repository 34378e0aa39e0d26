"""A broker's password reaches the broker, and nothing a campaign leaves behind.

A Mosquitto this test starts (never mqttbed) refuses anonymous clients and knows two users
from a password file made with ``mosquitto_passwd -b``; their passwords are canaries.
Campaigns measure it through the ``external`` backend, and a Mosquitto mqttbed starts
itself (``mosquitto``, whose password file mqttbed writes), with one run per way of
giving the password (``broker.auth.password_file``, ``broker.auth.password_env``). Every
run delivers every message (so the password was sent: each broker refuses anyone
without it), and then neither canary, nor its base64 or hex in any alignment, is in any
file of the data dir (SQLite and its WAL, run records, Parquet, agent logs, results),
any database row, the controller's log, the documents it emitted, and, in the system
test with Spark, the results, the report page, the API's views and both exports.
"""

from __future__ import annotations

import base64
import io
import logging
import secrets
import socket
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from mqttbed.campaigns.spec import spec_from_text
from mqttbed.controller.db import RunRow
from mqttbed.core.mqtt_codec import Connect, encode
from tests.conftest import Served
from tests.generic_support import (
    delivery_counts,
    free_port,
    mosquitto_running,
    write_password_file,
)

# REST takes MQTTBED_SECRET_* variables only
PASSWORD_ENV = "MQTTBED_SECRET_TEST_BROKER_PASSWORD"
FILE_USER, ENV_USER = "bench-file", "bench-env"
CONNACK_ACCEPTED, CONNACK_NOT_AUTHORIZED = b"\x20\x02\x00\x00", b"\x20\x02\x00\x05"
# The agents' client: the native engine, which sends the credentials in CONNECT itself.
CLIENT = "native"


def canary() -> str:
    return f"mqttbed-canary-{secrets.token_hex(8)}"


def encoded_forms(secret: str) -> dict[str, bytes]:
    """The secret as bytes, as hex, and every run of base64 (standard and URL-safe)
    characters that encodes it alone, at each of the three offsets it can have inside a
    longer base64 text."""
    raw = secret.encode()
    forms = {"bytes": raw, "hex": raw.hex().encode()}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw + b"\0\0")
        # the characters whose 6 bits all come from the secret
        middle = encoded[-(-8 * shift // 6):8 * (shift + len(raw)) // 6]
        forms[f"base64 at offset {shift}"] = middle
        forms[f"urlsafe base64 at offset {shift}"] = middle.replace(b"+", b"-").replace(b"/",
                                                                                         b"_")
    return forms


def test_encoded_forms_find_a_secret_inside_longer_base64():
    secret = canary()
    for prefix in (b"", b"a", b"ab", b"abc"):
        blob = base64.b64encode(prefix + secret.encode() + b"tail")
        assert any(form in blob for form in encoded_forms(secret).values()), prefix
    assert not any(form in base64.b64encode(canary().encode())
                   for form in encoded_forms(secret).values())


@contextmanager
def mosquitto_with_passwords(directory: Path, users: dict[str, str]
                             ) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A Mosquitto this test starts and stops, refusing anonymous clients, knowing
    ``users`` (name -> password) from a password file: its process and port."""
    passwords = write_password_file(directory / "broker-users", users)
    port = free_port()
    with mosquitto_running(directory, [f"listener {port} 127.0.0.1", "allow_anonymous false",
                                       f"password_file {passwords}", "sys_interval 1",
                                       "persistence false"], [port],
                           name="secured-mosquitto") as proc:
        yield proc, port


def connack(port: int, user: str | None, password: str | None) -> bytes | None:
    """The CONNACK a 3.1.1 CONNECT with these credentials gets (None: no answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(encode(Connect(client_id=f"secrets-probe-{secrets.token_hex(3)}",
                                        username=user, password=password and password.encode())))
            return sock.recv(4)
    except OSError:
        return None


def spec_yaml(port: int, pid: int, password_file: Path, brokers: list[str]) -> str:
    """A run per broker (``external``: the test's; ``mosquitto``: one mqttbed starts) and
    way of giving the password: from a file, and from the controller's environment."""
    ways = {"file": f"{{username: {FILE_USER}, password_file: {password_file}}}",
            "env": f"{{username: {ENV_USER}, password_env: {PASSWORD_ENV}}}"}
    where = {"external": (f"broker.backend: external, broker.url: 'mqtt://127.0.0.1:{port}', "
                          f"broker.sample: {{pid: {pid}}}"),
             "mosquitto": "broker.backend: mosquitto"}
    scenarios = "".join(f"  - {{name: {broker}-{way}, {where[broker]}, broker.auth: {auth}}}\n"
                        for broker in brokers for way, auth in ways.items())
    return f"""
name: canary
broker: {{backend: mosquitto}}
workload: {{client: {CLIENT}, publishers: 1, subscribers: 2, qos: 1, rate_hz: 200,
            messages: 60, warmup_messages: 10}}
agents: {{count: 1}}
timing: {{start_lead_s: 0.3, drain_s: 0.5}}
scenarios:
{scenarios}"""


def database_rows(bind: sa.Engine) -> dict[str, bytes]:
    """Every row of every table, as text, by table."""
    metadata = sa.MetaData()
    metadata.reflect(bind=bind)
    with bind.connect() as connection:
        return {name: "\n".join(repr(tuple(row)) for row in
                                connection.execute(sa.select(table))).encode()
                for name, table in metadata.tables.items()}


def parquet_text(path: Path) -> bytes:
    """A Parquet file's rows and metadata, decoded (compression would hide a string)."""
    table = pq.read_table(path)
    return (repr(table.to_pylist()) + repr(table.schema.metadata)).encode()


def data_dir_places(root: Path) -> dict[str, bytes]:
    """Every file under the data dir as it is, and each Parquet file decoded."""
    places = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = str(path.relative_to(root))
        places[name] = path.read_bytes()
        if path.suffix == ".parquet":
            places[f"{name} (decoded)"] = parquet_text(path)
    return places


def leaks(canaries: dict[str, str], places: dict[str, bytes]) -> list[str]:
    return [f"{what} ({form}) in {where}" for what, secret in canaries.items()
            for form, needle in encoded_forms(secret).items()
            for where, content in places.items() if needle in content]


def check_runs_delivered_everything(layout: Any, campaign_id: str, runs: list[RunRow],
                                    brokers: list[str]) -> None:
    assert [(r.params["scenario"], r.state, r.reason) for r in runs] == [
        (f"{broker}-{way}", "done", None) for broker in brokers for way in ("file", "env")]
    for run in runs:
        published, received, _ = delivery_counts(layout.run_events(campaign_id, run.id))
        assert published == 60 and received == {"sub-0": 60, "sub-1": 60}, run.id
        if run.params["scenario"].startswith("mosquitto-"):
            # mqttbed's Mosquitto refused anyone without the password too
            assert "allow_anonymous false" in run.run_metadata["broker"]["config"], run.id


@pytest.fixture
def broker_and_secrets(tmp_path, monkeypatch) -> Iterator[tuple[int, int, Path,
                                                              dict[str, str]]]:
    """The secured Mosquitto, the password file, and the canaries by where they came from."""
    by_file, by_env = canary(), canary()
    password_file = tmp_path / "secret" / "broker-password"
    password_file.parent.mkdir()
    password_file.write_text(by_file + "\n")
    monkeypatch.setenv(PASSWORD_ENV, by_env)
    with mosquitto_with_passwords(tmp_path, {FILE_USER: by_file, ENV_USER: by_env}) as (
            broker, port):
        # the broker refuses anyone without the password: a delivered run used it
        assert connack(port, None, None) == CONNACK_NOT_AUTHORIZED
        assert connack(port, FILE_USER, "wrong") == CONNACK_NOT_AUTHORIZED
        assert connack(port, FILE_USER, by_file) == CONNACK_ACCEPTED
        assert connack(port, ENV_USER, by_env) == CONNACK_ACCEPTED
        yield port, broker.pid, password_file, {"password_file canary": by_file,
                                                "password_env canary": by_env}


@pytest.mark.integration   # Mosquitto, agent processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("broker", ["external", "mosquitto"])
def test_the_password_reaches_the_broker_and_no_file_row_or_log_of_the_runs(
        broker, broker_and_secrets, controller, updates, caplog):
    caplog.set_level(logging.DEBUG)
    port, pid, password_file, canaries = broker_and_secrets
    spec = spec_from_text(spec_yaml(port, pid, password_file, [broker]))
    campaign_id = controller.engine.create_campaign(spec)
    controller.engine.run_campaign(campaign_id)
    with controller.sessions() as s:
        runs = (s.query(RunRow).filter_by(campaign_id=campaign_id)
                .order_by(RunRow.ordinal).all())
    check_runs_delivered_everything(controller.layout, campaign_id, runs, [broker])

    places = {**data_dir_places(controller.layout.root),
              **{f"database table {name}": rows
                 for name, rows in database_rows(controller.sessions.kw["bind"]).items()},
              "controller log": caplog.text.encode(),
              "documents emitted": "\n".join(map(repr, updates)).encode()}
    assert any(name.endswith("run.json") for name in places)
    assert any(name.endswith(".log") and "agents" in name for name in places)
    assert any(name.endswith(".parquet") for name in places)
    assert str(password_file).encode() in places["database table runs"]   # where, not what
    assert leaks(canaries, places) == []


@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.integration   # Mosquitto, agent processes, Spark
@pytest.mark.timeout(600)
def test_no_secret_in_the_results_report_api_views_or_exports(broker_and_secrets, tmp_path,
                                                              caplog):
    caplog.set_level(logging.DEBUG)
    port, pid, password_file, canaries = broker_and_secrets
    brokers = ["external", "mosquitto"]   # the test's own Mosquitto, and one mqttbed starts
    # a spec sent over REST names files in the controller's secrets directory only
    secrets_dir = tmp_path / "controller-secrets"
    secrets_dir.mkdir()
    served = Served(tmp_path / "served", secrets_dir=secrets_dir)
    served_password_file = secrets_dir / password_file.name
    served_password_file.write_bytes(password_file.read_bytes())
    with served.server:
        campaign_id = served.start_yaml_campaign(
            spec_yaml(port, pid, served_password_file, brokers))
        served.wait_for_status(campaign_id, ("done",), 420)
        with served.client() as http:
            views = {path: http.get(path) for path in (
                "/api/v1/campaigns", f"/api/v1/campaigns/{campaign_id}",
                f"/api/v1/campaigns/{campaign_id}/stats", "/api/v1/agents", "/metrics")}
            csv = http.get(f"/api/v1/campaigns/{campaign_id}/dataset",
                           params={"format": "csv"})
            archive = http.get(f"/api/v1/campaigns/{campaign_id}/dataset")
            report = http.get(f"/campaigns/{campaign_id}")   # the report page
    with served.controller.sessions() as s:
        runs = (s.query(RunRow).filter_by(campaign_id=campaign_id)
                .order_by(RunRow.ordinal).all())
    check_runs_delivered_everything(served.controller.layout, campaign_id, runs, brokers)
    for response in (*views.values(), csv, archive, report):
        assert response.status_code == 200, (response.url, response.text[:300])
    assert "<html" in report.text.lower() and campaign_id in report.text
    members = zipfile.ZipFile(io.BytesIO(archive.content))
    places = {**data_dir_places(served.controller.layout.root),
              **{f"database table {name}": rows for name, rows in
                 database_rows(served.controller.sessions.kw["bind"]).items()},
              **{f"GET {path}": response.content for path, response in views.items()},
              "csv export": csv.content, "report page": report.content,
              **{f"parquet export: {name}": members.read(name) for name in members.namelist()},
              "controller log": caplog.text.encode(),
              "documents emitted": "\n".join(map(repr, served.updates)).encode()}
    assert any(name.endswith("stats.json") for name in places)
    assert leaks(canaries, places) == []
