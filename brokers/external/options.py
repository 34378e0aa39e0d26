"""The ``broker:`` section of the ``external`` backend, and the broker URL it holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mqttbed.core.backends import BrokerFeatures
from mqttbed.core.protocol import Endpoint, Transport

MQTT_DEFAULT_PORT = 1883
# URL scheme -> the transport the agents speak to it.
SCHEMES: dict[str, Transport] = {
    "mqtt": Transport.MQTT_TCP,
    "mqtt-udp": Transport.MQTT_UDP,
    "mqtt-sn-udp": Transport.MQTT_SN_UDP,
}
NO_TLS = ("mqtts (MQTT over TLS) is not supported: mqttbed's agents connect without TLS "
          "(their lean client has none, and the paho client is given no TLS settings); "
          "point url at a plain listener of the broker (mqtt://HOST:PORT)")


@dataclass(frozen=True)
class BrokerUrl:
    """A broker's address as the spec's ``url`` gives it."""

    text: str
    host: str
    port: int
    transport: Transport

    def endpoint(self) -> Endpoint:
        return Endpoint(host=self.host, port=self.port, transport=self.transport)


def parse_broker_url(url: str) -> BrokerUrl:
    """``mqtt://HOST[:PORT]``, ``mqtt-udp://HOST:PORT``, ``mqtt-sn-udp://HOST:PORT``.

    Raises ValueError naming what is wrong with ``url`` and what would be right.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "mqtts":
        raise ValueError(f"{url!r}: {NO_TLS}")
    if scheme not in SCHEMES:
        raise ValueError(f"{url!r}: the scheme must be one of {', '.join(SCHEMES)} "
                         "(e.g. mqtt://127.0.0.1:1883)")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host (e.g. {scheme}://127.0.0.1:1883)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{url!r}: user names and passwords are not supported: the agents "
                         "connect anonymously; allow anonymous clients on the broker")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a broker URL is {scheme}://HOST:PORT, without a path, "
                         "query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535") from None
    if port is None:
        if scheme != "mqtt":
            raise ValueError(f"{url!r}: give the port ({scheme} has no standard one)")
        port = MQTT_DEFAULT_PORT
    if port == 0:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535")
    return BrokerUrl(url.strip(), parts.hostname, port, SCHEMES[scheme])


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
                                 "(TCP, port 1883 by default), mqtt-udp://HOST:PORT or "
                                 "mqtt-sn-udp://HOST:PORT; mqtts is refused (the agents "
                                 "have no TLS)")
    sample: ProcessToSample | None = Field(
        None, description="the broker's process, to sample its CPU, memory and I/O (on "
                          "broker.host, over SSH, if set); default: no resource samples")
    sys_topics: bool = Field(True, description="subscribe to $SYS/# and keep the numeric "
                                               "values the broker publishes there")
    connect_timeout_s: float = Field(3.0, gt=0, le=60, description="how long deploy waits "
                                                                   "for the broker's answer")
    features: BrokerFeatures = Field(
        default_factory=BrokerFeatures,
        description="what the broker delivers (QoS levels, retained, wildcards); a "
                    "workload asking for more is refused before the run")

    @field_validator("url")
    @classmethod
    def _url_is_a_broker(cls, url: str) -> str:
        parse_broker_url(url)
        return url.strip()

    def broker_features(self) -> BrokerFeatures:
        """The features the user declared for the broker (all of them by default)."""
        return self.features

    def broker_url(self) -> BrokerUrl:
        """The parsed ``url``."""
        return parse_broker_url(self.url)
