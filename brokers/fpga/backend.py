"""The ``fpga`` broker backend: the behavioural model on this machine, or a real board.

Without ``board`` the backend starts the model (:mod:`.server`) as a private subprocess
on a free UDP port, samples its process tree like Mosquitto's (CPU and RSS; the bytes in
and out are the UDP payload bytes the model counts and keeps in ``io.json``, at most
50 ms stale, since ``recvfrom``/``sendto`` never show in ``/proc/<pid>/io``), and at
teardown reads the model's own stats file (packets in and out, malformed datagrams
dropped, table occupancy, modelled hardware latency beside the emulator's measured
latency) into the run's metadata. With ``board`` it programs the board over SSH
(:mod:`.board`) and hands out the board's UDP endpoint; nothing runs locally, so there
are no resource samples.

With ``engine: rtl`` the broker run here is not the Python model but the RTL design
(``brokers/fpga/rtl``) simulated by Verilator behind the same kind of UDP socket; the
harness is built on first use (:mod:`.rtl.build`) and reports the design's cycle counts,
receive to send, beside its own measured time.

Either way the endpoint's transport is ``mqtt-udp``, which makes the agents use their
UDP clients: a campaign selects the transport through the backend, never by hand.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mqttbed import __version__
from mqttbed.brokers.fpga.board import BoardDeployment, BoardOptions
from mqttbed.brokers.fpga.rtl.build import ensure_sim, source_hash
from mqttbed.brokers.fpga.section import publish_records
from mqttbed.brokers.fpga.server import describe_values
from mqttbed.brokers.fpga.tables import DEFAULT_PROBE_WINDOW, PAPER_DEPTH_WORDS
from mqttbed.brokers.fpga.timing import PipelineTiming, TimingDescription
from mqttbed.brokers.processes import (
    BrokerProcess,
    local_processes,
    ping_over_udp,
    wait_for_ready_file,
)
from mqttbed.core.backends import DeploymentRecord
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host
from mqttbed.core.mqtt_codec import PingReq, PingResp, decode, encode
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords

MODEL_SOURCES = ("tables.py", "timing.py", "model.py", "server.py")
RTL_PROBE_WINDOW = 8          # the design reads the window as 8 banks (rtl/hash_table.v)
RTL_CLOCK_MHZ = 100.0
RECORDS_FILE = "records.json"


class Options(BaseModel):
    """The broker section of a campaign spec for the ``fpga`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["fpga"] = "fpga"
    board: BoardOptions | None = Field(
        default=None, description="a real board to program; without it the model runs here")
    engine: Literal["model", "rtl"] = Field(
        default="model", description="what runs here: the Python behavioural model, or the "
                                     "RTL design simulated by Verilator (brokers/fpga/rtl)")
    topic_table_depth: int = Field(default=PAPER_DEPTH_WORDS, ge=1, le=1 << 24,
                                   description="words of the Topic Table")
    subscriber_table_depth: int = Field(default=PAPER_DEPTH_WORDS, ge=1, le=1 << 24,
                                        description="words of the Subscriber Table")
    probe_window: int = Field(default=DEFAULT_PROBE_WINDOW, ge=1,
                              description="words a key may sit from its home word")
    stats_interval_s: float = Field(default=0.2, gt=0,
                                    description="seconds between resource samples of the model")
    startup_timeout_s: float = Field(default=10.0, gt=0, le=120,
                                     description="how long the broker may take to start")
    probe_timeout_s: float = Field(default=2.0, gt=0, le=60,
                                   description="wait for PINGRESP when checking the endpoint")

    @model_validator(mode="after")
    def _window_fits(self) -> Options:
        if self.engine == "rtl":
            for name, value, fixed in (
                    ("topic_table_depth", self.topic_table_depth, PAPER_DEPTH_WORDS),
                    ("subscriber_table_depth", self.subscriber_table_depth, PAPER_DEPTH_WORDS),
                    ("probe_window", self.probe_window, RTL_PROBE_WINDOW)):
                if value != fixed:
                    raise ValueError(f"engine 'rtl' has a fixed {name} of {fixed} (the "
                                     f"design's block RAM), got {value}")
            if self.board is not None:
                raise ValueError("engine 'rtl' simulates the design here; a board runs a "
                                 "bitstream: set either engine 'rtl' or board, not both")
        depth = min(self.topic_table_depth, self.subscriber_table_depth)
        if self.probe_window > depth:
            raise ValueError(f"probe_window {self.probe_window} exceeds the table depth "
                             f"{depth}; use at most {depth}")
        return self


# describe_values' statistics of one latency (mean, p50, p99, max; None without values).
Statistics = dict[str, float | None]


class CopyLatencies(BaseModel):
    """A PUBLISH's first copy, last copy and their spread (ns)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    first_copy: Statistics
    last_copy: Statistics
    spread: Statistics


class RtlCopyLatencies(CopyLatencies):
    """The design's latencies, and its first copy in clock cycles."""

    first_copy_cycles: Statistics


class ModelLatency(BaseModel):
    """The model's PUBLISH latencies: modelled hardware beside the emulator's measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    publish_packets: int
    copies_per_publish_mean: float | None
    modelled: CopyLatencies
    emulator_measured: CopyLatencies


class RtlLatency(BaseModel):
    """An ``engine: rtl`` run's PUBLISH latencies: design cycles beside harness time."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    publish_packets: int
    copies_per_publish_mean: float | None
    clock_mhz: float
    rtl: RtlCopyLatencies
    harness_measured: CopyLatencies


class NoPublishes(BaseModel):
    """The broker saw no PUBLISH: there is no latency to summarise."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    publish_packets: Literal[0] = 0


class FpgaSemantics(BaseModel):
    """What of MQTT the FPGA broker implements (fixed by its design, recorded per run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    qos: tuple[int, ...] = (0,)
    retain: str = "ignored"
    will: str = "ignored"
    wildcards: tuple[str, ...] = ("prefix/#",)
    unsubscribe: str = "tombstone (see brokers/fpga/tables.py)"


class FpgaDeployment(DeploymentRecord):
    """What one FPGA deploy was: the model or the RTL run here, or a board programmed.

    ``version`` is mqttbed's for the model and the RTL (they are in it), None for a board;
    the board's fields are None for the model and the RTL, and theirs for a board."""

    target: Literal["board", "model"]
    transport: Transport = Transport.MQTT_UDP
    options: Options
    endpoint: str | None = Field(None, description="host:port")
    semantics: FpgaSemantics = FpgaSemantics()
    timing_model: TimingDescription = Field(default_factory=lambda: PipelineTiming().describe())
    # a board
    board: BoardDeployment | None = None
    bitstream_sha256: str | None = None
    validated_on_hardware: bool | None = Field(
        None, description="False for a board: its bitstream was never checked on hardware")
    # the model or the RTL, run here
    engine: Literal["model", "rtl"] | None = None
    source_sha256: str | None = Field(None, description="model: the model's and the codec's "
                                                        "sources; rtl: the design's sources")
    stats_interval_s: float | None = None
    # The model's or the harness's own stats file, written by the subprocess at exit:
    # open-ended, so kept as it came.
    model_stats: dict[str, Any] | None = None
    hardware_latency_ns: ModelLatency | RtlLatency | NoPublishes | None = None


class FpgaBackend:
    """Deploys the FPGA broker: the behavioural model as a subprocess, or a board over SSH."""

    name = "fpga"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | None = None  # the model; None for a board
        self._endpoint: Endpoint | None = None
        self._board: BoardDeployment | None = None
        self._model_stats: dict[str, Any] | None = None
        self._model_records: dict[str, Any] | None = None
        self._torn_down = False

    # -- deploy -------------------------------------------------------------------------

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        """Start the model on ``host`` (or program the board); return the UDP endpoint."""
        if self._endpoint is not None or self._torn_down:
            raise BackendError("this FpgaBackend was already deployed; create a new one per "
                               "run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        try:
            if options.board is not None:
                self._endpoint = self._deploy_board(options.board)
            else:
                self._endpoint = self._deploy_model(options, host)
            probe_endpoint(self._endpoint, options.probe_timeout_s)
        except BaseException:
            self.teardown()
            raise
        return self._endpoint

    def _deploy_board(self, board: BoardOptions) -> Endpoint:
        from mqttbed.brokers.fpga.board import program_board

        self._board = program_board(board)
        address, port = board.endpoint()
        return Endpoint(host=address, port=port, transport=Transport.MQTT_UDP)

    def _deploy_model(self, options: Options, host: Host) -> Endpoint:
        rtl = options.engine == "rtl"
        binary = ensure_sim() if rtl else None
        proc = self._proc = BrokerProcess("fpga-rtl" if rtl else "fpga-model", host,
                                          "mqttbed-fpga-model-", log_names=("model.log",))
        ready = proc.dir / "ready.json"
        files = ["--ready-file", str(ready), "--stats-file", str(proc.dir / "stats.json"),
                 "--records-file", str(proc.dir / RECORDS_FILE),
                 "--io-file", str(proc.dir / "io.json")]
        if binary is not None:
            argv = [str(binary), "--host", host.address, "--port", "0", *files,
                    "--clock-mhz", str(RTL_CLOCK_MHZ)]
        else:
            argv = [sys.executable, "-m", "mqttbed.brokers.fpga", "--host", host.address,
                    "--port", "0", *files,
                    "--topic-table-depth", str(options.topic_table_depth),
                    "--subscriber-table-depth", str(options.subscriber_table_depth),
                    "--probe-window", str(options.probe_window)]
        io_file = proc.dir / "io.json"
        proc.watch(host.spawn(argv, log_path=proc.dir / "model.log"), options.stats_interval_s,
                   io_counters=lambda: _read_io_counters(io_file))
        bound = wait_for_ready_file(proc, ready, options.startup_timeout_s)
        return Endpoint(host=bound["host"], port=bound["port"], transport=Transport.MQTT_UDP)

    # -- while running ------------------------------------------------------------------

    def health(self) -> str | None:
        """Return None while the broker is usable, else why not."""
        if self._endpoint is None:
            return "broker fpga is not deployed"
        if self._torn_down:
            return "broker fpga was torn down"
        if self._proc is not None and (exited := self._proc.exit_reason()) is not None:
            return exited
        return None  # a board is checked with PINGREQ at deploy; UDP has no liveness signal

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the model's resource samples (none for a board: nothing runs here)."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def deployment(self) -> FpgaDeployment:
        """Return what was deployed, and after teardown the model's counters and latencies."""
        options = self._options or Options()
        config = json.dumps(options.model_dump(mode="json"), sort_keys=True)
        endpoint = self._endpoint
        common: dict[str, Any] = {
            "backend": self.name, "config": config,
            "config_sha256": hashlib.sha256(config.encode()).hexdigest(), "options": options,
            "endpoint": None if endpoint is None else f"{endpoint.host}:{endpoint.port}",
            "port": None if endpoint is None else endpoint.port}
        if options.board is not None:
            board = self._board
            return FpgaDeployment(
                **common, target="board", board=board, validated_on_hardware=False,
                bitstream_sha256=None if board is None else board.bitstream_sha256)
        rtl = options.engine == "rtl"
        proc = self._proc
        return FpgaDeployment(
            **common, target="model", engine=options.engine, version=__version__,
            source_sha256=source_hash() if rtl else _model_source_sha256(),
            pid=None if proc is None else proc.pid,
            exit_code=None if proc is None else proc.exit_code,
            stats_interval_s=options.stats_interval_s,
            log_tail=None if proc is None else proc.log_tail(),
            model_stats=self._model_stats,
            hardware_latency_ns=(rtl_latency_summary(self._model_records) if rtl else
                                 hardware_latency_summary(self._model_stats)))

    # -- teardown -----------------------------------------------------------------------

    def teardown(self) -> None:
        """Stop sampling and the model (which writes its stats), keep them; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        if self._proc is not None:
            self._proc.stop(timeout_s=5.0)
            self._model_stats = _read_json(self._proc.dir / "stats.json")
            self._model_records = _read_json(self._proc.dir / RECORDS_FILE)
            self._proc.remove()

    def section_records(self) -> SectionRecords:
        """The model's per-PUBLISH latencies (none for a board: it keeps none)."""
        return publish_records(self._model_records)


def _read_json(path: Path) -> Any:
    """A file the model wrote on its way down; None if it wrote none (it crashed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def unavailable() -> str | None:
    """The model needs nothing but Python: always deployable (a board is checked at deploy)."""
    return None


def _read_io_counters(path: Path) -> tuple[int, int]:
    """The model's UDP bytes (in, out) as it last wrote them; (0, 0) before the first write."""
    try:
        counters = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0, 0
    return int(counters["bytes_in"]), int(counters["bytes_out"])


def probe_endpoint(endpoint: Endpoint, timeout_s: float) -> None:
    """Send PINGREQ to ``endpoint`` over UDP; raise BackendError unless PINGRESP comes back."""
    def answer(datagram: bytes) -> str | None:
        reply = decode(datagram)
        return None if isinstance(reply, PingResp) else type(reply).__name__

    ping_over_udp(endpoint, timeout_s, encode(PingReq()), answer, "MQTT")


def hardware_latency_summary(model_stats: dict[str, Any] | None
                             ) -> ModelLatency | NoPublishes | None:
    """Return the PUBLISH latencies a report shows: modelled hardware beside measured emulator."""
    if not model_stats:
        return None
    publish = model_stats.get("latency_ns", {}).get("publish")
    if not publish:
        return NoPublishes()
    return ModelLatency(
        publish_packets=publish["packets"],
        copies_per_publish_mean=publish["copies"]["mean"],
        modelled=CopyLatencies(first_copy=publish["modelled_first_copy"],
                               last_copy=publish["modelled_last_copy"],
                               spread=publish["modelled_spread"]),
        emulator_measured=CopyLatencies(first_copy=publish["measured_first_copy"],
                                        last_copy=publish["measured_last_copy"],
                                        spread=publish["measured_spread"]))


def rtl_latency_summary(records: dict[str, Any] | None) -> RtlLatency | NoPublishes | None:
    """The PUBLISH latencies of an ``engine: rtl`` run: design cycles beside harness time."""
    if records is None:
        return None
    publish = records.get("publish")
    if not publish:
        return NoPublishes()
    values = publish["values"]

    def describe(name: str) -> dict[str, float | None]:
        return describe_values(deque(values.get(name, [])))

    return RtlLatency(
        publish_packets=publish["packets"],
        copies_per_publish_mean=describe("copies")["mean"],
        clock_mhz=RTL_CLOCK_MHZ,
        rtl=RtlCopyLatencies(first_copy=describe("rtl_first_copy"),
                             last_copy=describe("rtl_last_copy"),
                             spread=describe("rtl_spread"),
                             first_copy_cycles=describe("rtl_cycles_first_copy")),
        harness_measured=CopyLatencies(first_copy=describe("measured_first_copy"),
                                       last_copy=describe("measured_last_copy"),
                                       spread=describe("measured_spread")))


def _model_source_sha256() -> str:
    """A hash of the model's source files and the codec's (what ran, beside mqttbed's
    version)."""
    from mqttbed.core import mqtt_codec

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in [*(here / name for name in MODEL_SOURCES), Path(mqtt_codec.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()
