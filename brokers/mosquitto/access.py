"""A managed Mosquitto's listener as a run asks for it: TLS, WebSocket, a password file.

The run's :class:`~mqttbed.core.backends.BrokerAccess` becomes lines of the broker's config
and files in its private directory, made per deploy and removed with it:

- ``tls``/``wss``: a throwaway CA and a server certificate for the listen address and
  ``localhost`` (:mod:`mqttbed.brokers.certificates`); the key is 0600. TLS versions are
  Mosquitto's default (1.2 and 1.3). A client certificate (``broker.tls.cert_file``) makes
  the listener require one, trusting the certificates in that file.
- ``auth``: ``allow_anonymous false`` and a password file holding one ``$7$`` line
  (PBKDF2-SHA512, Mosquitto 2.0's own format), hashed here: the password never reaches a
  command line (``mosquitto_passwd -b`` would put it in ``/proc/PID/cmdline``, readable
  by every user) nor a file in clear.
- ``ws``/``wss``: ``protocol websockets`` on the measured listener, if the binary has
  WebSocket support (:func:`websockets_verdict`), plus a plain MQTT listener on the same
  address: Mosquitto 2.0.11 exits ("Unable to start any listening sockets") when its only
  listener is a WebSocket one; mqttbed's ``$SYS`` sampler uses it.
- the deploy probe (:func:`probe`) reaches the measured listener as the agents will:
  through its TLS and WebSocket, in the run's MQTT version, as the run's user.
- MQTT 5: nothing to configure; Mosquitto 2.0 speaks 3.1.1 and 5 on every listener.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from pydantic import SecretStr

from mqttbed.brokers import reachability
from mqttbed.brokers.certificates import CertificateAuthority
from mqttbed.brokers.reachability import Unreachable
from mqttbed.core.backends import AccessRecord, BrokerAccess
from mqttbed.core.broker_access import (
    DEFAULT_WEBSOCKET_PATH,
    ClientCredentials,
    EndpointTls,
    MqttProtocol,
    read_public_file,
)
from mqttbed.core.errors import BackendError
from mqttbed.core.protocol import Endpoint

# Mosquitto 2.0's password hash: PBKDF2-HMAC-SHA512, its default iterations and salt size
# (what `mosquitto_passwd` writes: "$7$101$<salt base64>$<hash base64>").
PASSWORD_HASH_ITERATIONS = 101
PASSWORD_SALT_BYTES = 12
# A config the binary parses up to its third line: one built without WebSockets stops at
# the second ("Websockets support not available"); one with it at the third (unknown
# variable). Nothing binds: the parse fails before any listener opens.
WEBSOCKETS_PROBE_CONFIG = ("listener 1 127.0.0.1\nprotocol websockets\n"
                           "mqttbed_websockets_probe true\n")
WEBSOCKETS_ABSENT = "Websockets support not available"
WEBSOCKETS_PRESENT = 'Unknown configuration variable "mqttbed_websockets_probe"'
# names the server certificate always carries beside the listen address
CERTIFICATE_NAMES = ("localhost",)
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ListenerFiles:
    """What a deploy wrote for its listener: paths as the broker sees them, and the CA
    its clients trust."""

    ca_file: PurePath | None = None
    cert_file: PurePath | None = None
    key_file: PurePath | None = None
    password_file: PurePath | None = None
    ca_pem: str | None = None
    require_certificate: bool = False


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM texts of one deploy's TLS files (written here or copied to a lab host)."""

    ca_pem: str       # the CA the broker trusts for client certificates too
    trusted_pem: str  # what the broker's cafile holds: the CA, and any client cert's chain
    cert_pem: str
    key_pem: SecretStr


def check_access(access: BrokerAccess, websockets: Callable[[], str | None]) -> None:
    """Refuse what this backend cannot configure, naming the spec field and why.

    ``websockets()`` says why the binary cannot serve WebSocket, or None if it can; it is
    asked only for ws and wss."""
    if access.protocol not in ("3.1.1", "5"):
        raise BackendError(f"workload.protocol {access.protocol!r}: Mosquitto speaks MQTT "
                           "3.1.1 and 5")
    if access.tls is not None and not access.transport.tls:
        raise BackendError(f"broker.tls is given but broker.transport is "
                           f"{str(access.transport)!r}: set broker.transport to tls or wss")
    if access.tls is not None and access.tls.ca_file is not None:
        raise BackendError(
            f"broker.tls.ca_file {access.tls.ca_file!r}: a managed Mosquitto's certificate "
            "is signed by the CA mqttbed makes for each run, which the agents are given; "
            "ca_file is for a broker mqttbed does not start (backend external)")
    if access.transport.websocket:
        reason = websockets()
        if reason is not None:
            raise BackendError(f"broker.transport {str(access.transport)!r}: {reason}")
    if access.auth is not None:
        check_username(access.auth.username)
        if access.password is None:
            raise BackendError(
                f"broker.auth: user {access.auth.username!r} has no password; a managed "
                "Mosquitto's password file needs one: give broker.auth.password_file or "
                "broker.auth.password_env")


def check_username(username: str) -> None:
    """A user name a password file can hold (one ``name:hash`` line)."""
    if ":" in username or any(ord(c) < 0x20 or c == "\x7f" for c in username):
        raise BackendError(f"broker.auth.username {username!r}: a Mosquitto password file "
                           "holds `name:hash` lines, so the name cannot contain ':' nor a "
                           "control character")


