"""ctypes over the native engine's shared library (``src/engine.h`` is the contract).

The library is built on first use (a C compiler and make; no compiler is needed at import
time) and rebuilt when a source is newer, like the fork/pipe broker
(:mod:`mqttbed.core.make_build`). Event tables are read as whole columns: a ctypes array
over the engine's memory sliced into a list is one C call per column, never Python work
per event.
"""

from __future__ import annotations

import array
import ctypes
import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mqttbed.core import make_build
from mqttbed.core.errors import system_deps_hint

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY_NAME = "libmqttbed-engine.so"
PROJECT = make_build.MakeProject(
    name="the native load engine", source_dir=SOURCE_DIR, patterns=("Makefile", "src/*.[ch]"),
    cache_name="native-engine",
    install_hint=("install a C compiler, make and OpenSSL's headers: "
                  + system_deps_hint("build", "gcc make libc6-dev libssl-dev")
                  + "; until then the agents run the lean Python client"))

# Tables and columns, as numbered in src/engine.h.
T_PUBLISH, T_DELIVERY, T_SUBSCRIBE, T_TX, T_EDGE = range(5)
PUB_COLUMNS = ("client", "seq", "t_intended", "t_pub", "warmup", "topic")
DLV_COLUMNS = ("client", "publisher", "seq", "topic", "payload_bytes", "qos", "warmup",
               "t_intended", "t_pub", "t_recv", "kernel", "t_recv_user", "retain")
SUB_COLUMNS = ("client", "topic", "qos", "t_suback", "t_sent", "t_intended")
TX_COLUMNS = ("client", "seq", "t_pub", "t_kernel", "lag")
EDGE_COLUMNS = ("pin", "t", "level", "lag", "write")
_WIDTH_TYPES = {1: ctypes.c_uint8, 4: ctypes.c_int32, 8: ctypes.c_int64}
_WIDTH_FORMATS = {1: "B", 4: "i", 8: "q"}
_TABLE_WIDTHS = {
    T_PUBLISH: (4, 8, 8, 8, 1, 4),
    T_DELIVERY: (4, 4, 8, 4, 4, 1, 1, 8, 8, 8, 1, 8, 1),
    T_SUBSCRIBE: (4, 4, 1, 8, 8, 8),
    T_TX: (4, 8, 8, 8, 8),
    T_EDGE: (4, 8, 1, 8, 8),
}
_TABLE_COLUMNS = {T_PUBLISH: PUB_COLUMNS, T_DELIVERY: DLV_COLUMNS, T_SUBSCRIBE: SUB_COLUMNS,
                  T_TX: TX_COLUMNS, T_EDGE: EDGE_COLUMNS}

def _column_format(name: str, width: int) -> str:
    """A column's memoryview format: a warm-up flag reads as Python bools ("?"), the event
    column's type; the rest as integers of the column's width."""
    return "?" if name in ("warmup", "retain") else _WIDTH_FORMATS[width]


def as_lists(table: int, columns: dict[str, bytes]) -> dict[str, list[int]]:
    """Columns taken with :meth:`Engine.take_bytes` as the lists :meth:`Engine.take` gives."""
    widths = dict(zip(_TABLE_COLUMNS[table], _TABLE_WIDTHS[table], strict=True))
    return {name: memoryview(data).cast(  # type: ignore[call-overload]
                _column_format(name, widths[name])).tolist()
            for name, data in columns.items()}


DONE, SLICE, DRAIN, WOKEN, DEADLINE, FAILED = 0, 1, 2, 3, 4, -1
EVENT_CAPACITY = 1 << 18


class ClientStats(ctypes.Structure):
    """``mqe_client_stats``."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "sent", "acked", "received_unique", "deliveries", "first_intended_ns", "last_pub_ns",
        "send_lag_max_ns", "last_delivery_ns")] + [(name, ctypes.c_int32) for name in (
            "connected", "subscribed", "failed", "fd")] + [("dropped", ctypes.c_int64)]


NO_TIME = -(1 << 63)  # MQE_NO_TIME: a phase that did not happen or has not ended


class ConnectPhaseTimes(ctypes.Structure):
    """``mqe_connect_phases``: one client's connection, phase by phase (CLOCK_MONOTONIC ns,
    :data:`NO_TIME` where a phase did not happen)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "t_connect_ns", "t_tcp_ns", "t_tls_ns", "t_websocket_ns", "t_mqtt_sent_ns",
        "t_connack_ns")] + [("tls", ctypes.c_char * 64)]


