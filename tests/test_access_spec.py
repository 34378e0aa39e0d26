"""``broker.transport``, ``broker.tls``, ``broker.auth`` and ``workload.protocol``: what the
spec refuses before anything runs (naming the field and value), what the controller
checks when it takes a campaign (the files, on its machine), and what each run reads
when it starts and hands to the backend and the agents.

A backend of this module (``access-probe``, registered as a built-in for the test) says
it configures TLS listeners and users; its deploy records the access it was given and
refuses, so a run ends there, within a second, with nothing started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

from mqttbed.campaigns.spec import check_access_files, parse_spec, spec_from_text
from mqttbed.controller.assignments import plan_assignments
from mqttbed.controller.db import RunRow
from mqttbed.controller.run_access import run_access
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core import backends
from mqttbed.core.backends import (
    BackendDeclaration,
    BrokerAccess,
    BrokerFeatures,
    ConfiguresAccess,
    DeploymentRecord,
)
from mqttbed.core.broker_access import (
    MASK,
    ClientCredentials,
    ListenerTransport,
    SecretUnavailable,
)
from mqttbed.core.errors import BackendError, SpecError
from mqttbed.core.host import Host
from mqttbed.core.protocol import Assignment, Commands, Endpoint, Register
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords
from tests.conftest import Served

pytestmark = pytest.mark.timeout(30)

PROBE = "access-probe"
CANARY = "canary-pw-7f3a9c"
ALL_TRANSPORTS = frozenset(ListenerTransport)


class ProbeOptions(BaseModel):
    """The probe backend's broker section: nothing of its own."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["access-probe"] = "access-probe"


class AccessProbeBackend:
    """Records the access configure_access gave it; its deploy refuses (nothing runs)."""

    name = PROBE
    configured: list[BrokerAccess] = []   # every instance's, in order (class-wide)

    def configure_access(self, access: BrokerAccess) -> None:
        AccessProbeBackend.configured.append(access)

    def deploy(self, spec: Any, host: Host) -> Endpoint:
        access = AccessProbeBackend.configured[-1]
        if access.auth is not None and access.auth.username == "quoting":
            # as a careless backend might: a failed command line with the password on it
            assert access.password is not None
            raise BackendError(f"command ['passwd', '-b', 'quoting', "
                               f"'{access.password.get_secret_value()}'] failed")
        raise BackendError("access-probe deploys nothing")

    def health(self) -> str | None:
        return None

    def resource_samples(self) -> list[BrokerResourceSample]:
        return []

    def deployment(self) -> DeploymentRecord:
        return DeploymentRecord(backend=PROBE, managed=False)

    def section_records(self) -> SectionRecords:
        return {}

    def teardown(self) -> None:
        pass


class UnconfiguredBackend(AccessProbeBackend):
    """Declares TLS and users, but cannot configure them (no configure_access)."""

    configure_access = None  # type: ignore[assignment]


PROBE_DECLARATION = BackendDeclaration(
    name=PROBE, summary="test: records its access", options=ProbeOptions,
    backend=f"{__name__}:AccessProbeBackend", unavailable=lambda: None,
    features=BrokerFeatures(protocols=frozenset({"3.1.1", "5"}), transports=ALL_TRANSPORTS,
                            auth=True))


class UnconfiguredOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backend: Literal["unconfigured-probe"] = "unconfigured-probe"


UNCONFIGURED_DECLARATION = BackendDeclaration(
    name="unconfigured-probe", summary="test: declares access it cannot configure",
    options=UnconfiguredOptions, backend=f"{__name__}:UnconfiguredBackend",
    unavailable=lambda: None,
    features=BrokerFeatures(transports=ALL_TRANSPORTS, auth=True))


@pytest.fixture(autouse=True)
def probe_backends(monkeypatch) -> Iterator[None]:
    """The two probe backends, found as built-ins for this module's tests only."""
    monkeypatch.setitem(backends.BUILTIN_BACKENDS, PROBE, f"{__name__}:PROBE_DECLARATION")
    monkeypatch.setitem(backends.BUILTIN_BACKENDS, "unconfigured-probe",
                        f"{__name__}:UNCONFIGURED_DECLARATION")
    backends.refresh()
    AccessProbeBackend.configured.clear()
    yield
    monkeypatch.undo()
    backends.refresh()


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "broker-password"
    path.write_text(f"{CANARY}\n")
    return path