def password_line(username: str, password: SecretStr, salt: bytes | None = None) -> str:
    """The password file's line for ``username`` (``name:$7$101$salt$hash``, no newline)."""
    salt = os.urandom(PASSWORD_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.get_secret_value().encode(), salt,
                                 PASSWORD_HASH_ITERATIONS)
    return (f"{username}:$7${PASSWORD_HASH_ITERATIONS}$"
            f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}")


def tls_material(access: BrokerAccess, address: str) -> TlsMaterial:
    """A fresh CA and server certificate for ``address`` (and ``localhost``, and
    ``broker.tls.server_name``); the broker trusts the client certificate's file too."""
    ca = CertificateAuthority.create()
    cert_pem, key_pem = ca.issue(certificate_names(access, address))
    trusted = ca.cert_pem
    if access.tls is not None and access.tls.cert_file is not None:
        trusted += client_chain(access.tls.cert_file)
    return TlsMaterial(ca.cert_pem, trusted, cert_pem, SecretStr(key_pem))


def certificate_names(access: BrokerAccess, address: str) -> list[str]:
    """The names the server certificate is made for, the listen address first."""
    names = [address, *CERTIFICATE_NAMES]
    if access.tls is not None and access.tls.server_name is not None:
        names.append(access.tls.server_name)
    return list(dict.fromkeys(names))


def client_chain(cert_file: str) -> str:
    """The certificates of ``broker.tls.cert_file`` (PEM), for the broker to trust."""
    text = read_public_file(cert_file, "broker.tls.cert_file")
    try:
        found = x509.load_pem_x509_certificates(text.encode())
    except ValueError as exc:
        raise BackendError(f"broker.tls.cert_file {cert_file!r} holds no PEM certificate: "
                           f"{exc}") from None
    return "".join(cert.public_bytes(Encoding.PEM).decode() for cert in found)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file readable by its owner only (a key, a password hash)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def listener_lines(access: BrokerAccess, port: int, address: str, files: ListenerFiles,
                   max_connections: int) -> list[str]:
    """The measured listener's lines (``listener`` first, then what applies to it)."""
    lines = [f"listener {port} {address}", f"max_connections {max_connections}"]
    if access.transport.websocket:
        lines.append("protocol websockets")
    if files.cert_file is not None:
        lines += [f"cafile {files.ca_file}", f"certfile {files.cert_file}",
                  f"keyfile {files.key_file}"]
        if files.require_certificate:
            lines.append("require_certificate true")
    return lines


def security_lines(files: ListenerFiles) -> list[str]:
    """The broker-wide lines: who may connect."""
    if files.password_file is None:
        return ["allow_anonymous true"]
    return ["allow_anonymous false", f"password_file {files.password_file}"]


def plain_listener_lines(plain_port: int | None, address: str) -> list[str]:
    """The plain MQTT listener beside a WebSocket one; last in the config, so no line
    meant for the measured listener applies to it."""
    if plain_port is None:
        return []
    return ["# plain MQTT beside the WebSocket listener: Mosquitto 2.0.11 starts none "
            "with WebSocket listeners alone; mqttbed's $SYS sampler uses it",
            f"listener {plain_port} {address}"]


def endpoint_tls(access: BrokerAccess, files: ListenerFiles) -> EndpointTls | None:
    """How the agents verify the listener: the run's CA alone, by the endpoint's host
    (or ``broker.tls.server_name``)."""
    if not access.transport.tls:
        return None
    verify = True if access.tls is None else access.tls.verify
    server_name = None if access.tls is None else access.tls.server_name
    return EndpointTls(ca_pem=files.ca_pem, server_name=server_name, verify=verify)


def websocket_path(access: BrokerAccess) -> str | None:
    """The endpoint's WebSocket path (Mosquitto serves MQTT at any path)."""
    return DEFAULT_WEBSOCKET_PATH if access.transport.websocket else None


def websockets_verdict(printed: str, binary: str, version: str) -> str | None:
    """Read the output of the binary on :data:`WEBSOCKETS_PROBE_CONFIG`: None if it has
    WebSocket support, else why it cannot serve ws (a sentence naming the binary)."""
    if WEBSOCKETS_PRESENT in printed:
        return None
    if WEBSOCKETS_ABSENT in printed:
        return (f"this Mosquitto ({binary} {version}) is built without WebSockets; build it "
                "WITH_WEBSOCKETS=yes or measure ws on rabbitmq or amqtt")
    tail = " ".join(printed.split())[-300:] or "nothing"
    return (f"could not tell whether this Mosquitto ({binary} {version}) has WebSocket "
            f"support: on a config with `protocol websockets` it printed {tail!r}")


def record(access: BrokerAccess, address: str, files: ListenerFiles,
           plain_port: int | None) -> AccessRecord:
    """What the deployment record says of the listener (no secret)."""
    return AccessRecord.of(
        access, ca_pem=files.ca_pem,
        certificate_names=certificate_names(access, address) if files.ca_pem else (),
        websocket_path=websocket_path(access), client_certificates=files.require_certificate,
        plain_port=plain_port)


def probe(endpoint: Endpoint, protocol: MqttProtocol, credentials: ClientCredentials | None,
          timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """The listener answers as the run's clients will reach it
    (:func:`mqttbed.brokers.reachability.probe`): the TLS handshake verified with the run's
    CA (presenting the client certificate, if any), the WebSocket upgrade to ``mqtt``, and
    a CONNECT in ``protocol`` with the run's user, accepted. Raises BackendError naming the
    address and the reason (OpenSSL's, the HTTP status, the CONNACK code and the user)."""
    try:
        reachability.probe(endpoint, timeout_s, credentials, protocol)
    except Unreachable as exc:
        raise BackendError(f"mosquitto at {endpoint.url}: {exc.reason}") from None
