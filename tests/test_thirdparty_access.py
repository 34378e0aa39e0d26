"""The named third-party brokers as deployed: each transport it declares (TLS verified
against the run's CA, WebSocket at its path), a user with a password, and what it refuses.

Each broker runs for real where installed (RabbitMQ, NATS, amqtt, ActiveMQ, ejabberd),
started by its backend with ``configure_access``; a paho client carries messages both ways
at QoS 0 and 1, a wrong password is refused, and nothing of the secret is left in the
config mqttbed records.
"""

from __future__ import annotations

import io
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import SecretStr

from mqttbed.brokers.command import ejabberd_auth, listeners, presets
from mqttbed.brokers.command.named import AccessBackend
from mqttbed.core.backends import (
    BrokerAccess,
    ConfiguresAccess,
    create_backend,
    declaration,
    unavailable_reason,
)
from mqttbed.core.broker_access import AuthSettings, ListenerTransport, TlsSettings
from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint

NAMED = ("rabbitmq", "nats", "amqtt", "activemq", "ejabberd")
PASSWORD = "canary-Pa55:word {x} é"   # ':', braces and non-ASCII on purpose
USER = "bench"
MESSAGES = 50


def access(transport: str = "tcp", protocol: str = "3.1.1", password: str | None = PASSWORD,
           **tls: object) -> BrokerAccess:
    """A run's access: ``transport``, a user with ``password`` (None: anonymous)."""
    auth = None if password is None else AuthSettings(username=USER, password_env="UNUSED")
    return BrokerAccess(transport=ListenerTransport(transport), protocol=protocol,  # type: ignore[arg-type]
                        tls=TlsSettings(**tls) if tls else None, auth=auth,  # type: ignore[arg-type]
                        password=None if password is None else SecretStr(password))


# -- what each declares, and what is refused before anything starts ------------------------

@pytest.mark.parametrize("name", NAMED)
def test_each_named_broker_configures_access_and_declares_its_transports(name):
    declared = declaration(name)
    assert declared.supports(ConfiguresAccess)
    features = declared.features
    assert features.auth and ListenerTransport.TCP in features.transports
    assert features.note


def test_declared_transports_and_versions_are_the_ones_each_broker_has():
    transports = {name: {t.value for t in declaration(name).features.transports}
                  for name in NAMED}
    assert transports == {"rabbitmq": {"tcp", "tls", "ws", "wss"}, "nats": {"tcp", "tls"},
                          "amqtt": {"tcp", "tls", "ws", "wss"}, "activemq": {"tcp", "tls"},
                          "ejabberd": {"tcp", "tls"}}
    versions = {name: set(declaration(name).features.protocols) for name in NAMED}
    assert versions == {"rabbitmq": {"3.1.1"}, "nats": {"3.1.1"}, "amqtt": {"3.1.1"},
                        "activemq": {"3.1.1"}, "ejabberd": {"3.1.1", "5"}}


def test_mqtt5_on_rabbitmq_is_refused_naming_workload_protocol_and_the_version():
    backend = create_backend("rabbitmq")
    assert isinstance(backend, AccessBackend)
    with pytest.raises(BackendError, match=r"workload.protocol '5': RabbitMQ 3.10 speaks MQTT "
                                           r"3.1.1 only .*MQTT 5 came in RabbitMQ 3.13"):
        backend.configure_access(access(protocol="5"))


def test_a_transport_the_broker_lacks_is_refused_naming_it():
    with pytest.raises(BackendError, match=r"broker.transport 'ws': nats-server 2.9 is "
                                           r"configured for tcp, tls only"):
        create_backend("nats").configure_access(access("ws"))  # type: ignore[attr-defined]
    with pytest.raises(BackendError, match=r"broker.transport 'wss': ActiveMQ 5.17 .*"
                                           r"activemq-http"):
        create_backend("activemq").configure_access(access("wss"))  # type: ignore[attr-defined]


def test_a_password_activemqs_config_would_read_as_a_placeholder_is_refused():
    with pytest.raises(BackendError, match=r"the password holds '\$\{', which ActiveMQ's "
                                           "Spring config would read as a placeholder"):
        create_backend("activemq").configure_access(  # type: ignore[attr-defined]
            access(password="a${b}"))


def test_ejabberd_without_a_user_is_refused_saying_mod_mqtt_needs_a_password():
    with pytest.raises(BackendError, match="broker.auth is missing: ejabberd 23.01's mod_mqtt "
                                           "refuses every CONNECT without a password"):
        create_backend("ejabberd").configure_access(access(password=None))  # type: ignore[attr-defined]


def test_a_ca_file_or_a_client_certificate_is_refused_naming_the_field():
    backend = create_backend("amqtt")
    with pytest.raises(BackendError, match=r"broker.tls.ca_file '/x/ca.pem': amqtt 0.12's "
                                           "certificate is signed by the CA mqttbed makes"):
        backend.configure_access(access("tls", ca_file="/x/ca.pem"))  # type: ignore[attr-defined]
    with pytest.raises(BackendError, match=r"broker.tls.cert_file '/x/c.pem': mqttbed does "
                                           "not configure amqtt 0.12 to require client"):
        backend.configure_access(access(  # type: ignore[attr-defined]
            "tls", cert_file="/x/c.pem", key_file="/x/k.pem"))