def spec_of(broker: dict[str, Any], workload: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "access", "broker": broker, "workload": workload or {}}


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as raised:
        parse_spec(data)
    return str(raised.value)


# -- the spec: what is refused before anything runs -------------------------------------

def test_defaults_are_plain_anonymous_mqtt_311_over_tcp():
    spec = parse_spec({"name": "plain"})
    assert (spec.broker.transport, spec.broker.tls, spec.broker.auth) == (None, None, None)
    assert spec.broker.resolved_transport() == ListenerTransport.TCP
    assert spec.workload.protocol == "3.1.1"
    access = run_access(spec)
    assert access.plain and access.to_configure() == [] and access.password is None
    assert access.client_credentials() is None


def test_protocol_5_written_as_a_yaml_number_is_the_version_5():
    spec = spec_from_text(f"name: v5\nbroker: {{backend: {PROBE}}}\nworkload: {{protocol: 5}}\n")
    assert spec.workload.protocol == "5"
    assert parse_spec(spec.model_dump(mode="json")).workload.protocol == "5"   # round-trips


def test_mqtt_5_on_a_backend_declaring_311_only_is_refused_naming_workload_protocol():
    started = time.monotonic()
    message = refusal(spec_of({"backend": "forkpipe"}, {"protocol": "5"}))
    assert message == "workload.protocol '5': backend forkpipe declares MQTT 3.1.1 only"
    assert time.monotonic() - started < 5
    # a version nobody speaks is named with the two there are
    assert refusal(spec_of({"backend": PROBE}, {"protocol": "4"})) == (
        "workload.protocol: bad value '4': Input should be '3.1.1' or '5'")


def test_mqtt_5_on_a_udp_backend_is_refused_too():
    message = refusal(spec_of({"backend": "fpga"}, {"protocol": "5"}))
    assert message == "workload.protocol '5': backend fpga declares MQTT 3.1.1 only"


def test_a_transport_the_backend_lacks_is_refused_naming_broker_transport():
    message = refusal(spec_of({"backend": "forkpipe", "transport": "wss"}))
    assert message == "broker.transport 'wss': backend forkpipe declares tcp only", message


def test_a_transport_other_than_the_external_urls_scheme_is_refused():
    message = refusal(spec_of({"backend": "external", "url": "mqtt://127.0.0.1:1883",
                               "transport": "tls"}))
    assert message.startswith("broker.transport 'tls': backend external declares tcp only")
    # the url's own transport, said again, is no conflict
    spec = parse_spec(spec_of({"backend": "external", "url": "mqtt://127.0.0.1:1883",
                               "transport": "tcp"}))
    assert spec.broker.resolved_transport() == ListenerTransport.TCP


def test_tls_settings_with_a_plain_transport_are_refused_as_unused():
    for transport in ("tcp", "ws"):
        message = refusal(spec_of({"backend": PROBE, "transport": transport,
                                   "tls": {"server_name": "broker.lab"}}))
        assert message.startswith(f"broker.tls: the clients reach the broker over "
                                  f"{transport!r} (broker.transport), which is not TLS, so "
                                  "nothing would use broker.tls"), message
    # left out, the transport is the backend's default (tcp): still nothing would use it
    assert refusal(spec_of({"backend": PROBE, "tls": {"verify": False}})).startswith(
        "broker.tls: the clients reach the broker over 'tcp' (the default of backend "
        f"{PROBE}), which is not TLS")
    for transport in ("tls", "wss"):
        spec = parse_spec(spec_of({"backend": PROBE, "transport": transport,
                                   "tls": {"server_name": "broker.lab"}}))
        assert spec.broker.resolved_transport().tls


def test_auth_on_a_backend_that_configures_no_users_is_refused():
    message = refusal(spec_of({"backend": "forkpipe",
                               "auth": {"username": "bench", "password_env": "X"}}))
    assert message == ("broker.auth (username 'bench'): backend forkpipe declares no user "
                       "names or passwords; leave broker.auth out"), message


