"""paho-mqtt clients as a run asks for them: TLS, WebSocket, MQTT 3.1.1 or 5, credentials.

paho is the cross-check the native engine is compared with, so it takes every layer the
engine takes. The session drives paho's sockets from its own selector loop (no paho
threads); this module builds each client and its TLS context, names a refusal, and times
the connection's phases.

TLS: one context per session, :func:`mqttbed.core.client_tls.ssl_context` as every
client of mqttbed makes it (the run's CA or the system's, the client certificate, and
``server_name`` sent and verified in place of the host paho connected to), of a subclass
that times the handshake: it runs it right where paho hands over the established TCP
socket.

Phases (:class:`~mqttbed.agents.connect_times.ConnectTimes`): paho calls ``on_pre_connect``
before it opens the TCP connection, the context's ``wrap_socket`` once it is established,
and ``on_socket_open`` once the socket is ready for MQTT (after TLS and the WebSocket
upgrade), then writes CONNECT. On plain ``ws`` paho opens the TCP connection and upgrades
it inside one call, so neither phase is seen apart: both are None there.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from typing import TYPE_CHECKING, Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from mqttbed.agents.connect_times import ConnectTimes
from mqttbed.agents.mqtt_tcp import connack_refusal
from mqttbed.core.broker_access import ClientCredentials, EndpointTls, MqttProtocol
from mqttbed.core.client_tls import ServerNameContext, describe_tls_error, ssl_context
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import Endpoint
from mqttbed.core.websocket import UpgradeRefused, WebSocketError, upgrade

if TYPE_CHECKING:
    from paho.mqtt.client import SocketLike

# paho hands a 3.1.1 CONNACK's return code over as an MQTT 5 reason code of this name
_V311_CODE_OF_NAME = {"Unsupported protocol version": 1, "Client identifier not valid": 2,
                      "Server unavailable": 3, "Bad user name or password": 4,
                      "Not authorized": 5}


class _TimedContext(ServerNameContext):
    """The run's TLS context (:func:`~mqttbed.core.client_tls.ssl_context`) timing the
    handshake, which it runs at once, right where paho hands over the TCP socket."""

    times: ConnectTimes | None = None  # of the connection being made (one at a time)

    def wrap_socket(self, sock: socket.socket, server_side: bool = False,
                    do_handshake_on_connect: bool = True, suppress_ragged_eofs: bool = True,
                    server_hostname: str | bytes | None = None,
                    session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
        times = self.times
        if times is not None:
            times.t_tcp_done_ns = monotonic_ns()
        wrapped = super().wrap_socket(
            sock, server_side=server_side, do_handshake_on_connect=False,
            suppress_ragged_eofs=suppress_ragged_eofs, server_hostname=server_hostname,
            session=session)
        try:
            wrapped.do_handshake()  # paho's own call after this one finds it done
        except BaseException:
            wrapped.close()  # paho keeps no reference to a socket whose handshake failed
            raise
        if times is not None:
            times.t_tls_done_ns = monotonic_ns()
        return wrapped


def tls_context(tls: EndpointTls, credentials: ClientCredentials | None) -> ssl.SSLContext:
    """The TLS context every client of a session shares, from the run's PEM texts; raises
    ValueError naming the field whose text OpenSSL refused (never a key's content)."""
    return ssl_context(tls, credentials, _TimedContext)


def make_client(client_id: str, endpoint: Endpoint, protocol: MqttProtocol,
                credentials: ClientCredentials | None, context: ssl.SSLContext | None,
                times: ConnectTimes) -> mqtt.Client:
    """A paho client for ``endpoint`` (its TLS through ``context``, WebSocket at its path)
    speaking ``protocol`` with ``credentials``' user name and password; its phases are
    marked on ``times``."""
    transport: Literal["tcp", "websockets"] = (
        "websockets" if endpoint.websocket_path is not None else "tcp")
    if protocol == "5":
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv5, transport=transport)
    else:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv311, clean_session=True, transport=transport)
    if endpoint.websocket_path is not None:
        client.ws_set_options(path=endpoint.websocket_path)
    if context is not None:
        client.tls_set_context(context)
    if credentials is not None and (credentials.username is not None
                                    or credentials.password is not None):
        if credentials.username is None:
            raise ValueError(f"{client_id}: credentials carry a password without a user "
                             "name: broker.auth.username is needed")
        password = (None if credentials.password is None
                    else credentials.password.get_secret_value())
        client.username_pw_set(credentials.username, password)

    def pre_connect(_client: mqtt.Client, _userdata: Any) -> None:
        times.t_tcp_start_ns = monotonic_ns()
        if isinstance(context, _TimedContext):
            context.times = times

    def socket_open(_client: mqtt.Client, _userdata: Any, sock: SocketLike) -> None:
        now = monotonic_ns()
        set_nodelay(sock)
        if transport == "websockets":
            times.t_websocket_done_ns = now
            if context is None:  # plain ws: TCP and the upgrade are one call of paho's
                times.t_tcp_start_ns = None
        elif context is None:
            times.t_tcp_done_ns = now
        times.t_connect_sent_ns = now  # paho writes CONNECT right after this callback

    client.on_pre_connect = pre_connect
    client.on_socket_open = socket_open
    return client


