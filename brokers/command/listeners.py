"""A named broker's listener as a run asks for it: TLS, WebSocket, users.

Each third-party broker says it its own way; a :class:`ListenerConfig` per broker turns
the run's :class:`~mqttbed.core.backends.BrokerAccess` into

- the config text: the preset's base config (``presets.py``) and this listener's lines,
  holding paths and placeholders only, never a secret (the config is recorded verbatim);
- private files in the run's directory (0600, made the broker's account's, removed with
  it): the throwaway CA, server certificate and key (:mod:`mqttbed.brokers.certificates`)
  and the broker's user file, with the password hashed where the broker reads a hash
  (RabbitMQ, NATS, amqtt, ejabberd's checker) and in clear only where it reads nothing
  else (ActiveMQ's properties file);
- environment (RabbitMQ's plugins) and what the endpoint says (CA, WebSocket path).

A run that asks what the broker cannot do is refused naming the spec field and why.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from pydantic import SecretStr

from mqttbed.brokers.certificates import ServerTls
from mqttbed.brokers.command import presets
from mqttbed.core.backends import BrokerAccess, BrokerFeatures
from mqttbed.core.broker_access import DEFAULT_WEBSOCKET_PATH, ListenerTransport
from mqttbed.core.errors import BackendError

# The files of a listener, in the run's directory ({dir}).
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "server.crt", "server.key"
# names the server certificate carries beside the listen address
CERTIFICATE_NAMES = ("localhost",)


@dataclass(frozen=True)
class ListenerPlan:
    """What one deploy writes and renders for its listener."""

    config_template: str
    # name in the run's directory -> its text (each written 0600)
    private_files: dict[str, SecretStr] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


class ListenerConfig(ABC):
    """How one broker is told its listener and users (see the module docstring)."""

    broker: str                # as messages name it, e.g. "RabbitMQ 3.10"
    base_config: str           # the preset's config without its listener
    plain_config: str          # the preset's whole config on plain TCP

    def __init__(self, features: BrokerFeatures) -> None:
        self.features = features

    def check(self, access: BrokerAccess) -> None:
        """Refuse what this broker cannot be configured for, naming the spec field."""
        why = f" ({self.features.note})" if self.features.note else ""
        if access.protocol not in self.features.protocols:
            raise BackendError(f"workload.protocol {access.protocol!r}: {self.broker} speaks "
                               f"MQTT {', '.join(sorted(self.features.protocols))} only{why}")
        if access.transport not in self.features.transports:
            raise BackendError(
                f"broker.transport {access.transport.value!r}: {self.broker} is configured "
                f"for {', '.join(sorted(t.value for t in self.features.transports))} "
                f"only{why}")
        if access.auth is not None and access.password is None:
            raise BackendError(f"broker.auth: user {access.auth.username!r} has no password; "
                               f"{self.broker}'s user needs one: give broker.auth.password_file "
                               "or broker.auth.password_env")
        if access.auth is not None and ":" in access.auth.username:
            raise BackendError(f"broker.auth.username {access.auth.username!r}: mqttbed "
                               f"writes {self.broker}'s users as name:secret lines, so the "
                               "name cannot contain ':'")
        tls = access.tls
        if tls is not None and tls.ca_file is not None:
            raise BackendError(
                f"broker.tls.ca_file {tls.ca_file!r}: {self.broker}'s certificate is signed "
                "by the CA mqttbed makes for each run, which the agents are given; ca_file is "
                "for a broker mqttbed does not start (backend external)")
        if tls is not None and tls.cert_file is not None:
            raise BackendError(
                f"broker.tls.cert_file {tls.cert_file!r}: mqttbed does not configure "
                f"{self.broker} to require client certificates (backend mosquitto does)")

    def plan(self, access: BrokerAccess) -> ListenerPlan:
        """The config template, files and environment of a run with ``access``."""
        files: dict[str, SecretStr] = {}
        if access.auth is not None:
            assert access.password is not None   # check() refused a user without one
            name, text = self.user_file(access.auth.username, access.password)
            files[name] = text
        return ListenerPlan(self.base_config + self.listener(access), files, self.env(access))

    @abstractmethod
    def listener(self, access: BrokerAccess) -> str:
        """The listener's (and users') config lines, with placeholders."""

    @abstractmethod
    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        """The broker's file of the run's one user: its name in {dir}, and its text."""

    def env(self, access: BrokerAccess) -> dict[str, str]:
        """Environment the listener needs beyond the preset's."""
        return {}

    def tls_files(self, tls: ServerTls) -> dict[str, bytes]:
        """Files beyond the PEM ones the broker reads its certificate from (name -> data)."""
        return {}

    def websocket_path(self, access: BrokerAccess) -> str | None:
        """The endpoint's WebSocket path (None: not a WebSocket listener)."""
        return DEFAULT_WEBSOCKET_PATH if access.transport.websocket else None