def test_access_a_backend_declares_but_cannot_configure_is_refused():
    message = refusal(spec_of({"backend": "unconfigured-probe", "transport": "tls"}))
    assert message.startswith("broker.transport 'tls': backend unconfigured-probe declares "
                              "it but does not configure its broker's access"), message


def test_half_a_client_certificate_and_two_password_sources_are_refused():
    assert "broker.tls.cert_file is given alone" in refusal(
        spec_of({"backend": PROBE, "transport": "tls", "tls": {"cert_file": "/c.pem"}}))
    assert ("give one of password_file, password_env and generate_password, not "
            "password_file and password_env") in refusal(
        spec_of({"backend": PROBE, "auth": {"username": "u", "password_file": "/p",
                                            "password_env": "P"}}))


def test_a_swept_transport_is_checked_at_every_point():
    message = refusal({**spec_of({"backend": "forkpipe"}),
                       "sweep": {"broker.transport": ["tcp", "ws"]}})
    assert message.startswith("sweep point (broker.transport='ws'): broker.transport 'ws'")


# -- the files: checked on the controller, read again by each run ------------------------

def test_an_unreadable_password_file_is_named_by_its_path(tmp_path):
    missing = tmp_path / "no-such-password"
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {"username": "u",
                                                          "password_file": str(missing)}}))
    with pytest.raises(SpecError) as raised:
        check_access_files(spec)
    assert str(raised.value) == (f"broker.auth.password_file {str(missing)!r} cannot be "
                                 "read: No such file or directory")
    # a directory, a device: refused at once (never read forever: the spec may come over
    # REST)
    for path in (str(tmp_path), "/dev/zero"):
        other = parse_spec(spec_of({"backend": PROBE, "auth": {"username": "u",
                                                               "password_file": path}}))
        with pytest.raises(SpecError) as raised:
            check_access_files(other)
        assert str(raised.value) == (f"broker.auth.password_file {path!r} cannot be read: "
                                     "not a regular file")


def test_an_unset_password_env_is_named_by_the_variable(monkeypatch):
    monkeypatch.delenv("MQTTBED_TEST_UNSET_PW", raising=False)
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {
        "username": "u", "password_env": "MQTTBED_TEST_UNSET_PW"}}))
    with pytest.raises(SpecError) as raised:
        check_access_files(spec)
    assert str(raised.value) == ("broker.auth.password_env: the environment variable "
                                 "MQTTBED_TEST_UNSET_PW is not set")
    monkeypatch.setenv("MQTTBED_TEST_UNSET_PW", CANARY)
    check_access_files(spec)
    assert run_access(spec).password.get_secret_value() == CANARY


def test_an_unreadable_key_file_is_named_by_its_path(tmp_path):
    cert = tmp_path / "client.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key = tmp_path / "client.key"   # never written
    spec = parse_spec(spec_of({"backend": PROBE, "transport": "tls", "tls": {
        "cert_file": str(cert), "key_file": str(key)}}))
    with pytest.raises(SpecError, match=f"^broker.tls.key_file '{key}' cannot be read: No "
                                        "such file or directory$"):
        check_access_files(spec)
    with pytest.raises(SecretUnavailable, match=f"broker.tls.key_file '{key}'"):
        run_access(spec).client_credentials()
    key.write_text("-----BEGIN PRIVATE KEY-----\nsecret-key\n")
    credentials = run_access(spec).client_credentials()
    assert credentials is not None and credentials.username is None
    assert credentials.cert_pem == cert.read_text()
    assert credentials.key_pem is not None
    assert "secret-key" in credentials.key_pem.get_secret_value()
    assert "secret-key" not in credentials.model_dump_json()   # masked in a dump


def test_the_access_holds_the_password_read_at_run_start_and_the_spec_only_its_path(
        password_file):
    spec = parse_spec(spec_of({"backend": PROBE, "transport": "wss", "auth": {
        "username": "bench", "password_file": str(password_file)}}, {"protocol": "5"}))
    stored = spec.model_dump_json()
    assert CANARY not in stored and str(password_file) in stored
    access = run_access(spec)
    assert (access.transport, access.protocol, access.auth) == (ListenerTransport.WSS, "5",
                                                                spec.broker.auth)
    assert access.password is not None and access.password.get_secret_value() == CANARY
    assert access.to_configure() == ["broker.transport 'wss'", "broker.auth"]
    assert CANARY not in repr(access)
    password_file.write_text("changed-between-runs\n")   # each run reads it afresh
    assert run_access(spec).password.get_secret_value() == "changed-between-runs"


