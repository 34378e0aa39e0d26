"""The ``adaptive`` broker backend: seed 003's cloud-edge broker as a private process per run.

It starts :mod:`.server` on a free TCP port of the host (the broker binds port 0 and
reports the port it got through ``--ready-file``), samples its process tree like every
other broker (RSS, CPU; its bytes in and out are the TCP payload bytes it counts itself,
from its stats file, at most one sample interval stale), and at teardown reads its
counters and samples: into the run's metadata (with the held payload bytes over time),
and as the records of the ``withholding`` section.

Agents behind an impaired link (``network.impairments``) reach the broker through their
group's proxy, which runs in the root namespace and dials the endpoint: the broker's
default address, 127.0.0.1, serves them too.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mqttbed import __version__
from mqttbed.brokers.adaptive.broker import BrokerConfig
from mqttbed.brokers.adaptive.section import withholding_records
from mqttbed.brokers.fpga.backend import _read_json
from mqttbed.brokers.mqttsn.backend import _read_io_counters  # same stats file keys
from mqttbed.brokers.processes import BrokerProcess, local_processes, wait_for_ready_file
from mqttbed.core.backends import DeploymentRecord
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords
from mqttbed.core.withholding import (
    PAPER_CONGESTION_RATE_PER_S,
    PAPER_QUERY_PERIOD_S,
    PAPER_STARVATION_S,
    PAPER_THRESHOLD_L_S,
)

BROKER_SOURCES = ("broker.py", "outbox.py", "rtt.py", "server.py", "session.py")
_DEFAULTS = BrokerConfig()


class Options(BaseModel):
    """The broker section of a campaign spec for the ``adaptive`` backend (the paper's
    experiment by default: 10 KB size threshold, threshold_l 0.5 s, TQ 5 s, D 20 s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["adaptive"] = "adaptive"
    policy: Literal["none", "conservative", "probabilistic", "historic"] = Field(
        "conservative", description="none: first come, first served (the paper's baseline)")
    threshold_bytes: int = Field(_DEFAULTS.threshold_bytes, ge=0,
                                 description="threshold_s: payloads above it are large")
    threshold_l_s: float = Field(PAPER_THRESHOLD_L_S, gt=0,
                                 description="threshold_l: RTT of the uncongested link")
    starvation_s: float = Field(PAPER_STARVATION_S, gt=0,
                                description="D, the starvation timer (conservative, "
                                            "probabilistic)")
    rtt_query_period_s: float = Field(PAPER_QUERY_PERIOD_S, gt=0, description="TQ")
    rtt_query_bytes: int = Field(_DEFAULTS.rtt_query_bytes, ge=0, le=1 << 20,
                                 description="payload of each RTT query")
    rtt_query_timeout_s: float | None = Field(
        None, gt=0, description="a query unanswered this long is given up; default 2 TQ")
    congestion_rate_per_s: float = Field(PAPER_CONGESTION_RATE_PER_S, gt=0,
                                         description="lambda (probabilistic policy)")
    latency_scale: float = Field(1.0, gt=0, description="scales L_now and threshold_l from "
                                                        "the query's size to the message's")
    lazy_allocation: bool = Field(True, description="false: copy per subscriber on arrival")
    query_subscribers: Literal["all", "opted_in"] = Field(
        "all", description="opted_in: only clients subscribed to $adaptive/rtt are queried "
                           "(and withheld from); the others are served FCFS")
    max_queued_messages: int = Field(_DEFAULTS.max_queued_messages, ge=0,
                                     description="per subscriber; beyond it deliveries are "
                                                 "dropped and counted; 0 = no limit")
    max_packet_bytes: int = Field(_DEFAULTS.max_packet_bytes, ge=1024, le=268_435_455,
                                  description="the largest MQTT packet a client may send")
    write_buffer_bytes: int = Field(_DEFAULTS.write_buffer_bytes, ge=1024,
                                    description="a socket's write high-water mark")
    stats_interval_s: float = Field(0.2, gt=0, description="seconds between resource and "
                                                           "held-bytes samples")
    startup_timeout_s: float = Field(10.0, gt=0, le=120,
                                     description="how long the broker may take to start")

    def broker_argv(self) -> list[str]:
        """The broker's command-line options for these settings."""
        timeout_s = self.rtt_query_timeout_s or 2 * self.rtt_query_period_s
        argv = ["--policy", self.policy, "--threshold-bytes", str(self.threshold_bytes),
                "--threshold-l-s", repr(self.threshold_l_s),
                "--starvation-s", repr(self.starvation_s),
                "--rtt-query-period-s", repr(self.rtt_query_period_s),
                "--rtt-query-bytes", str(self.rtt_query_bytes),
                "--rtt-query-timeout-s", repr(timeout_s),
                "--congestion-rate-per-s", repr(self.congestion_rate_per_s),
                "--latency-scale", repr(self.latency_scale),
                "--query-subscribers", self.query_subscribers,
                "--max-queued-messages", str(self.max_queued_messages),
                "--max-packet-bytes", str(self.max_packet_bytes),
                "--write-buffer-bytes", str(self.write_buffer_bytes),
                "--sample-interval-s", repr(self.stats_interval_s),
                "--stats-interval-s", repr(self.stats_interval_s)]
        return argv + ([] if self.lazy_allocation else ["--eager-allocation"])


class AdaptiveSemantics(BaseModel):
    """What of MQTT the broker implements (fixed by its code, recorded with each run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mqtt: str = "3.1.1"
    qos_in: tuple[int, ...] = (0, 1, 2)
    max_granted_qos: int = 1
    sessions: str = "clean only (clean session 0 accepted, nothing kept)"
    retain: str = "not stored, never set on delivery"
    will: bool = True
    wildcards: tuple[str, ...] = ("+", "#")
    ordered_topics: bool = False
    rtt_query_topic: str = "$adaptive/rtt"


class AdaptiveDeployment(DeploymentRecord):
    """What one adaptive broker deploy was; ``version`` is mqttbed's (the broker is in it)."""

    transport: Transport = Transport.MQTT_TCP
    source_sha256: str = Field(description="the broker's, the codec's and the withholding "
                                           "policies' sources")
    options: Options
    endpoint: str | None = Field(None, description="host:port")
    semantics: AdaptiveSemantics = AdaptiveSemantics()
    # The broker's final counters (a subprocess's stats file, read by .section):
    # open-ended, so kept as they came.
    broker_stats: dict[str, Any] | None = None
    held_payload_bytes_series: list[tuple[int, int]] | None = Field(
        None, description="(t_ns, payload bytes held) samples, from the broker's records")


class AdaptiveBackend:
    """Deploys the adaptive broker as a subprocess and keeps its counters and samples."""

    name = "adaptive"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | None = None
        self._endpoint: Endpoint | None = None
        self._broker_stats: dict[str, Any] | None = None
        self._broker_records: dict[str, Any] | None = None
        self._torn_down = False

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        """Start the broker on ``host``; return its TCP endpoint once it listens."""
        if self._proc is not None or self._torn_down:
            raise BackendError("this AdaptiveBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        try:
            proc = self._proc = BrokerProcess(self.name, host, "mqttbed-adaptive-",
                                              log_names=("broker.log",))
            ready, stats_file = proc.dir / "ready.json", proc.dir / "stats.json"
            argv = [sys.executable, "-m", "mqttbed.brokers.adaptive", "--host", host.address,
                    "--port", "0", "--ready-file", str(ready), "--stats-file", str(stats_file),
                    "--records-file", str(proc.dir / "records.json"), *options.broker_argv()]
            proc.watch(host.spawn(argv, log_path=proc.dir / "broker.log"),
                       options.stats_interval_s,
                       io_counters=lambda: _read_io_counters(stats_file))
            bound = wait_for_ready_file(proc, ready, options.startup_timeout_s)
            self._endpoint = Endpoint(host=bound["host"], port=bound["port"],
                                      transport=Transport.MQTT_TCP)
        except BaseException:
            self.teardown()
            raise
        return self._endpoint

    def health(self) -> str | None:
        """Return None while the broker runs, else why not."""
        if self._proc is None or self._endpoint is None:
            return "broker adaptive is not deployed"
        if self._torn_down:
            return "broker adaptive was torn down"
        return self._proc.exit_reason()

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the broker's resource samples (RSS among them)."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def live_counters(self) -> dict[str, Any] | None:
        """The broker's counters as it last wrote them (every ``stats_interval_s``)."""
        if self._proc is None or self._torn_down:
            return None
        return _read_json(self._proc.dir / "stats.json")

    @property
    def broker_stats(self) -> dict[str, Any] | None:
        """The broker's final counters (after teardown; None before, or if it wrote none)."""
        return self._broker_stats

    @property
    def broker_records(self) -> dict[str, Any] | None:
        """The broker's samples (after teardown): rtt_ms, withheld_s, held_payload_bytes."""
        return self._broker_records

    def deployment(self) -> AdaptiveDeployment:
        """Return what was deployed, and after teardown the broker's counters and memory."""
        options = self._options or Options()
        config = json.dumps(options.model_dump(mode="json"), sort_keys=True)
        proc, endpoint = self._proc, self._endpoint
        return AdaptiveDeployment(
            backend=self.name, version=__version__, source_sha256=_broker_source_sha256(),
            config=config, config_sha256=hashlib.sha256(config.encode()).hexdigest(),
            options=options,
            endpoint=None if endpoint is None else f"{endpoint.host}:{endpoint.port}",
            port=None if endpoint is None else endpoint.port,
            pid=None if proc is None else proc.pid,
            exit_code=None if proc is None else proc.exit_code,
            log_tail=None if proc is None else proc.log_tail(),
            broker_stats=self._broker_stats,
            held_payload_bytes_series=(self._broker_records or {}).get("held_payload_bytes"))

    def teardown(self) -> None:
        """Stop the broker (it writes its files on SIGTERM), keep them; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        if self._proc is not None:
            self._proc.stop(timeout_s=5.0)
            self._broker_stats = _read_json(self._proc.dir / "stats.json")
            self._broker_records = _read_json(self._proc.dir / "records.json")
            self._proc.remove()

    def section_records(self) -> SectionRecords:
        """This run's withholding figures (none if the broker wrote none)."""
        return withholding_records(self._broker_stats, self._broker_records)


def unavailable() -> str | None:
    """The broker needs nothing but Python: always deployable."""
    return None


def _broker_source_sha256() -> str:
    """A hash of the broker's, the codec's and the policies' sources (what ran, beside
    mqttbed's version)."""
    from mqttbed.core import mqtt_codec, withholding

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in [*(here / name for name in BROKER_SOURCES), Path(mqtt_codec.__file__),
                 Path(withholding.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()
