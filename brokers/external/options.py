"""The ``broker:`` section of the ``external`` backend, and the broker URL it holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mqttbed.core.backends import BrokerFeatures
from mqttbed.core.broker_access import (
    DEFAULT_WEBSOCKET_PATH,
    MQTT_PROTOCOLS,
    EndpointTls,
    ListenerTransport,
)
from mqttbed.core.protocol import Endpoint, Transport

MQTT_DEFAULT_PORT = 1883


@dataclass(frozen=True)
class Scheme:
    """What a URL scheme means: the transport, the listener's layers, its default port."""

    transport: Transport
    listener: ListenerTransport | None   # None: a UDP transport (no stream layers)
    default_port: int | None             # None: no standard port, the URL must give one


# URL scheme -> what the agents speak to it (IANA's ports for MQTT 1883/8883, HTTP 80/443).
SCHEMES: dict[str, Scheme] = {
    "mqtt": Scheme(Transport.MQTT_TCP, ListenerTransport.TCP, MQTT_DEFAULT_PORT),
    "mqtts": Scheme(Transport.MQTT_TCP, ListenerTransport.TLS, 8883),
    "ws": Scheme(Transport.MQTT_TCP, ListenerTransport.WS, 80),
    "wss": Scheme(Transport.MQTT_TCP, ListenerTransport.WSS, 443),
    "mqtt-udp": Scheme(Transport.MQTT_UDP, None, None),
    "mqtt-sn-udp": Scheme(Transport.MQTT_SN_UDP, None, None),
}
NO_CREDENTIALS_IN_URL = (
    "a user name or password does not go in the url (the spec is stored, and the password "
    "with it): give broker.auth: {username: NAME, password_file: PATH} (or password_env: "
    "VARIABLE) beside url")


@dataclass(frozen=True)
class BrokerUrl:
    """A broker's address as the spec's ``url`` gives it."""

    text: str
    host: str
    port: int
    transport: Transport
    listener: ListenerTransport | None = None   # tcp, tls, ws, wss; None over UDP
    websocket_path: str | None = None

    def endpoint(self, tls: EndpointTls | None = None) -> Endpoint:
        """The endpoint the agents reach; ``tls`` says how a TLS listener is verified
        (default: by the system's CAs, against the URL's host)."""
        secure = self.listener is not None and self.listener.tls
        return Endpoint(host=self.host, port=self.port, transport=self.transport,
                        tls=(tls or EndpointTls()) if secure else None,
                        websocket_path=self.websocket_path)