def test_every_assignment_carries_the_protocol_and_the_credentials(password_file):
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {
        "username": "bench", "password_file": str(password_file)}},
        {"protocol": "5", "publishers": 2, "subscribers": 3}))
    credentials = run_access(spec).client_credentials()
    assert credentials is not None
    assignments = plan_assignments(spec, "r1", "c1", Endpoint(host="127.0.0.1", port=1883),
                                   ["agent-1", "agent-2"], credentials=credentials)
    assert len(assignments) == 2
    for assignment in assignments.values():
        assert assignment.protocol == "5" and assignment.credentials == credentials
        assert assignment.credentials.password_bytes() == CANARY.encode()
        dumped = assignment.model_dump_json()
        assert CANARY not in dumped and MASK in dumped   # masked in every other dump


# -- the controller: on create, and when each run starts ---------------------------------

def test_the_controller_refuses_a_campaign_whose_password_file_it_cannot_read(
        controller, tmp_path):
    missing = tmp_path / "gone"
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {"username": "u",
                                                          "password_file": str(missing)}}))
    with pytest.raises(SpecError, match=f"broker.auth.password_file '{missing}' cannot be "
                                        "read"):
        controller.engine.create_campaign(spec)
    with controller.sessions() as s:
        assert s.query(RunRow).count() == 0   # nothing stored, nothing ran


def test_a_run_whose_password_file_vanished_fails_naming_it_before_deploying(
        controller, password_file):
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {
        "username": "u", "password_file": str(password_file)}}))
    campaign_id = controller.engine.create_campaign(spec)
    password_file.unlink()
    started = time.monotonic()
    assert controller.engine.run_campaign(campaign_id) == "failed"
    assert time.monotonic() - started < 10
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "failed"
    assert run.reason == (f"broker.auth.password_file {str(password_file)!r} cannot be read: "
                          "No such file or directory")
    assert AccessProbeBackend.configured == []   # no backend was even given the access


def test_a_run_hands_the_backend_its_access_before_deploy(controller, password_file,
                                                          monkeypatch):
    monkeypatch.setenv("MQTTBED_TEST_PW", CANARY)
    spec = parse_spec(spec_of({"backend": PROBE, "transport": "tls",
                               "tls": {"server_name": "broker.lab", "verify": False},
                               "auth": {"username": "bench", "password_env": "MQTTBED_TEST_PW"}},
                              {"protocol": "5"}))
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "failed"
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.reason == "BackendError: access-probe deploys nothing"   # after configuring
    (access,) = AccessProbeBackend.configured
    assert isinstance(AccessProbeBackend(), ConfiguresAccess)
    assert access.transport == ListenerTransport.TLS and access.protocol == "5"
    assert access.tls == spec.broker.tls and access.auth == spec.broker.auth
    assert access.password is not None and access.password.get_secret_value() == CANARY


def test_a_reason_quoting_the_password_is_stored_with_it_masked(controller, password_file):
    spec = parse_spec(spec_of({"backend": PROBE, "auth": {
        "username": "quoting", "password_file": str(password_file)}}))
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "failed"
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.reason == ("BackendError: command ['passwd', '-b', 'quoting', '**********'] "
                          "failed")


def test_an_agent_receives_the_real_password_in_its_assignment(controller):
    token = create_token(controller.sessions, "pi-secrets", TokenRole.AGENT)
    credentials = ClientCredentials(username="bench", password=SecretStr(CANARY),
                                    cert_pem="CERT", key_pem=SecretStr("KEY-" + CANARY))
    with httpx.Client(base_url=controller.url, timeout=10,
                      headers={"authorization": f"Bearer {token}"}) as http:
        hello = Register(name="pi-secrets", hostname="h", pid=os.getpid(), cores=1,
                         gpio_backend="virtual", clock="CLOCK_MONOTONIC", clock_resolution_ns=1)
        agent_id = http.post("/agent/v1/register", content=hello.model_dump_json(),
                             headers={"content-type": "application/json"}).json()["agent_id"]
        assignment = Assignment(run_id="r1", campaign_id="c1", protocol="5",
                                broker=Endpoint(host="127.0.0.1", port=1883), clients=[],
                                credentials=credentials)
        controller.agent_registry.send(agent_id, assignment)
        response = http.get(f"/agent/v1/agents/{agent_id}/commands", params={"wait_s": 1})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    (received,) = Commands.model_validate_json(response.content).commands
    assert isinstance(received, Assignment) and received.protocol == "5"
    assert received.credentials is not None
    assert received.credentials.password_bytes() == CANARY.encode()
    assert received.credentials.key_pem.get_secret_value() == "KEY-" + CANARY
    assert received == assignment