class ReconnectRecord(ctypes.Structure):
    """``mqe_reconnect_record``: one absence of a client and its way back (CLOCK_MONOTONIC
    ns, :data:`NO_TIME` where not reached)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "t_lost_ns", "t_connect_ns", "t_tcp_ns", "t_tls_ns", "t_websocket_ns",
        "t_mqtt_sent_ns", "t_connack_ns", "t_subscribed_ns", "skipped")] + [
        (name, ctypes.c_int32) for name in (
            "attempts", "session_present", "scheduled", "abandoned")] + [
        ("reason", ctypes.c_char * 128)]


class StormOutcome(ctypes.Structure):
    """``mqe_storm_outcome``: one storm client's connect (CLOCK_MONOTONIC ns, :data:`NO_TIME`
    where not reached), its outcome (``STORM_OUTCOMES``) and code (CONNACK code or errno)."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "t_intended_ns", "t_connect_ns", "t_tcp_ns", "t_tls_ns", "t_websocket_ns",
        "t_mqtt_sent_ns", "t_connack_ns", "t_ended_ns")] + [
        (name, ctypes.c_int32) for name in ("outcome", "code")] + [
        ("detail", ctypes.c_char * 256)]


# MQE_STORM_*, in src/engine.h's order: what became of one storm client's connect
STORM_OUTCOMES = ("pending", "opening", "connected", "connack", "refused", "reset", "closed",
                  "timeout", "tls", "websocket", "other")


def library_path() -> Path:
    """Where the built library is (or will be)."""
    return PROJECT.build_dir() / LIBRARY_NAME


def ensure_built() -> Path:
    """The library, built or rebuilt if needed; MissingSystemDependency or BackendError
    say why it cannot be."""
    return PROJECT.ensure_built("all", library_path())


_LIBRARY: Any = None