def _salted(password: SecretStr, salt: bytes, hash_name: str = "sha256") -> bytes:
    return hashlib.new(hash_name, salt + password.get_secret_value().encode()).digest()


# -- RabbitMQ -----------------------------------------------------------------------------

class RabbitMqListener(ListenerConfig):
    """``mqtt.listeners.ssl`` with ``ssl_options``, the ``rabbitmq_web_mqtt`` plugin for
    ws/wss, and a user from a definitions file (a salted SHA-256 hash, loaded at boot)."""

    broker = "RabbitMQ 3.10"
    base_config = presets.RABBITMQ_BASE_CONFIG
    plain_config = presets.RABBITMQ_BASE_CONFIG + presets.RABBITMQ_PLAIN_LISTENER
    DEFINITIONS = "definitions.json"

    def listener(self, access: BrokerAccess) -> str:
        transport = access.transport
        lines = ["# the listener mqttbed configured for this run"]
        if transport == ListenerTransport.TCP:
            lines.append("mqtt.listeners.tcp.1 = 127.0.0.1:{port}")
        else:
            lines.append("mqtt.listeners.tcp = none")
        if transport == ListenerTransport.TLS:
            lines += ["mqtt.listeners.ssl.1 = 127.0.0.1:{port}",
                      *self._tls("ssl_options")]
        if transport == ListenerTransport.WS:
            lines += ["web_mqtt.tcp.ip = 127.0.0.1", "web_mqtt.tcp.port = {port}"]
        if transport == ListenerTransport.WSS:
            lines += ["web_mqtt.tcp.listener = none", "web_mqtt.ssl.ip = 127.0.0.1",
                      "web_mqtt.ssl.port = {port}", *self._tls("web_mqtt.ssl")]
        if transport.websocket:
            lines.append(f"web_mqtt.ws_path = {DEFAULT_WEBSOCKET_PATH}")
        if access.auth is None:
            lines.append("mqtt.allow_anonymous = true")
        else:
            # With definitions loaded at boot RabbitMQ creates no default guest user.
            lines += ["mqtt.allow_anonymous = false",
                      f"load_definitions = {{dir}}/{self.DEFINITIONS}"]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _tls(prefix: str) -> list[str]:
        # (verify_none: the clients prove nothing with a certificate; they check the server)
        return [f"{prefix}.cacertfile = {{dir}}/{CA_FILE}",
                f"{prefix}.certfile = {{dir}}/{CERT_FILE}",
                f"{prefix}.keyfile = {{dir}}/{KEY_FILE}",
                *([f"{prefix}.verify = verify_none",
                   f"{prefix}.fail_if_no_peer_cert = false"]
                  if prefix == "ssl_options" else [])]

    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        # rabbit_password_hashing_sha256: base64(salt + sha256(salt + password)), 4-byte salt
        salt = os.urandom(4)
        definitions = {
            "users": [{"name": username, "tags": "",
                       "hashing_algorithm": "rabbit_password_hashing_sha256",
                       "password_hash": base64.b64encode(
                           salt + _salted(password, salt)).decode()}],
            "vhosts": [{"name": "/"}],
            "permissions": [{"user": username, "vhost": "/", "configure": ".*",
                             "write": ".*", "read": ".*"}],
        }
        return self.DEFINITIONS, SecretStr(json.dumps(definitions, indent=1))

    def env(self, access: BrokerAccess) -> dict[str, str]:
        if access.transport.websocket:
            return {"RABBITMQ_ENABLED_PLUGINS": "rabbitmq_mqtt,rabbitmq_web_mqtt"}
        return {}


# -- NATS ---------------------------------------------------------------------------------

