"""How clients reach a broker as it is deployed: TLS, WebSocket, MQTT version, credentials.

The spec says it once, in the broker section (``broker.tls``, ``broker.auth``,
``broker.transport``) and the workload (``workload.protocol``); the controller resolves it
per run into what travels to the agents: the endpoint's :class:`EndpointTls` and
``websocket_path`` (public: a CA certificate, a server name) and the assignment's
:class:`ClientCredentials` (secret: a password, a client key).

A secret is a :class:`pydantic.SecretStr` that serializes as ``**********`` everywhere
(a stored spec, a database row, a log, a run record, the results, an export), except in
the one place it must travel: the agent protocol's commands, dumped with
``context=REVEAL_SECRETS`` (:func:`reveal_secrets_context`). The spec never holds a
secret at all, only where to read it (``password_file`` or ``password_env``), read when a
run starts.
"""

from __future__ import annotations

import os
import secrets
import stat
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    SerializationInfo,
    model_validator,
)

from mqttbed.core.errors import MqttbedError

MqttProtocol = Literal["3.1.1", "5"]
MQTT_PROTOCOLS: tuple[str, ...] = ("3.1.1", "5")
DEFAULT_WEBSOCKET_PATH = "/mqtt"
# The serialization context under which a Secret's value is written (agent commands only).
REVEAL_SECRETS = "mqttbed.reveal_secrets"
MASK = "**********"
# broker.auth.generate_password: 24 random bytes, 32 URL-safe characters
GENERATED_PASSWORD_BYTES = 24


def reveal_secrets_context() -> dict[str, bool]:
    """The ``context=`` of a dump that must carry secrets' values (the agent protocol)."""
    return {REVEAL_SECRETS: True}


def _secret_value(value: SecretStr, info: SerializationInfo) -> str:
    if isinstance(info.context, dict) and info.context.get(REVEAL_SECRETS):
        return value.get_secret_value()
    return MASK


# A secret: masked in every dump but one made with reveal_secrets_context().
Secret = Annotated[SecretStr, PlainSerializer(_secret_value, return_type=str)]


class SecretUnavailable(MqttbedError):
    """A password or key cannot be read; the message names the file or variable, never
    the value."""


class ListenerTransport(StrEnum):
    """What a broker's listener speaks under MQTT (``broker.transport``)."""

    TCP = "tcp"
    TLS = "tls"
    WS = "ws"
    WSS = "wss"

    @property
    def tls(self) -> bool:
        """Whether the stream is TLS (tls, wss)."""
        return self in (ListenerTransport.TLS, ListenerTransport.WSS)

    @property
    def websocket(self) -> bool:
        """Whether MQTT rides in WebSocket frames (ws, wss)."""
        return self in (ListenerTransport.WS, ListenerTransport.WSS)


class TlsSettings(BaseModel):
    """``broker.tls``: how the agents (and mqttbed's own probes) verify the broker and,
    optionally, prove who they are with a client certificate."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ca_file: str | None = Field(
        None, description="PEM file of the CA(s) that signed the broker's certificate; "
                          "default: the system's CAs (external) or the CA mqttbed made for "
                          "the run (a managed broker)")
    cert_file: str | None = Field(None, description="PEM client certificate (with key_file)")
    key_file: str | None = Field(None, description="PEM private key of cert_file (secret: "
                                                   "read when a run starts, never stored)")
    server_name: str | None = Field(
        None, min_length=1, max_length=253,
        description="the name sent as SNI and verified in the certificate; default: the "
                    "broker's host")
    verify: bool = Field(True, description="verify the broker's certificate chain and name "
                                           "(false only for a lab broker: the run records it)")

    @model_validator(mode="after")
    def _cert_with_key(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            given = "cert_file" if self.cert_file is not None else "key_file"
            raise ValueError(f"broker.tls.{given} is given alone: a client certificate needs "
                             "both cert_file and key_file")
        return self


class AuthSettings(BaseModel):
    """``broker.auth``: the user name every client sends in CONNECT, and where its
    password is read when a run starts (a file, or an environment variable of the
    controller)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    username: str = Field(min_length=1, max_length=65535, description="CONNECT's user name")
    password_file: str | None = Field(
        None, min_length=1, description="a file whose first line is the password")
    password_env: str | None = Field(
        None, min_length=1, description="an environment variable (of the controller) "
                                        "holding the password")
    generate_password: bool = Field(
        False, description="a random password made when each run starts, for a broker "
                           "mqttbed starts (it configures the user): credentials are "
                           "measured without a secret to keep")

    @model_validator(mode="after")
    def _one_source(self) -> AuthSettings:
        sources = [name for name in ("password_file", "password_env") if getattr(self, name)]
        if self.generate_password:
            sources.append("generate_password")
        if len(sources) > 1:
            raise ValueError(f"broker.auth: give one of password_file, password_env and "
                             f"generate_password, not {' and '.join(sources)}")
        return self

    def read_password(self) -> SecretStr | None:
        """The password (None: a user name alone); raises SecretUnavailable naming the
        file or variable."""
        if self.password_env is not None:
            value = os.environ.get(self.password_env)
            if value is None:
                raise SecretUnavailable(f"broker.auth.password_env: the environment variable "
                                        f"{self.password_env} is not set")
            return SecretStr(value)
        if self.password_file is not None:
            text = read_secret_file(self.password_file, "broker.auth.password_file")
            return SecretStr(text.splitlines()[0])
        if self.generate_password:
            return SecretStr(secrets.token_urlsafe(GENERATED_PASSWORD_BYTES))
        return None