class LastError(logging.Handler):
    """The last error paho logged for one client: paho closes a socket whose read or
    write failed, logs why and returns only a code, so this is where the cause is kept."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


def keep_last_error(client: mqtt.Client, client_id: str) -> LastError:
    """Give ``client`` a logger of its own at ERROR level that keeps the last message
    (nothing is printed; below ERROR paho's logging costs one level check). The logger is
    not registered in :mod:`logging`'s tree: it goes with the client."""
    logger = logging.Logger(f"mqttbed.paho.{client_id}", logging.ERROR)
    logger.propagate = False
    handler = LastError()
    logger.addHandler(handler)
    client.enable_logger(logger)
    return handler


def set_nodelay(sock: SocketLike) -> None:
    """Set TCP_NODELAY on a paho socket: a TCP or TLS socket, or the WebSocket wrapper
    (through a duplicate of its descriptor: an option is the socket's, not the fd's)."""
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return
    with socket.socket(fileno=os.dup(sock.fileno())) as duplicate:
        duplicate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect_kwargs(protocol: MqttProtocol) -> dict[str, Any]:
    """paho connect()'s arguments for the version: MQTT 5 starts a clean session (and,
    without a Session Expiry Interval property, the broker drops it at disconnect)."""
    return {"clean_start": True} if protocol == "5" else {}


def refusal(code: ReasonCode, protocol: MqttProtocol) -> str:
    """A refusing CONNACK named as its version says it: ``return code 4 (bad user name or
    password)`` for 3.1.1, ``reason code 0x86 (Bad user name or password)`` for 5."""
    if protocol == "5":
        return f"reason code {code.value:#04x} ({code.getName()})"
    v311 = _V311_CODE_OF_NAME.get(code.getName())
    return connack_refusal(v311) if v311 is not None else str(code)


def reason_name(code: ReasonCode) -> str:
    """An MQTT 5 reason code with its value and name, e.g. ``0x87 (Not authorized)``."""
    return f"{code.value:#04x} ({code.getName()})"


def connect_failure(exc: BaseException, endpoint: Endpoint, host: str, port: int,
                    context: ssl.SSLContext | None, timeout_s: float,
                    times: ConnectTimes) -> str:
    """Why connect() raised, naming the address, the phase and the cause; a refused
    WebSocket upgrade is asked again to name the HTTP status (paho's error drops it)."""
    where = f"{endpoint.scheme}://{host}:{port}{endpoint.websocket_path or ''}"
    if (context is not None and times.t_tcp_done_ns is not None
            and times.t_tls_done_ns is None):
        return f"{where}: TLS handshake failed: {describe_tls_error(exc)}"
    if isinstance(exc, mqtt.WebsocketConnectionError):
        status = upgrade_status(host, port, endpoint.websocket_path or "/", context, timeout_s)
        return (f"{where}: WebSocket upgrade refused: {status} (the status line of a second "
                f"upgrade request; paho: {exc})")
    if isinstance(exc, TimeoutError):
        return f"{where}: no answer within {timeout_s:g} s ({describe_tls_error(exc)})"
    return f"{where}: {describe_tls_error(exc)}"


def upgrade_status(host: str, port: int, path: str, context: ssl.SSLContext | None,
                   timeout_s: float) -> str:
    """The status line a server answers a WebSocket upgrade request for ``path`` with (or
    why none came), through :func:`mqttbed.core.websocket.upgrade`."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            if context is not None:
                if isinstance(context, _TimedContext):
                    context.times = None   # this connection is no client's
                sock = context.wrap_socket(sock, server_hostname=host)
            upgrade(sock, host, port, path)
        finally:
            sock.close()
    except UpgradeRefused as exc:
        return exc.status_line or "the server closed the connection without a status line"
    except WebSocketError as exc:   # an answer, but not a valid 101
        return str(exc)
    except OSError as exc:
        return f"no status line ({describe_tls_error(exc)})"
    return "101 Switching Protocols (this second request was accepted)"