def test_an_own_config_template_with_a_configured_listener_is_refused(tmp_path):
    backend = create_backend("nats")
    backend.configure_access(access("tls"))  # type: ignore[attr-defined]
    with pytest.raises(BackendError, match="broker.config_template is given: with "
                                           "broker.transport, broker.tls or broker.auth"):
        backend.deploy({"config_template": "mqtt {{ listen: 127.0.0.1:{port} }}"},
                       LocalHost())


# -- what is rendered: the listener's lines, and never the password -------------------------

@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("transport", ["tcp", "tls", "ws", "wss"])
def test_the_rendered_config_names_the_listener_and_never_holds_the_password(name, transport):
    configurer = listeners.listener_config(name)
    if ListenerTransport(transport) not in configurer.features.transports:
        pytest.skip(f"{name} has no {transport}")
    plan = configurer.plan(access(transport))
    assert PASSWORD not in plan.config_template and "Pa55" not in plan.config_template
    assert "{port}" in plan.config_template
    if transport in ("tls", "wss"):
        assert "server.crt" in plan.config_template or "server.p12" in plan.config_template
    (user_file, text), = plan.private_files.items()
    assert user_file in plan.config_template
    # a hash wherever the broker reads one; ActiveMQ's plugin compares the password itself
    # (escaped for a properties file)
    assert ("Pa55" in text.get_secret_value()) == (name == "activemq")


def test_rabbitmq_over_websocket_enables_its_web_mqtt_plugin_at_the_mqtt_path():
    plan = listeners.listener_config("rabbitmq").plan(access("wss"))
    assert plan.env == {"RABBITMQ_ENABLED_PLUGINS": "rabbitmq_mqtt,rabbitmq_web_mqtt"}
    lines = plan.config_template.splitlines()
    assert {"mqtt.listeners.tcp = none", "web_mqtt.ssl.port = {port}",
            "web_mqtt.ws_path = /mqtt", "mqtt.allow_anonymous = false"} <= set(lines)


def test_activemq_properties_escape_every_character_java_would_read_otherwise():
    text = listeners.ActiveMqListener(presets.ACTIVEMQ.features).user_file(
        USER, SecretStr("a b=c:d\\é"))[1].get_secret_value()
    assert text.splitlines()[1] == "mqttbed.password=a\\u0020b\\u003dc\\u003ad\\u005c\\u00e9"


def test_ejabberds_checker_grants_the_right_password_only():
    users = dict([ejabberd_auth.parse_line(ejabberd_auth.hash_line(USER, PASSWORD))])

    def ask(*requests: str) -> bytes:
        wire = b"".join(len(r.encode()).to_bytes(2, "big") + r.encode() for r in requests)
        answers = io.BytesIO()
        ejabberd_auth.serve(users, io.BytesIO(wire), answers)
        return answers.getvalue()

    yes, no = b"\x00\x02\x00\x01", b"\x00\x02\x00\x00"
    assert ask(f"auth:{USER}:localhost:{PASSWORD}") == yes
    assert ask(f"auth:{USER}:localhost:wrong", f"auth:other:localhost:{PASSWORD}") == no + no
    assert ask(f"isuser:{USER}:localhost", "setpass:bench:localhost:x") == yes + no


# -- each broker for real --------------------------------------------------------------------

