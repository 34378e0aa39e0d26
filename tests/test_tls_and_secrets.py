"""``mqttbed serve --tls-cert/--tls-key`` over HTTPS with a self-signed certificate made
here; the CLI and agents verify it against ``--ca-file``. A campaign runs through it, and
no token or secret shows in the server's log, the data dir (database, run metadata, agent
logs, results), the API's campaign documents or the exports."""

from __future__ import annotations

import datetime
import io
import ipaddress
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mqttbed.controller.db import database_url, open_database
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.tls import client_verify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLI = str(Path(sys.executable).with_name("mqttbed"))
SPEC = """
name: over-https
workload: {publishers: 1, subscribers: 2, rate_hz: 200, messages: 60, warmup_messages: 10}
agents: {count: 1}
timing: {drain_s: 0.3}
"""


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, valid for a day, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mqttbed test controller")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "controller.pem", directory / "controller.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class HttpsController:
    """``mqttbed serve`` over HTTPS in a process of its own, its output in a log file."""

    def __init__(self, root: Path):
        self.data = root / "data"
        self.cert, key = self_signed_certificate(root)
        self.data.mkdir()
        sessions = open_database(database_url(self.data))
        self.user_token = create_token(sessions, "tls-user", TokenRole.USER)
        self.agent_token = create_token(sessions, "tls-pi", TokenRole.AGENT)
        sessions.kw["bind"].dispose()
        self.log = root / "serve.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [CLI, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir",
                 str(self.data), "--tls-cert", str(self.cert), "--tls-key", str(key)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = self._wait_for_url()
        self.local_agent_tokens: set[str] = set()

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.search(r"mqttbed controller on (https://127\.0\.0\.1:\d+)",
                              self.log.read_text())
            if found and "Application startup complete" in self.log.read_text():
                return found[1]
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"serve did not start: {self.log.read_text()}")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=client_verify(str(self.cert)),
                            headers={"authorization": f"Bearer {self.user_token}"}, timeout=30)

    def watch_agent_tokens(self) -> None:
        """Note the tokens of the agents the controller started (from their environment)."""
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                token = child.environ().get("MQTTBED_AGENT_TOKEN")
            except psutil.Error:
                continue
            if token:
                self.local_agent_tokens.add(token)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(2)  # or sooner: an analysis under way is of no interest here
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(5)


def mqttbed(*args: str, env: dict[str, str] | None = None, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    served = HttpsController(tmp_path_factory.mktemp("https"))
    yield served
    served.stop()


def test_https_is_served_and_verified_against_the_ca_file(controller):
    with controller.client() as http:
        assert http.get("/api/v1/health").status_code == 200
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{controller.url}/api/v1/health")  # the system's CAs never signed it
    with pytest.raises(httpx.HTTPError):
        httpx.get(controller.url.replace("https:", "http:") + "/api/v1/health")


def test_the_cli_verifies_the_controller_with_ca_file(controller):
    env = {"MQTTBED_URL": controller.url, "MQTTBED_TOKEN": controller.user_token}
    trusted = mqttbed("campaigns", "list", "--ca-file", str(controller.cert), env=env)
    assert trusted.returncode == 0, trusted.stderr
    untrusted = mqttbed("campaigns", "list", env=env)
    assert untrusted.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert "--ca-file (or MQTTBED_CA_FILE)" in untrusted.stderr


def test_an_agent_verifies_the_controller_and_refuses_it_without_the_ca(controller):
    env = {"MQTTBED_AGENT_TOKEN": controller.agent_token}
    refused = mqttbed("agent", "--controller", controller.url, "--name", "untrusting",
                      env=env, timeout=30)
    assert refused.returncode == 4
    assert "the certificate of https://127.0.0.1" in refused.stderr
    assert "--ca-file (or MQTTBED_CA_FILE)" in refused.stderr

    agent = subprocess.Popen([CLI, "agent", "--controller", controller.url, "--name", "tls-pi",
                              "--ca-file", str(controller.cert)],
                             env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        with controller.client() as http:
            deadline = time.monotonic() + 20
            while not any(a["name"] == "tls-pi" for a in http.get("/api/v1/agents").json()):
                assert agent.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        agent.terminate()
        agent.wait(10)


def test_a_campaign_runs_over_https_and_no_token_reaches_logs_metadata_or_exports(
        controller, tmp_path):
    env = {"MQTTBED_URL": controller.url, "MQTTBED_TOKEN": controller.user_token,
           "MQTTBED_CA_FILE": str(controller.cert)}
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    submitted = mqttbed("campaigns", "submit", str(spec), env=env)
    assert submitted.returncode == 0, submitted.stderr
    campaign_id = submitted.stdout.strip()
    with controller.client() as http:
        deadline = time.monotonic() + 120
        # Until its runs have ended (Spark's analysis is not what this is about).
        while (campaign := http.get(f"/api/v1/campaigns/{campaign_id}").json()
               )["status"] in ("created", "queued", "running"):
            controller.watch_agent_tokens()
            assert time.monotonic() < deadline, campaign
            time.sleep(0.1)
        assert [r["state"] for r in campaign["runs"]] == ["done"], campaign  # agents trusted it
        documents = http.get("/api/v1/campaigns").text + http.get("/api/v1/agents").text
        exports = [http.get(f"/api/v1/campaigns/{campaign_id}/dataset",
                            params={"format": "csv"}).content]
        archive = zipfile.ZipFile(io.BytesIO(http.get(
            f"/api/v1/campaigns/{campaign_id}/dataset").content))
        exports += [archive.read(name) for name in archive.namelist()]
    assert controller.local_agent_tokens, "never saw the agents the controller started"

    secrets = {"user token": controller.user_token, "agent token": controller.agent_token,
               **{f"local agent token {i}": t
                  for i, t in enumerate(controller.local_agent_tokens)}}
    places = {"serve log": controller.log.read_bytes(), "API documents": documents.encode(),
              **{f"export part {i}": part for i, part in enumerate(exports)},
              **{str(p.relative_to(controller.data)): p.read_bytes()
                 for p in controller.data.rglob("*") if p.is_file()}}
    assert any(name.endswith("run.json") for name in places)
    assert any(name.endswith(".log") and "agents" in name for name in places)
    leaks = [f"{what} in {where}" for what, secret in secrets.items()
             for where, content in places.items() if secret.encode() in content]
    assert leaks == []