class NatsListener(ListenerConfig):
    """The ``mqtt`` block's ``tls`` and an ``authorization`` block (a bcrypt hash) in a file
    the config includes."""

    broker = "nats-server 2.9"
    base_config = presets.NATS_BASE_CONFIG
    plain_config = presets.NATS_BASE_CONFIG + presets.NATS_PLAIN_LISTENER
    USERS = "mqtt-users.conf"

    def listener(self, access: BrokerAccess) -> str:
        lines = ["# the listener mqttbed configured for this run", "mqtt {",
                 "    listen: 127.0.0.1:{port}"]
        if access.transport.tls:
            lines += ["    tls {", f'        cert_file: "{{dir}}/{CERT_FILE}"',
                      f'        key_file: "{{dir}}/{KEY_FILE}"', "    }"]
        if access.auth is not None:
            # (an include is read relative to the config's directory: the run's)
            lines.append(f'    include "{self.USERS}"')
        return "\n".join([*lines, "}"]) + "\n"

    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        # bcrypt comes with paramiko (fabric, the controller extra); NATS reads $2a$ hashes
        import bcrypt

        hashed = bcrypt.hashpw(password.get_secret_value().encode(), bcrypt.gensalt()).decode()
        return self.USERS, SecretStr(f"authorization {{\n    username: {json.dumps(username)}\n"
                                     f"    password: {json.dumps(hashed)}\n}}\n")


# -- amqtt --------------------------------------------------------------------------------

class AmqttListener(ListenerConfig):
    """A ``tcp`` or ``ws`` listener with ``ssl`` on or off, and its ``FileAuthPlugin`` with
    an Argon2 hash (what amqtt 0.12 verifies)."""

    broker = "amqtt 0.12"
    base_config = presets.AMQTT_BASE_CONFIG
    plain_config = presets.AMQTT_BASE_CONFIG + presets.AMQTT_PLAIN_LISTENER
    PASSWORDS = "passwords"

    def listener(self, access: BrokerAccess) -> str:
        lines = ["listeners:", "  default:",
                 f"    type: {'ws' if access.transport.websocket else 'tcp'}",
                 "    bind: 127.0.0.1:{port}"]
        if access.transport.tls:
            lines += ["    ssl: true", f"    certfile: {{dir}}/{CERT_FILE}",
                      f"    keyfile: {{dir}}/{KEY_FILE}"]
        lines.append("plugins:")
        if access.auth is None:
            lines += ["  amqtt.plugins.authentication.AnonymousAuthPlugin:",
                      "    allow_anonymous: true"]
        else:
            lines += ["  amqtt.plugins.authentication.FileAuthPlugin:",
                      f"    password_file: {{dir}}/{self.PASSWORDS}"]
        return "\n".join(lines) + "\n"

    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        # amqtt's own hasher (pwdlib, an amqtt dependency): installed wherever amqtt is
        from pwdlib.hashers.argon2 import Argon2Hasher

        return self.PASSWORDS, SecretStr(
            f"{username}:{Argon2Hasher().hash(password.get_secret_value())}\n")


# -- ActiveMQ -----------------------------------------------------------------------------

