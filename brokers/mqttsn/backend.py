"""The ``mqtt-sn`` broker backend: the MQTT-SN gateway as a private process per run.

It starts :mod:`.server` on a free UDP port of the host (the gateway binds port 0 and
reports the port it got through ``--ready-file``, so there is no race for a port),
samples its process tree like every other broker (its bytes in and out are the UDP
payload bytes it counts itself, from its stats file, at most a second stale:
``recvfrom``/``sendto`` never show in ``/proc/<pid>/io``), and at teardown reads the
gateway's counters: into the run's metadata, and as the records of the ``packets``
section. The endpoint's transport is ``mqtt-sn-udp``, which makes the agents speak
MQTT-SN.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mqttbed import __version__
from mqttbed.brokers.fpga.backend import _read_json
from mqttbed.brokers.mqttsn.section import packet_records
from mqttbed.brokers.processes import (
    BrokerProcess,
    local_processes,
    ping_over_udp,
    wait_for_ready_file,
)
from mqttbed.core.backends import DeploymentRecord
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host
from mqttbed.core.mqttsn import Pingreq, Pingresp, decode, encode
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords

GATEWAY_SOURCES = ("counters.py", "gateway.py", "server.py")


class Options(BaseModel):
    """The broker section of a campaign spec for the ``mqtt-sn`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["mqtt-sn"] = "mqtt-sn"
    predefined_topics: dict[int, str] = Field(
        default_factory=dict, description="pre-defined topic ids: {id: topic name}")
    stats_interval_s: float = Field(default=0.2, gt=0,
                                    description="seconds between resource samples")
    startup_timeout_s: float = Field(default=10.0, gt=0, le=120,
                                     description="how long the gateway may take to start")
    probe_timeout_s: float = Field(default=2.0, gt=0, le=60,
                                   description="wait for PINGRESP when checking the gateway")

    @field_validator("predefined_topics")
    @classmethod
    def _valid_topics(cls, topics: dict[int, str]) -> dict[int, str]:
        for topic_id, name in topics.items():
            if not 1 <= topic_id <= 0xFFFE or not name or set("+#") & set(name):
                raise ValueError(f"pre-defined topic {topic_id}={name!r}: the id must be in "
                                 "1..65534 and the name non-empty, without wildcards")
        return topics


class MqttSnSemantics(BaseModel):
    """What of MQTT-SN the gateway implements (fixed by its code, recorded with each run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    qos: tuple[int, ...] = (-1, 0, 1)
    delivery_qos: int = 0
    retain: str = "ignored"
    will: str = "refused (CONNACK not supported)"
    wildcards: tuple[str, ...] = ("+", "#")
    sleeping_clients: bool = False


class MqttSnDeployment(DeploymentRecord):
    """What one MQTT-SN gateway deploy was; ``version`` is mqttbed's (the gateway is in it)."""

    transport: Transport = Transport.MQTT_SN_UDP
    source_sha256: str = Field(description="the gateway's and the MQTT-SN codec's sources")
    options: Options
    endpoint: str | None = Field(None, description="host:port")
    semantics: MqttSnSemantics = MqttSnSemantics()
    # The gateway's counters as it wrote them at teardown (a subprocess's stats file,
    # read by mqttsn.section): open-ended, so kept as they came.
    gateway_stats: dict[str, Any] | None = None


class MqttSnBackend:
    """Deploys the MQTT-SN gateway as a subprocess and keeps its packet counters."""

    name = "mqtt-sn"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | None = None
        self._endpoint: Endpoint | None = None
        self._gateway_stats: dict[str, Any] | None = None
        self._torn_down = False

    def deploy(self, spec: Options | Mapping[str, Any], host: Host, *,
               probe_socket: Callable[[], socket.socket] | None = None) -> Endpoint:
        """Start the gateway on ``host``; return its UDP endpoint once it answers PINGREQ.

        ``probe_socket`` makes the UDP socket the PINGREQ goes out on, for a host this
        process cannot reach directly (a network namespace: ``brokers.p4``).
        """
        if self._proc is not None or self._torn_down:
            raise BackendError("this MqttSnBackend was already deployed; create a new one per "
                               "run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        try:
            self._endpoint = self._start(options, host)
            probe_gateway(self._endpoint, options.probe_timeout_s, probe_socket)
        except BaseException:
            self.teardown()
            raise
        return self._endpoint

    def _start(self, options: Options, host: Host) -> Endpoint:
        proc = self._proc = BrokerProcess(self.name, host, "mqttbed-mqtt-sn-",
                                          log_names=("gateway.log",))
        ready, stats_file = proc.dir / "ready.json", proc.dir / "stats.json"
        argv = [sys.executable, "-m", "mqttbed.brokers.mqttsn", "--host", host.address,
                "--port", "0", "--ready-file", str(ready), "--stats-file", str(stats_file)]
        for topic_id, name in sorted(options.predefined_topics.items()):
            argv += ["--predefined", f"{topic_id}={name}"]
        proc.watch(host.spawn(argv, log_path=proc.dir / "gateway.log"),
                   options.stats_interval_s, io_counters=lambda: _read_io_counters(stats_file))
        bound = wait_for_ready_file(proc, ready, options.startup_timeout_s)
        return Endpoint(host=bound["host"], port=bound["port"], transport=Transport.MQTT_SN_UDP)

    def health(self) -> str | None:
        """Return None while the gateway runs, else why not."""
        if self._proc is None or self._endpoint is None:
            return "broker mqtt-sn is not deployed"
        if self._torn_down:
            return "broker mqtt-sn was torn down"
        if (exited := self._proc.exit_reason()) is not None:
            return f"broker died: {exited}"
        return None

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the gateway's resource samples."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def deployment(self) -> MqttSnDeployment:
        """Return what was deployed, and after teardown the gateway's counters."""
        options = self._options or Options()
        config = json.dumps(options.model_dump(mode="json"), sort_keys=True)
        return MqttSnDeployment(
            backend=self.name, version=__version__, source_sha256=_gateway_source_sha256(),
            config=config, config_sha256=hashlib.sha256(config.encode()).hexdigest(),
            options=options,
            endpoint=None if self._endpoint is None else
            f"{self._endpoint.host}:{self._endpoint.port}",
            port=None if self._endpoint is None else self._endpoint.port,
            pid=None if self._proc is None else self._proc.pid,
            exit_code=None if self._proc is None else self._proc.exit_code,
            log_tail=None if self._proc is None else self._proc.log_tail(),
            gateway_stats=self._gateway_stats)

    @property
    def gateway_stats(self) -> dict[str, Any] | None:
        """The gateway's final counters (after teardown; None before, or if it wrote none)."""
        return self._gateway_stats

    def teardown(self) -> None:
        """Stop the gateway (it writes its counters on SIGTERM) and keep them; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        if self._proc is not None:
            self._proc.stop(timeout_s=5.0)
            self._gateway_stats = _read_json(self._proc.dir / "stats.json")
            self._proc.remove()

    def section_records(self) -> SectionRecords:
        """The gateway's packet counters of this run (none if it wrote none)."""
        return packet_records(self._gateway_stats)


def unavailable() -> str | None:
    """The gateway needs nothing but Python: always deployable."""
    return None


def probe_gateway(endpoint: Endpoint, timeout_s: float,
                  probe_socket: Callable[[], socket.socket] | None = None) -> None:
    """Send PINGREQ over UDP; raise BackendError unless PINGRESP comes back."""
    def answer(datagram: bytes) -> str | None:
        reply = decode(datagram)
        return None if isinstance(reply, Pingresp) else type(reply).__name__

    ping_over_udp(endpoint, timeout_s, encode(Pingreq()), answer, "MQTT-SN", probe_socket)


def _read_io_counters(path: Path) -> tuple[int, int]:
    """The gateway's UDP bytes (in, out) from its stats file; (0, 0) before the first write."""
    stats = _read_json(path)
    return (0, 0) if not stats else (int(stats["bytes_in"]), int(stats["bytes_out"]))


def _gateway_source_sha256() -> str:
    """A hash of the gateway's and the codec's sources (what ran, beside mqttbed's version)."""
    from mqttbed.core import mqttsn

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in [*(here / name for name in GATEWAY_SOURCES), Path(mqttsn.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()