def parse_broker_url(url: str) -> BrokerUrl:
    """``mqtt://HOST[:PORT]``, ``mqtts://HOST[:PORT]``, ``ws://HOST[:PORT][/PATH]``,
    ``wss://HOST[:PORT][/PATH]``, ``mqtt-udp://HOST:PORT``, ``mqtt-sn-udp://HOST:PORT``.

    Raises ValueError naming what is wrong with ``url`` and what would be right.
    """
    parts = urlsplit(url.strip())
    scheme_name = parts.scheme.lower()
    scheme = SCHEMES.get(scheme_name)
    if scheme is None:
        raise ValueError(f"{url!r}: the scheme must be one of {', '.join(SCHEMES)} "
                         "(e.g. mqtt://127.0.0.1:1883, mqtts://broker.example:8883, "
                         "wss://broker.example/mqtt)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{_without_credentials(url)!r}: {NO_CREDENTIALS_IN_URL}")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host (e.g. {scheme_name}://127.0.0.1:1883)")
    websocket = scheme.listener is not None and scheme.listener.websocket
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a broker URL has no query or fragment")
    if parts.path not in ("", "/") and not websocket:
        raise ValueError(f"{url!r}: a broker URL is {scheme_name}://HOST:PORT, without a "
                         "path (a path is for ws:// and wss://)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535") from None
    if port is None:
        if scheme.default_port is None:
            raise ValueError(f"{url!r}: give the port ({scheme_name} has no standard one)")
        port = scheme.default_port
    if port == 0:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535")
    path = (parts.path or DEFAULT_WEBSOCKET_PATH) if websocket else None
    return BrokerUrl(url.strip(), parts.hostname, port, scheme.transport, scheme.listener, path)


def _without_credentials(url: str) -> str:
    """``url`` with its user name and password left out (an error must not repeat it)."""
    parts = urlsplit(url.strip())
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class ProcessToSample(BaseModel):
    """The broker's process, for resource samples (never signalled): on this machine, or
    on the lab host ``broker.host`` names (looked up and sampled there over SSH)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pid: int | None = Field(None, gt=0, description="the broker's process id (on broker.host "
                                                    "if set); its children are sampled too")
    process_name: str | None = Field(
        None, min_length=1, description="the broker's program name (e.g. nats-server), "
                                        "looked up when the run deploys, on broker.host if "
                                        "set; it must name one process tree")
    interval_s: float = Field(0.2, gt=0, description="seconds between resource samples")

    @model_validator(mode="before")
    @classmethod
    def _no_lab_host_here(cls, data: Any) -> Any:
        # An earlier draft of this section had its own lab_host; the lab host of a broker
        # is broker.host (the one the engine opens SSH to), so say where it goes.
        if isinstance(data, Mapping) and "lab_host" in data:
            name = data["lab_host"]
            raise ValueError(f"lab_host {name!r}: the lab host is broker.host, not a sample "
                             f"option: write host: {name} beside backend: external in the "
                             "broker section; the process is then looked up and sampled "
                             "there over SSH")
        return data

    @model_validator(mode="after")
    def _one_process(self) -> ProcessToSample:
        if (self.pid is None) == (self.process_name is None):
            raise ValueError("give exactly one of pid and process_name")
        return self


class Options(BaseModel):
    """The broker section of a campaign spec for the ``external`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["external"] = "external"
    url: str = Field(description="where the running broker listens: mqtt://HOST[:PORT] "
                                 "(TCP, port 1883 by default), mqtts://HOST[:PORT] (TLS, "
                                 "8883), ws://HOST[:PORT][/PATH] (WebSocket, 80, path "
                                 "/mqtt), wss://HOST[:PORT][/PATH] (WebSocket over TLS, "
                                 "443), mqtt-udp://HOST:PORT or mqtt-sn-udp://HOST:PORT; "
                                 "TLS verification and credentials go in broker.tls and "
                                 "broker.auth")
    sample: ProcessToSample | None = Field(
        None, description="the broker's process, to sample its CPU, memory and I/O (on "
                          "broker.host, over SSH, if set); default: no resource samples")
    sys_topics: bool = Field(True, description="subscribe to $SYS/# and keep the numeric "
                                               "values the broker publishes there")
    connect_timeout_s: float = Field(3.0, gt=0, le=60, description="how long deploy waits "
                                                                   "for the broker's answer")
    features: BrokerFeatures = Field(
        default_factory=BrokerFeatures,
        description="what the broker delivers (QoS levels, retained, wildcards, MQTT "
                    "versions); a workload asking for more is refused before the run. "
                    "Unless given here: MQTT 3.1.1 and 5, user names and passwords, the "
                    "url's listener (over UDP: 3.1.1, anonymous)")

    @field_validator("url")
    @classmethod
    def _url_is_a_broker(cls, url: str) -> str:
        parse_broker_url(url)
        return url.strip()

    def broker_features(self) -> BrokerFeatures:
        """The features the user declared for the broker; those not declared: what a
        broker at this URL is taken to speak (both MQTT versions and credentials over a
        stream, the URL's listener)."""
        url = self.broker_url()
        stream = url.listener is not None
        implied = {
            "protocols": frozenset(MQTT_PROTOCOLS if stream else ("3.1.1",)),
            "transports": frozenset({url.listener or ListenerTransport.TCP}),
            "auth": stream,
        }
        declared = self.features.model_fields_set
        return self.features.model_copy(
            update={name: value for name, value in implied.items() if name not in declared})

    def broker_url(self) -> BrokerUrl:
        """The parsed ``url``."""
        return parse_broker_url(self.url)