def load() -> Any:
    """The loaded library with its functions typed (built first if needed)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return _LIBRARY
    lib = ctypes.CDLL(str(ensure_built()))
    p, i32, i64, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint32
    cstr, dbl = ctypes.c_char_p, ctypes.c_double
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "mqe_create": (p, [u32, i32, i32]),
        "mqe_destroy": (None, [p]),
        "mqe_error": (cstr, [p]),
        "mqe_realtime_offset_ns": (i64, [p]),
        "mqe_realtime_gap_ns": (i64, [p]),
        "mqe_kernel_stamps": (i32, [p]),
        "mqe_add_client": (i32, [p, cstr, cstr, i32, i32, cstr, i32, i32, u32, ctypes.c_int32,
                                 dbl, i64, i64, i64, i32]),
        "mqe_add_warmup_range": (i32, [p, i32, u32, u32, i64]),
        "mqe_tls_configure": (i32, [p, cstr, cstr, cstr, i32]),
        "mqe_set_tls": (i32, [p, i32, cstr]),
        "mqe_set_websocket": (i32, [p, i32, cstr]),
        "mqe_connect_phases_of": (i32, [p, i32, ctypes.POINTER(ConnectPhaseTimes)]),
        "mqe_set_udp": (i32, [p, i32]),
        "mqe_set_mqttsn": (i32, [p, i32]),
        "mqe_set_session": (i32, [p, i32, i32, cstr, ctypes.c_char_p, ctypes.c_size_t]),
        "mqe_connect_all": (i32, [p, i32, i32]),
        "mqe_subscribe": (i32, [p, i32, cstr, i32]),
        "mqe_poll": (i32, [p, i64]),
        "mqe_wake": (None, [p]),
        "mqe_client_stats_of": (i32, [p, i32, ctypes.POINTER(ClientStats)]),
        "mqe_client_failure": (cstr, [p, i32]),
        "mqe_run_begin": (None, [p, i64, i64, i64, i64, i64]),
        "mqe_step": (i32, [p, i64]),
        "mqe_hand_back_of": (i64, [p, ctypes.POINTER(ctypes.c_int)]),
        "mqe_rows": (u32, [p, i32]),
        "mqe_column": (p, [p, i32, i32]),
        "mqe_clear": (None, [p, i32]),
        "mqe_topics": (u32, [p]),
        "mqe_topic": (cstr, [p, u32]),
        "mqe_disconnect_all": (None, [p]),
        "mqe_feed": (i32, [p, i32, ctypes.c_char_p, ctypes.c_size_t]),
        "mqe_gpio_level": (i32, [p, i32]),
        "mqe_gpio_open_chip": (i32, [p, cstr, ctypes.POINTER(ctypes.c_int32), u32]),
        "mqe_gpio_set": (i32, [p, i32, i32]),
        "mqe_gpio_write_failures": (i64, [p, ctypes.POINTER(ctypes.c_int)]),
        "mqe_set_topic_tree": (i32, [p, i32, u32, u32, ctypes.c_uint64]),
        "mqe_set_retained": (i32, [p, i32, u32, u32, u32, u32]),
        "mqe_subscribe_later": (i32, [p, i32, cstr, i32, i64, i64]),
        "mqe_set_persistent": (i32, [p, i32, u32]),
        "mqe_set_absence": (i32, [p, i32, i64, i64, i32]),
        "mqe_set_reconnect": (i32, [p, i32, i64, i64]),
        "mqe_reconnects": (i32, [p, i32]),
        "mqe_reconnect_of": (i32, [p, i32, i32, ctypes.POINTER(ReconnectRecord)]),
        "mqe_session_present_of": (i32, [p, i32]),
        "mqe_storm_begin": (i32, [p, i64, i32, i64, i32]),
        "mqe_storm_step": (i64, [p, i64]),
        "mqe_storm_outcome_of": (i32, [p, i32, ctypes.POINTER(StormOutcome)]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    _LIBRARY = lib
    return lib


class Engine:
    """One engine: the clients of one agent process for one run."""

    def __init__(self, *, kernel_stamps: bool, pulse_mode: bool,
                 event_capacity: int = EVENT_CAPACITY):
        self._lib = load()
        self._handle = self._lib.mqe_create(event_capacity, int(kernel_stamps), int(pulse_mode))
        if not self._handle:
            raise MemoryError(f"the native engine could not allocate {event_capacity} events")
        self._topics: list[str] = []
        self._clients = 0
        self._final: list[ClientStats] = []  # every client's stats when the engine closed
        self._final_phases: list[ConnectPhaseTimes] = []
        self._final_reconnects: list[list[ReconnectRecord]] = []
        self._final_present: list[int] = []
        self._lock = threading.Lock()  # wake() from other threads against close()
        self.realtime_gap_ns = int(self._lib.mqe_realtime_gap_ns(self._handle))
        # every column as a typed memoryview over the engine's memory (allocated once, at
        # create): a drain is a slice and a tolist() per column
        self._views: dict[int, dict[str, memoryview]] = {}
        for table, names in _TABLE_COLUMNS.items():
            capacity = event_capacity * (2 if table == T_EDGE else 1)
            self._views[table] = {}
            for number, (name, width) in enumerate(zip(names, _TABLE_WIDTHS[table],
                                                       strict=True)):
                address = self._lib.mqe_column(self._handle, table, number)
                array = (_WIDTH_TYPES[width] * capacity).from_address(address)
                # (typeshed types cast() one format literal per overload; this one is
                # chosen at run time, so no overload names it)
                self._views[table][name] = memoryview(array).cast("B").cast(  # type: ignore[call-overload]
                    _column_format(name, width))

    def _live(self) -> int:
        """The engine's handle; RuntimeError once it is closed (C would read freed memory)."""
        if not self._handle:
            raise RuntimeError("the native engine is closed")
        return int(self._handle)

    # -- set-up ---------------------------------------------------------------------------

    def add_client(self, *, client_id: str, host: str, port: int, publisher: bool, topic: str,
                   qos: int, gpio_pin: int, publisher_index: int, payload_bytes: int,
                   rate_hz: float, messages: int, warmup_messages: int, start_offset_ns: int,
                   closed_loop: bool) -> int:
        """Add one client; its index in every table."""
        index = self._lib.mqe_add_client(
            self._live(), client_id.encode(), host.encode(), port, 0 if publisher else 1,
            topic.encode(), qos, gpio_pin, publisher_index, payload_bytes, rate_hz, messages,
            warmup_messages, start_offset_ns, int(closed_loop))
        if index < 0:
            raise ValueError(self.error)
        self._clients += 1
        return int(index)

    def set_udp(self, client: int) -> None:
        """Speak mqtt-udp on this client: one packet per datagram, QoS 0 only."""
        if self._lib.mqe_set_udp(self._live(), client):
            raise ValueError(self.error)

    def set_mqttsn(self, client: int) -> None:
        """Speak MQTT-SN 1.2 on this client (mqtt-sn-udp): QoS 0 or 1, a client id of 1..23
        octets; ValueError names the client and what does not fit."""
        if self._lib.mqe_set_mqttsn(self._live(), client):
            raise ValueError(self.error)

    def set_session(self, client: int, *, protocol_level: int, username: str | None = None,
                    password: bytes | None = None) -> None:
        """This client's CONNECT: MQTT 3.1.1 (``protocol_level`` 4) or MQTT 5 (5), with a user
        name and password (the engine keeps a copy, wiped when it is closed). ValueError
        names the client and what it cannot send, never the password."""
        if self._lib.mqe_set_session(
                self._live(), client, protocol_level,
                None if username is None else username.encode(), password,
                0 if password is None else len(password)):
            raise ValueError(self.error)

    def configure_tls(self, *, ca_pem: str | None, cert_pem: str | None = None,
                      key_pem: str | None = None, verify: bool = True) -> None:
        """The TLS settings of every client set with :meth:`set_tls` (TLS 1.2 or 1.3):
        the CAs trusted (PEM; None: the system's), a client certificate and key (PEM),
        whether the chain and name are verified. ValueError names what does not load."""
        def text(pem: str | None) -> bytes | None:
            return None if pem is None else pem.encode()

        if self._lib.mqe_tls_configure(self._live(), text(ca_pem), text(cert_pem),
                                       text(key_pem), int(verify)):
            raise ValueError(self.error)

    def set_tls(self, client: int, server_name: str | None = None) -> None:
        """Speak TLS on this client (after :meth:`configure_tls`): ``server_name`` is
        verified and sent as SNI (None: the client's host)."""
        if self._lib.mqe_set_tls(self._live(), client,
                                 None if server_name is None else server_name.encode()):
            raise ValueError(self.error)

    def set_websocket(self, client: int, path: str) -> None:
        """Carry this client's MQTT in WebSocket frames (RFC 6455) upgraded at ``path``."""
        if self._lib.mqe_set_websocket(self._live(), client, path.encode()):
            raise ValueError(self.error)

    def set_topic_tree(self, client: int, levels: int, fanout: int, first: int) -> None:
        """Send this publisher's message k to topic (first + k) mod fanout ** levels of the
        tree under its topic (``{topic}/{a}/{b}/...``; src/topics_tree.c)."""
        if self._lib.mqe_set_topic_tree(self._live(), client, levels, fanout, first):
            raise ValueError(self.error)

    def set_retained(self, client: int, *, topics: int, first: int, stride: int,
                     count: int) -> None:
        """Send this publisher's message k with the RETAIN flag to topic
        ``first + (k mod count) * stride`` of ``{topic}/{i}``, i < topics
        (src/retained.c; after :meth:`set_session`)."""
        if self._lib.mqe_set_retained(self._live(), client, topics, first, stride, count):
            raise ValueError(self.error)

    def subscribe_later(self, client: int, topic_filter: str, qos: int, *,
                        after_start_ns: int, after_publishers_ns: int) -> None:
        """Subscribe during the run: at the start plus ``after_start_ns``, and no earlier
        than ``after_publishers_ns`` after this engine's publishers are done
        (src/retained.c)."""
        if self._lib.mqe_subscribe_later(self._live(), client, topic_filter.encode(), qos,
                                         after_start_ns, after_publishers_ns):
            raise ValueError(self.error)

    def set_persistent(self, client: int, session_expiry_s: int) -> None:
        """Keep this client's session: clean session 0 (3.1.1), clean start 0 and a Session
        Expiry Interval (MQTT 5); before connecting (src/reconnect.c)."""
        if self._lib.mqe_set_persistent(self._live(), client, session_expiry_s):
            raise ValueError(self.error)

    def set_absence(self, client: int, *, at_ns: int, for_ns: int, drop: bool) -> None:
        """Send this client away ``at_ns`` into the run (``drop``: the socket closed, else
        a DISCONNECT first) and back with the same id ``for_ns`` later."""
        if self._lib.mqe_set_absence(self._live(), client, at_ns, for_ns, int(drop)):
            raise ValueError(self.error)

    def set_reconnect(self, client: int, *, backoff_initial_ns: int,
                      backoff_max_ns: int) -> None:
        """Connect again, with exponential backoff, when the connection is lost during the
        run (the run does not fail for it)."""
        if self._lib.mqe_set_reconnect(self._live(), client, backoff_initial_ns,
                                       backoff_max_ns):
            raise ValueError(self.error)

    def reconnects(self, client: int) -> list[ReconnectRecord]:
        """Every absence of one client and its way back, in order (kept after close)."""
        if not self._handle:
            return self._final_reconnects[client] if self._final_reconnects else []
        records = []
        for n in range(int(self._lib.mqe_reconnects(self._handle, client))):
            record = ReconnectRecord()
            self._lib.mqe_reconnect_of(self._handle, client, n, ctypes.byref(record))
            records.append(record)
        return records

    def session_present(self, client: int) -> int:
        """The first CONNACK's session present flag (-1: none, or not a persistent or
        reconnecting client)."""
        if not self._handle:
            return self._final_present[client] if self._final_present else -1
        return int(self._lib.mqe_session_present_of(self._handle, client))

    def connect_phases(self, client: int) -> ConnectPhaseTimes:
        """When each phase of one client's connection ended (kept after close)."""
        if not self._handle:
            return self._final_phases[client]
        out = ConnectPhaseTimes()
        self._lib.mqe_connect_phases_of(self._handle, client, ctypes.byref(out))
        return out

    def add_warmup_range(self, client: int, first: int, end: int, warmup_messages: int) -> None:
        """Deliveries from publishers ``first``..``end - 1`` warm up for ``warmup_messages``."""
        if self._lib.mqe_add_warmup_range(self._live(), client, first, end, warmup_messages):
            raise MemoryError(self.error)

    def connect_all(self, keepalive_s: int, timeout_s: float) -> None:
        """Open every client's connection and send its CONNECT; OSError when one cannot."""
        code = self._lib.mqe_connect_all(self._live(), keepalive_s, int(timeout_s * 1000))
        if code:
            raise OSError(-code, self.error) if -code in errno.errorcode else OSError(self.error)

    def subscribe(self, client: int, topic: str, qos: int) -> None:
        """Send one SUBSCRIBE; its SUBACK arrives through poll()."""
        if self._lib.mqe_subscribe(self._live(), client, topic.encode(), qos):
            raise MemoryError(self.error)

    # -- the loop -------------------------------------------------------------------------

    def poll(self, timeout_ns: int) -> bool:
        """Serve every socket for up to ``timeout_ns``; False once a client has failed."""
        return self._lib.mqe_poll(self._live(), max(timeout_ns, 0)) == 0

    def wake(self) -> None:
        """Make a poll() or step() in another thread return now (thread-safe)."""
        with self._lock:
            if self._handle:
                self._lib.mqe_wake(self._handle)

    def run_begin(self, t_start_ns: int, t_deadline_ns: int, t_publish_end_ns: int,
                  drain_window_end_ns: int, drain_idle_ns: int) -> None:
        """Set the run's schedule (drain_idle_ns 0: no idle drain)."""
        self._lib.mqe_run_begin(self._live(), t_start_ns, t_deadline_ns, t_publish_end_ns,
                                drain_window_end_ns, drain_idle_ns)

    def step(self, slice_end_ns: int) -> int:
        """Run until the slice ends, the run ends, a table needs draining or a wake."""
        return int(self._lib.mqe_step(self._live(), slice_end_ns))

    def last_hand_back(self) -> tuple[int, bool]:
        """The last SLICE's time as the step read it, and whether it came at a quiet moment
        (False: forced, at a due publish once the grace was over)."""
        quiet = ctypes.c_int(0)
        at_ns = int(self._lib.mqe_hand_back_of(self._live(), ctypes.byref(quiet)))
        return at_ns, bool(quiet.value)

    def feed(self, client: int, data: bytes) -> bool:
        """Hand ``data`` to a client as if its socket had read it (tests, fuzzing); False
        once the client has failed."""
        return self._lib.mqe_feed(self._live(), client, data, len(data)) == 0

    def open_gpio_chip(self, chip: str, pins: list[int]) -> None:
        """Drive ``pins`` on the GPIO character device ``chip`` too (one uAPI v2 line
        request of at most 64 output lines, driven low): every edge the engine records is
        written to the chip right there. OSError names the chip and why (EBUSY: another
        request holds a line). Validated against tests/fakes/fake_gpiochip.c, not on a
        board's chip here."""
        array_type = ctypes.c_int32 * len(pins)
        code = self._lib.mqe_gpio_open_chip(self._live(), chip.encode(), array_type(*pins),
                                            len(pins))
        if code:
            raise OSError(-code, self.error)

    def gpio_set(self, pin: int, level: int) -> None:
        """Drive one line of the chip's request outside a run (a calibration); OSError
        when the chip refuses or the pin is not requested."""
        code = self._lib.mqe_gpio_set(self._live(), pin, level)
        if code:
            raise OSError(-code, f"GPIO line {pin}: {os.strerror(-code)}")

    def gpio_write_failures(self) -> tuple[int, int]:
        """Line writes the chip refused during runs, and the errno of the last one."""
        last = ctypes.c_int(0)
        failures = int(self._lib.mqe_gpio_write_failures(self._live(), ctypes.byref(last)))
        return failures, last.value

    def gpio_level(self, pin: int) -> int:
        """The level the engine left a virtual line at."""
        return int(self._lib.mqe_gpio_level(self._live(), pin))

    def client_counters(self, client: int) -> ClientStats:
        """One client's counters and state."""
        if not self._handle:
            return self._final[client]
        out = ClientStats()
        self._lib.mqe_client_stats_of(self._handle, client, ctypes.byref(out))
        return out

    def failure(self, client: int) -> str:
        """Why a client failed ("" if it has not)."""
        if not self._handle:
            return ""
        return (self._lib.mqe_client_failure(self._handle, client) or b"").decode(
            errors="replace")

    @property
    def error(self) -> str:
        """The engine's last set-up error."""
        if not self._handle:
            return "the engine is closed"
        return (self._lib.mqe_error(self._handle) or b"").decode(errors="replace")

    @property
    def kernel_stamps(self) -> bool:
        """Whether every socket took SO_TIMESTAMPING."""
        return bool(self._handle) and bool(self._lib.mqe_kernel_stamps(self._handle))

    # -- connection storms (src/storm.c) ------------------------------------------------

    def storm_begin(self, t_start_ns: int, *, keepalive_s: int, timeout_s: float,
                    clean_session: bool) -> None:
        """Begin a storm of every client added: each connects at ``t_start_ns`` + its
        start offset, and fails as a timeout when not connected ``timeout_s`` later."""
        if self._lib.mqe_storm_begin(self._live(), t_start_ns, keepalive_s,
                                     int(timeout_s * 1e9), int(not clean_session)):
            raise ValueError(self.error)

    def storm_step(self, until_ns: int) -> int:
        """Open the connects due and serve every socket until ``until_ns`` (or a wake);
        how many clients are not yet connected or failed."""
        left = int(self._lib.mqe_storm_step(self._live(), until_ns))
        if left < 0:
            raise RuntimeError(self.error)
        return left

    def storm_outcome(self, client: int) -> StormOutcome:
        """One storm client's connect, phase by phase, and what became of it."""
        out = StormOutcome()
        if self._lib.mqe_storm_outcome_of(self._live(), client, ctypes.byref(out)):
            raise ValueError(f"client {client} is not in a storm")
        return out

    # -- events ---------------------------------------------------------------------------

    def take(self, table: int) -> dict[str, list[int]]:
        """The table's rows as columns (lists), then forget them."""
        rows = int(self._lib.mqe_rows(self._handle, table)) if self._handle else 0
        columns = {name: view[:rows].tolist() for name, view in self._views[table].items()}
        if rows:
            self._lib.mqe_clear(self._handle, table)
        return columns

    def take_bytes(self, table: int, columns: Sequence[str] | None = None
                   ) -> tuple[int, dict[str, bytes]]:
        """The table's rows as one ``bytes`` copy per column (native byte order; only
        ``columns`` if given), then forget them: (rows, columns). One memcpy per column,
        no Python object per event."""
        rows = int(self._lib.mqe_rows(self._handle, table)) if self._handle else 0
        if not rows:
            return 0, {}
        views = self._views[table]
        taken = {name: views[name][:rows].cast("B").tobytes()
                 for name in (views if columns is None else columns)}
        self._lib.mqe_clear(self._handle, table)
        return rows, taken

    def rows(self, table: int) -> int:
        """Rows the table holds now."""
        return int(self._lib.mqe_rows(self._handle, table)) if self._handle else 0

    def column_bytes(self, table: int, column: str) -> memoryview:
        """One column's rows as raw bytes (valid until the table is taken or cleared)."""
        return self._views[table][column][:self.rows(table)].cast("B")

    def take_column_into(self, table: int, column: str, into: array.array) -> int:
        """Append one column's rows to ``into`` (an ``array('q')``) as bytes, forget the
        table's rows; return how many (for figures kept whole, with no Python int each)."""
        rows = int(self._lib.mqe_rows(self._handle, table)) if self._handle else 0
        if rows:
            into.frombytes(self._views[table][column][:rows].cast("B"))
            self._lib.mqe_clear(self._handle, table)
        return rows

    def topics(self) -> list[str]:
        """The interned topic names (the topic columns index them)."""
        count = int(self._lib.mqe_topics(self._handle)) if self._handle else 0
        for index in range(len(self._topics), count):
            self._topics.append(self._lib.mqe_topic(self._handle, index).decode(
                errors="replace"))
        return self._topics

    def close(self) -> None:
        """Send DISCONNECT on every live connection, close the sockets, free the engine."""
        if not self._handle:
            return
        self._lib.mqe_disconnect_all(self._handle)
        self._final = [self.client_counters(i) for i in range(self._clients)]
        self._final_phases = [self.connect_phases(i) for i in range(self._clients)]
        self._final_reconnects = [self.reconnects(i) for i in range(self._clients)]
        self._final_present = [self.session_present(i) for i in range(self._clients)]
        with self._lock:
            handle, self._handle = self._handle, None
        self._lib.mqe_destroy(handle)

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.mqe_destroy(self._handle)
            self._handle = None


_BUILD_FAILURE: str | None = None  # once a build failed, this process does not retry it


def unavailable_reason() -> str | None:
    """Why the engine cannot run here (no compiler, a failed build), or None if it can.
    The first call builds the library if needed (an agent calls it as it starts)."""
    global _BUILD_FAILURE
    from mqttbed.core.errors import MqttbedError

    if os.environ.get("MQTTBED_NATIVE_ENGINE") == "off":
        return "the native engine is switched off here (MQTTBED_NATIVE_ENGINE=off)"
    if _BUILD_FAILURE is not None:
        return _BUILD_FAILURE
    try:
        load()
    except (MqttbedError, OSError) as exc:
        _BUILD_FAILURE = f"the native engine cannot be built or loaded: {exc}"
        return _BUILD_FAILURE
    return None