class ActiveMqListener(ListenerConfig):
    """``mqtt+ssl`` with a PKCS#12 key store made per run, and the simple
    authentication plugin reading its user from a properties file (Spring placeholders:
    the XML names them, the 0600 file holds them)."""

    broker = "ActiveMQ 5.17"
    base_config = presets.ACTIVEMQ_CONFIG_HEAD
    plain_config = (presets.ACTIVEMQ_CONFIG_HEAD + presets.ACTIVEMQ_BROKER_OPEN
                    + presets.ACTIVEMQ_PLAIN_LISTENER + presets.ACTIVEMQ_CONFIG_TAIL)
    CREDENTIALS = "credentials.properties"
    KEY_STORE = "server.p12"
    # The key store's password guards nothing the file mode (0600, in a 0700 directory)
    # does not: Java's PKCS#12 loader wants one.
    KEY_STORE_PASSWORD = "mqttbed-throwaway"

    def check(self, access: BrokerAccess) -> None:
        super().check(access)
        if access.password is not None and "${" in access.password.get_secret_value():
            raise BackendError("broker.auth: the password holds '${', which ActiveMQ's Spring "
                               "config would read as a placeholder; choose another password")

    def listener(self, access: BrokerAccess) -> str:
        parts = []
        if access.auth is not None:
            parts.append(
                '  <bean class="org.springframework.beans.factory.config.'
                'PropertyPlaceholderConfigurer">\n'
                f'    <property name="location" value="file:{{dir}}/{self.CREDENTIALS}"/>\n'
                "  </bean>\n")
        parts.append(presets.ACTIVEMQ_BROKER_OPEN)
        if access.auth is not None:
            parts.append(
                "    <plugins>\n"
                '      <simpleAuthenticationPlugin anonymousAccessAllowed="false">\n'
                "        <users>\n"
                '          <authenticationUser username="${mqttbed.username}"\n'
                '                              password="${mqttbed.password}" groups="users"/>\n'
                "        </users>\n"
                "      </simpleAuthenticationPlugin>\n"
                "    </plugins>\n")
        scheme = "mqtt+nio"
        if access.transport.tls:
            # mqtt+ssl (a thread per connection), not mqtt+nio+ssl: over the latter, paho's
            # CONNECT was answered but its SUBSCRIBE right after never was (5.17.2 here)
            scheme = "mqtt+ssl"
            parts.append(
                "    <sslContext>\n"
                f'      <sslContext keyStore="file:{{dir}}/{self.KEY_STORE}"\n'
                f'                  keyStorePassword="{self.KEY_STORE_PASSWORD}" '
                'keyStoreType="pkcs12"/>\n'
                "    </sslContext>\n")
        parts.append("    <transportConnectors>\n"
                     f'      <transportConnector name="mqtt" uri="{scheme}://127.0.0.1:{{port}}"/>\n'
                     "    </transportConnectors>\n")
        parts.append(presets.ACTIVEMQ_CONFIG_TAIL)
        return "".join(parts)

    def tls_files(self, tls: ServerTls) -> dict[str, bytes]:
        key = serialization.load_pem_private_key(tls.key_file.read_bytes(), None)
        cert = x509.load_pem_x509_certificate(tls.cert_file.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey)   # brokers.certificates' kind
        return {self.KEY_STORE: pkcs12.serialize_key_and_certificates(
            b"server", key, cert, None,
            serialization.BestAvailableEncryption(self.KEY_STORE_PASSWORD.encode()))}

    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        # The simple authentication plugin compares passwords in clear: no hash it reads.
        return self.CREDENTIALS, SecretStr(
            f"mqttbed.username={_properties_value(username)}\n"
            f"mqttbed.password={_properties_value(password.get_secret_value())}\n")


def _properties_value(text: str) -> str:
    """``text`` as a java.util.Properties value: everything but plain ASCII escaped."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.@+/,;")
                   else f"\\u{ord(c):04x}" for c in text)


# -- ejabberd -----------------------------------------------------------------------------

class EjabberdListener(ListenerConfig):
    """mod_mqtt's listener with ``tls: true`` and ``certfiles``, and ``auth_method:
    external`` with mqttbed's checker (:mod:`.ejabberd_auth`) reading a PBKDF2 hash."""

    broker = "ejabberd 23.01"
    base_config = presets.EJABBERD_BASE_CONFIG
    plain_config = presets.EJABBERD.config_template or ""
    USERS = "users"

    def check(self, access: BrokerAccess) -> None:
        super().check(access)
        if access.auth is None:
            raise BackendError(
                "broker.auth is missing: ejabberd 23.01's mod_mqtt refuses every CONNECT "
                "without a password (only a TLS client certificate stands in for one); give "
                "broker.auth with a username and password_file or password_env")

    def listener(self, access: BrokerAccess) -> str:
        checker = " ".join([sys.executable, "-m", "mqttbed.brokers.command.ejabberd_auth",
                            f"{{dir}}/{self.USERS}"])
        lines = []
        if access.transport.tls:
            lines += ["certfiles:", f"  - {{dir}}/{CERT_FILE}", f"  - {{dir}}/{KEY_FILE}"]
        lines += ["auth_method: [external]", f"extauth_program: {json.dumps(checker)}",
                  "extauth_pool_size: 1", "auth_use_cache: false",
                  "listen:", "  -", "    port: {port}", "    ip: 127.0.0.1",
                  "    module: mod_mqtt", "    backlog: 1000"]
        if access.transport.tls:
            lines.append("    tls: true")
        return "\n".join(lines) + "\n" + presets.EJABBERD_MODULES

    def user_file(self, username: str, password: SecretStr) -> tuple[str, SecretStr]:
        from mqttbed.brokers.command.ejabberd_auth import hash_line

        return self.USERS, SecretStr(hash_line(username, password.get_secret_value()) + "\n")


# preset name -> its listener's configurer
LISTENERS: dict[str, type[ListenerConfig]] = {
    "rabbitmq": RabbitMqListener,
    "nats": NatsListener,
    "amqtt": AmqttListener,
    "activemq": ActiveMqListener,
    "ejabberd": EjabberdListener,
}


def listener_config(preset_name: str) -> ListenerConfig:
    """The listener configurer of a preset, with the preset's declared features."""
    return LISTENERS[preset_name](presets.preset(preset_name).features)