def test_mqttbed_run_refuses_a_spec_whose_password_file_is_missing_before_running(tmp_path):
    missing = tmp_path / "no-password"
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: cli-access\nbroker: {backend: mosquitto, transport: tls, auth: "
                    f"{{username: u, password_file: {missing}}}}}\n")
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).with_name("mqttbed")), "run", str(spec),
                           "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 2, done.stderr
    # the console wraps long lines (anywhere, paths too): compared without whitespace
    assert "".join(done.stderr.split()) == "".join((
        f"invalid campaign spec {spec}: broker.auth.password_file '{missing}' cannot be "
        "read: No such file or directory").split())
    assert not list((tmp_path / "data").rglob("*.parquet"))   # nothing ran



def test_a_spec_sent_over_rest_may_read_secrets_from_the_secrets_dir_only(tmp_path,
                                                                            monkeypatch):
    """Over REST, a caller naming any file (or variable) as a password would have the
    controller send it to a broker of their choice: only the secrets directory and
    MQTTBED_SECRET_* variables are taken."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    served = Served(tmp_path / "data", run_campaigns=False, secrets_dir=secrets)
    assert served.controller.settings.broker_secrets_dir() == secrets.resolve()
    inside = secrets / "broker-password"
    inside.write_text(CANARY + "\n")
    outside = tmp_path / "elsewhere-password"
    outside.write_text(CANARY + "\n")
    escaping = f"{secrets}/../../elsewhere-password"   # resolved before it is compared
    monkeypatch.setenv("MQTTBED_SECRET_BROKER", CANARY)
    monkeypatch.setenv("HOME_PASSWORD", CANARY)

    def post(auth: dict[str, str]) -> httpx.Response:
        with served.client() as http:
            return http.post("/api/v1/campaigns", json=spec_of(
                {"backend": PROBE, "auth": {"username": "u", **auth}}))

    with served.server:
        for path in (str(outside), escaping):
            refused = post({"password_file": path})
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"].startswith(
                f"broker.auth.password_file {path!r}: a spec sent to the controller over "
                f"REST may name files inside its secrets directory {str(secrets)!r} only")
        refused = post({"password_env": "HOME_PASSWORD"})
        assert refused.status_code == 422
        assert "broker.auth.password_env 'HOME_PASSWORD'" in refused.json()["detail"]
        assert CANARY not in refused.text
        assert post({"password_file": str(inside)}).status_code == 201
        assert post({"password_env": "MQTTBED_SECRET_BROKER"}).status_code == 201


def test_a_generated_password_is_new_for_every_run_and_only_for_a_broker_mqttbed_starts():
    spec = parse_spec(spec_of({"backend": "mosquitto", "auth": {
        "username": "bench", "generate_password": True}}))
    first, second = run_access(spec).password, run_access(spec).password
    assert first is not None and second is not None
    assert len(first.get_secret_value()) == 32
    assert first.get_secret_value() != second.get_secret_value()
    assert "generate_password" in spec.model_dump_json()   # the spec keeps the choice only
    message = refusal(spec_of({"backend": "external", "url": "mqtt://127.0.0.1:1883",
                               "auth": {"username": "u", "generate_password": True}}))
    assert "broker.auth.generate_password: backend external starts no broker" in message
    message = refusal(spec_of({"backend": "mosquitto", "auth": {
        "username": "u", "generate_password": True, "password_env": "X"}}))
    assert ("give one of password_file, password_env and generate_password, not "
            "password_env and generate_password") in message