def paho_client(endpoint: Endpoint, client_id: str, password: str | None,
                protocol: int = mqtt.MQTTv311) -> mqtt.Client:
    """A paho client that reaches ``endpoint`` as it says (TLS verified, ws path)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                         transport="websockets" if endpoint.websocket_path else "tcp")
    if endpoint.websocket_path:
        client.ws_set_options(path=endpoint.websocket_path)
    if endpoint.tls is not None:
        client.tls_set_context(ssl.create_default_context(cadata=endpoint.tls.ca_pem))
    if password is not None:
        client.username_pw_set(USER, password)
    return client


def connack(endpoint: Endpoint, password: str | None) -> str:
    """The CONNACK's reason (paho's name), or how the connection ended without one."""
    client = paho_client(endpoint, "probe-auth", password)
    answered: list[str] = []
    done = threading.Event()
    client.on_connect = lambda _c, _u, _f, code, _p: (answered.append(str(code)), done.set())
    client.on_disconnect = lambda *_: done.set()
    client.connect(endpoint.host, endpoint.port)
    client.loop_start()
    try:
        done.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    return answered[0] if answered else "closed without a CONNACK"


def both_ways(endpoint: Endpoint, qos: int, protocol: int = mqtt.MQTTv311) -> dict[str, Counter]:
    """Two clients each publish ``MESSAGES`` numbered messages to the other at ``qos``;
    how often each number arrived, per receiving client."""
    arrived: dict[str, Counter] = {"a": Counter(), "b": Counter()}
    clients = {}
    for me in arrived:
        client = paho_client(endpoint, f"{me}-{qos}-{endpoint.port}", PASSWORD, protocol)
        subscribed = threading.Event()
        client.on_subscribe = lambda *_a, ev=subscribed: ev.set()
        client.on_message = lambda _c, _u, m, me=me: arrived[me].update(
            [int.from_bytes(m.payload, "big")])
        client.connect(endpoint.host, endpoint.port)
        client.loop_start()
        client.subscribe(f"access/{me}", qos)
        assert subscribed.wait(10), f"no SUBACK from {endpoint.scheme}:{endpoint.port}"
        clients[me] = client
    try:
        for sender, receiver in (("a", "b"), ("b", "a")):
            sent = [clients[sender].publish(f"access/{receiver}", n.to_bytes(4, "big"), qos)
                    for n in range(MESSAGES)]
            for info in sent:
                info.wait_for_publish(10)
        deadline = time.monotonic() + 10
        while sum(c.total() for c in arrived.values()) < 2 * MESSAGES and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)   # window: a late duplicate would show up within it
    finally:
        for client in clients.values():
            client.disconnect()
            client.loop_stop()
    return arrived


@pytest.fixture
def deployed() -> Iterator:
    """deployed(name, access) -> (backend, endpoint); torn down after the test."""
    started = []

    def deploy(name: str, run_access: BrokerAccess) -> tuple[AccessBackend, Endpoint]:
        if (reason := unavailable_reason(name)) is not None:
            pytest.skip(f"{name} cannot run here: {reason}")
        backend = create_backend(name)
        assert isinstance(backend, AccessBackend)
        started.append(backend)
        backend.configure_access(run_access)
        return backend, backend.deploy({"sys_topics": False}, LocalHost())

    yield deploy
    for backend in started:
        backend.teardown()


def check_delivery_and_refusal(backend: AccessBackend, endpoint: Endpoint, transport: str,
                               wrong: str) -> None:
    """Both ways at QoS 0 and 1, a refused wrong password, and the record's listener."""
    assert endpoint.scheme == {"tcp": "mqtt", "tls": "mqtts", "ws": "ws",
                               "wss": "wss"}[transport]
    if transport in ("tls", "wss"):
        assert endpoint.tls is not None and "BEGIN CERTIFICATE" in (endpoint.tls.ca_pem or "")
    for qos in (0, 1):
        for receiver, counts in both_ways(endpoint, qos).items():
            assert sorted(counts) == list(range(MESSAGES)), f"QoS {qos} to {receiver}: lost"
            assert set(counts.values()) == {1}, f"QoS {qos} to {receiver}: duplicated"
    assert connack(endpoint, "wrong-password") == wrong
    record = backend.deployment()
    assert record.access is not None and record.access.username == USER
    assert record.access.transport == ListenerTransport(transport)
    assert PASSWORD not in record.model_dump_json() and "Pa55" not in (record.config or "")


@pytest.mark.integration  # nats-server
@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_nats_carries_messages_both_ways_with_a_user_and_refuses_a_wrong_password(
        deployed, transport):
    backend, endpoint = deployed("nats", access(transport))
    check_delivery_and_refusal(backend, endpoint, transport, "Not authorized")


@pytest.mark.integration  # amqtt (the brokers extra)
@pytest.mark.parametrize("transport", ["tcp", "tls", "ws", "wss"])
def test_amqtt_carries_messages_both_ways_with_a_user_and_refuses_a_wrong_password(
        deployed, transport):
    backend, endpoint = deployed("amqtt", access(transport))
    check_delivery_and_refusal(backend, endpoint, transport, "Not authorized")


@pytest.mark.integration  # activemq, libmqtt-client-java
@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_activemq_carries_messages_both_ways_with_a_user_and_refuses_a_wrong_password(
        deployed, transport):
    backend, endpoint = deployed("activemq", access(transport))
    check_delivery_and_refusal(backend, endpoint, transport, "Not authorized")


@pytest.mark.integration  # ejabberd
@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_ejabberd_carries_messages_both_ways_with_a_user_and_refuses_a_wrong_password(
        deployed, transport):
    backend, endpoint = deployed("ejabberd", access(transport, protocol="5"))
    check_delivery_and_refusal(backend, endpoint, transport, "Not authorized")
    for qos in (0, 1):   # and over MQTT 5, which it declares
        for receiver, counts in both_ways(endpoint, qos, mqtt.MQTTv5).items():
            assert sorted(counts) == list(range(MESSAGES)), f"v5 QoS {qos} to {receiver}"


@pytest.mark.integration  # rabbitmq-server: ~10-20 s per start, one per transport
@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.xdist_group("rabbitmq")   # one RabbitMQ boot at a time: each takes a core
@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["tls", "ws", "wss"])
def test_rabbitmq_carries_messages_both_ways_with_a_user_and_refuses_a_wrong_password(
        deployed, transport):
    backend, endpoint = deployed("rabbitmq", access(transport))
    # RabbitMQ's MQTT listener answers a wrong password with CONNACK 4; its web_mqtt
    # plugin closes the WebSocket without a CONNACK
    wrong = "Bad user name or password" if transport == "tls" else "closed without a CONNACK"
    check_delivery_and_refusal(backend, endpoint, transport, wrong)