# A password, a key or a CA bundle is far smaller; a spec naming /dev/zero or a FIFO must
# not make the controller read forever (the spec may come over REST).
MAX_SECRET_FILE_BYTES = 1 << 20


def read_secret_file(path: str, field: str) -> str:
    """The text of a secret's file; raises SecretUnavailable naming ``field`` and the path
    (never the content)."""
    try:
        file = Path(path).expanduser()
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnavailable(f"{field} {path!r} cannot be read: not a regular file")
        if info.st_size > MAX_SECRET_FILE_BYTES:
            raise SecretUnavailable(f"{field} {path!r} cannot be read: {info.st_size:,} "
                                    f"bytes, more than the {MAX_SECRET_FILE_BYTES:,} a "
                                    "password, key or certificate file may have")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SecretUnavailable(f"{field} {path!r} cannot be read: {reason}") from None
    if not text.strip():
        raise SecretUnavailable(f"{field} {path!r} is empty")
    return text


def read_public_file(path: str, field: str) -> str:
    """The text of a certificate file (PEM); raises SecretUnavailable naming the path."""
    return read_secret_file(path, field)


class EndpointTls(BaseModel):
    """TLS as a client of this endpoint speaks it (public: travels in the clear)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ca_pem: str | None = Field(None, description="the CA certificates trusted (PEM); None: "
                                                 "the system's")
    server_name: str | None = Field(None, description="SNI and the name verified; None: "
                                                      "the endpoint's host")
    verify: bool = True


class ClientCredentials(BaseModel):
    """What every client of a run proves itself with (an assignment's; secrets masked in
    every dump but the agent protocol's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    username: str | None = None
    password: Secret | None = None
    cert_pem: str | None = Field(None, description="client certificate (PEM)")
    key_pem: Secret | None = Field(None, description="its private key (PEM)")

    def password_bytes(self) -> bytes | None:
        """The password as CONNECT carries it (UTF-8), or None."""
        return None if self.password is None else self.password.get_secret_value().encode()


def read_client_credentials(auth: AuthSettings | None, password: SecretStr | None,
                            tls: TlsSettings | None) -> ClientCredentials | None:
    """What every client of a run proves itself with: ``auth``'s user name and the
    ``password`` read for it, ``tls``'s client certificate and key (read now); None for
    anonymous clients without a certificate.

    The controller gives it to the agents; a backend's own clients (deploy probe, ``$SYS``
    sampler) present it too. Raises SecretUnavailable naming the file."""
    username = None if auth is None else auth.username
    cert_pem: str | None = None
    key_pem: SecretStr | None = None
    if tls is not None and tls.cert_file is not None:
        assert tls.key_file is not None   # TlsSettings takes them together
        cert_pem = read_public_file(tls.cert_file, "broker.tls.cert_file")
        key_pem = SecretStr(read_secret_file(tls.key_file, "broker.tls.key_file"))
    if username is None and cert_pem is None:
        return None
    return ClientCredentials(username=username, password=password, cert_pem=cert_pem,
                             key_pem=key_pem)


class ConnectPhases(BaseModel):
    """How one client's connection was made, each phase timed on the agent's monotonic
    clock (ns; None: the phase did not happen on this transport, or did not end)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    client_id: str
    t_start_ns: int = Field(description="when connect() was called")
    tcp_ns: int | None = Field(None, description="TCP connect: SYN to established")
    tls_ns: int | None = Field(None, description="TLS handshake: ClientHello to finished")
    websocket_ns: int | None = Field(None, description="WebSocket upgrade: GET to 101")
    connack_ns: int | None = Field(None, description="CONNECT written to CONNACK read")

