"""GPIO lines on a character device driven from the native engine, against a fake chip.

This machine has no /dev/gpiochip*, no gpio-sim and no CUSE, so the chip is
tests/fakes/fake_gpiochip.c: an LD_PRELOAD library answering the kernel's v2 uAPI ioctls
(linux/gpio.h structs, the kernel's checks and errnos) for one path, and logging each line
write with its CLOCK_MONOTONIC time. What runs here: the protocol of the fake itself (so
that passing against it means something), a run on the engine through real Mosquitto on
loopback whose every publish and receive lands on the right line in the recorded order,
within the recorded times, and requests the chip refuses. What does not: a real chip.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint
from mqttbed.core.run_record import run_record

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "fakes"
SESSION = FAKES / "chip_session.py"
TOGGLES = 20  # chip_session.py's calibration, before the run, on the publisher's line


@pytest.fixture(scope="module")
def fake_chip(tmp_path_factory) -> Path:
    """The fake chip library, built here with the engine's warnings."""
    if not os.environ.get("CC") and not _which("gcc"):
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fake-gpiochip") / "fake_gpiochip.so"
    subprocess.run([os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-Wall", "-Wextra",
                    "-Werror", "-Wshadow", "-Wformat=2", "-shared", "-fPIC", "-o", str(out),
                    str(FAKES / "fake_gpiochip.c"), "-ldl"], check=True, timeout=60)
    return out


def _which(program: str) -> bool:
    return any((Path(d) / program).exists() for d in os.environ.get("PATH", "").split(":"))


def _env(library: Path, chip: Path, log: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LD_PRELOAD": str(library), "FAKE_GPIOCHIP_PATH": str(chip),
            "FAKE_GPIOCHIP_LOG": str(log), **extra}


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _log(path: Path) -> list[tuple[int, str, list[str]]]:
    """The fake chip's log as (time, what, fields)."""
    rows = []
    for line in path.read_text().splitlines():
        t, what, *fields = line.split()
        rows.append((int(t), what, fields))
    return rows


# -- the fake chip speaks the kernel's protocol ----------------------------------------

_HEADER_PROBE = r"""
#include <linux/gpio.h>
#include <stdio.h>
int main(void) {
    printf("%zu %zu %lu %lu %lu %lu\n", sizeof(struct gpio_v2_line_request),
           sizeof(struct gpio_v2_line_values), (unsigned long)GPIO_V2_GET_LINE_IOCTL,
           (unsigned long)GPIO_V2_LINE_SET_VALUES_IOCTL,
           (unsigned long)GPIO_V2_LINE_GET_VALUES_IOCTL, (unsigned long)GPIO_GET_CHIPINFO_IOCTL);
    return 0;
}
"""


class Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("padding", ctypes.c_uint32),
                ("value", ctypes.c_uint64)]


class ConfigAttribute(ctypes.Structure):
    _fields_ = [("attr", Attribute), ("mask", ctypes.c_uint64)]


class LineConfig(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("num_attrs", ctypes.c_uint32),
                ("padding", ctypes.c_uint32 * 5), ("attrs", ConfigAttribute * 10)]


class LineRequest(ctypes.Structure):
    """``struct gpio_v2_line_request`` (linux/gpio.h), checked against the header below."""

    _fields_ = [("offsets", ctypes.c_uint32 * 64), ("consumer", ctypes.c_char * 32),
                ("config", LineConfig), ("num_lines", ctypes.c_uint32),
                ("event_buffer_size", ctypes.c_uint32), ("padding", ctypes.c_uint32 * 5),
                ("fd", ctypes.c_int32)]


class LineValues(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_uint64), ("mask", ctypes.c_uint64)]


def _iowr(number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (0xB4 << 8) | number


# The protocol test runs in a child with the preload; this is its program.
_PROTOCOL_CHILD = textwrap.dedent("""
    import ctypes, errno, fcntl, json, os, sys
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_native_gpio_chip import LineRequest, LineValues, _iowr
    GET_LINE = _iowr(0x07, ctypes.sizeof(LineRequest))
    SET_VALUES = _iowr(0x0F, ctypes.sizeof(LineValues))
    GET_VALUES = _iowr(0x0E, ctypes.sizeof(LineValues))
    INPUT, OUTPUT, EDGE_RISING = 1 << 2, 1 << 3, 1 << 4
    answers = {}

    def ask(name, fd, command, argument):
        # the ioctl's answer under name: "ok" or the errno's name; True if ok
        try:
            fcntl.ioctl(fd, command, argument)
        except OSError as exc:
            answers[name] = errno.errorcode[exc.errno]
            return False
        answers[name] = "ok"
        return True

    def request(name, offsets, flags=OUTPUT, **fields):
        r = LineRequest(num_lines=len(offsets), consumer=b"test")
        for i, offset in enumerate(offsets):
            r.offsets[i] = offset
        r.config.flags = flags
        for key, value in fields.items():
            target, _, field = key.rpartition("__")
            obj = r.config if target == "config" else r
            if field == "padding":
                obj.padding[0] = value
            else:
                setattr(obj, field, value)
        return r.fd if ask(name, chip, GET_LINE, r) else None

    def values(name, fd, command, bits, mask):
        v = LineValues(bits=bits, mask=mask)
        return v.bits if ask(name, fd, command, v) else None

    chip = os.open(os.environ["FAKE_GPIOCHIP_PATH"], os.O_RDWR)
    request("no lines", [])
    request("65 lines", [0], num_lines=65)
    request("offset beyond the chip", [58])
    request("input and output", [5], flags=INPUT | OUTPUT)
    request("edges on an output", [5], flags=OUTPUT | EDGE_RISING)
    request("unknown flag", [5], flags=OUTPUT | (1 << 40))
    request("request padding", [5], padding=1)
    request("config padding", [5], config__padding=1)
    request("11 attributes", [5], config__num_attrs=11)
    request("a line twice", [5, 5])
    request("held by another consumer", [7])
    lines = request("output lines 5 and 6", [5, 6])
    request("a held line again", [6])
    inputs = request("an input line", [9], flags=INPUT)
    values("set with an empty mask", lines, SET_VALUES, 1, 0)
    values("set an input", inputs, SET_VALUES, 1, 1)
    values("set line 6 high", lines, SET_VALUES, 0b10, 0b10)
    values("set line 6 high again", lines, SET_VALUES, 0b10, 0b10)
    answers["levels of 5 and 6"] = values("get", lines, GET_VALUES, 0, 0b11)
    values("set on the chip fd", chip, SET_VALUES, 1, 1)
    ask("unknown ioctl", lines, 0xB4FF, b"\\0" * 16)
    os.close(lines)
    again = request("line 6 after its release", [6])
    os.close(again)
    os.close(inputs)
    os.close(chip)
    print(json.dumps(answers))
""")


def test_the_fake_chip_uses_the_kernel_structs_and_answers_with_the_kernels_errnos(
        fake_chip, tmp_path):
    probe = tmp_path / "probe"
    (tmp_path / "probe.c").write_text(_HEADER_PROBE)
    subprocess.run(["gcc", "-o", str(probe), str(tmp_path / "probe.c")], check=True,
                   timeout=60)
    header = [int(v) for v in subprocess.run([str(probe)], capture_output=True, text=True,
                                             check=True).stdout.split()]
    assert header[:2] == [ctypes.sizeof(LineRequest), ctypes.sizeof(LineValues)] == [592, 16]
    assert header[2:5] == [_iowr(0x07, 592), _iowr(0x0F, 16), _iowr(0x0E, 16)]

    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    env = _env(fake_chip, chip, log, FAKE_GPIOCHIP_HELD="7",
               TEST_DIR=str(Path(__file__).parent))
    answers = json.loads(_run([sys.executable, "-c", _PROTOCOL_CHILD], env))
    assert answers == {
        "no lines": "EINVAL", "65 lines": "EINVAL", "offset beyond the chip": "EINVAL",
        "input and output": "EINVAL", "edges on an output": "EINVAL",
        "unknown flag": "EINVAL", "request padding": "EINVAL", "config padding": "EINVAL",
        "11 attributes": "EINVAL", "a line twice": "EBUSY",
        "held by another consumer": "EBUSY", "output lines 5 and 6": "ok",
        "a held line again": "EBUSY", "an input line": "ok",
        "set with an empty mask": "EINVAL", "set an input": "EPERM",
        "set line 6 high": "ok", "set line 6 high again": "ok", "get": "ok",
        "levels of 5 and 6": 0b10, "set on the chip fd": "EINVAL", "unknown ioctl": "EINVAL",
        "line 6 after its release": "ok"}
    assert [(what, fields) for _, what, fields in _log(log)] == [
        ("request", ["test", "5", "6"]), ("request", ["test", "9"]), ("set", ["6", "1"]),
        ("same", ["6", "1"]), ("release", ["5", "6"]), ("request", ["test", "6"]),
        ("release", ["6"]), ("release", ["9"])]


# -- a run on the engine drives the chip ----------------------------------------------

@pytest.fixture
def unthrottled_broker() -> Iterator[Endpoint]:
    """A Mosquitto without an in-flight quota: past 20 unacknowledged QoS 1 messages (a
    late publisher's burst on a loaded machine) Mosquitto 2.0 drops them, and the counts
    below are of every message."""
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(max_inflight_messages=0), LocalHost())
    yield endpoint
    backend.teardown()


def _session(fake_chip: Path, chip: Path, log: Path, endpoint: Endpoint, pulse: bool = False,
             vanish: bool = False, **extra: str) -> dict:
    env = _env(fake_chip, chip, log, **extra)
    out = _run([sys.executable, str(SESSION), str(chip), endpoint.host, str(endpoint.port),
                "1" if pulse else "0", "vanish" if vanish else "stay"], env)
    return json.loads(out)


@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("pulse", [False, True], ids=["toggle", "pulse"])
def test_every_publish_and_receive_drives_its_line_on_the_chip_right_after_its_edge(
        fake_chip, tmp_path, unthrottled_broker, pulse):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    chip.touch()  # the gpiod backend checks the device exists; the preload answers its open
    result = _session(fake_chip, chip, log, unthrottled_broker, pulse=pulse)
    report = result["report"]
    assert result["native"] and result["gpio_chip"] == str(chip)
    assert report["mqtt_client"] == "native" and report["mqtt_client_reason"] == ""
    assert report["gpio_chip"] == str(chip)
    assert not result["driven_elsewhere_after"]  # the lines went back to the backend

    rows = _log(log)
    assert rows[0][1:] == ("request", ["mqttbed", "2", "3", "4"])
    assert rows[-1][1:] == ("release", ["2", "3", "4"])
    writes = rows[1:-1]
    assert all(what == "set" for _, what, _ in writes), "a write that changed nothing"
    # the runner's toggle calibration goes through the engine's request (pulse: up, down)
    calibrated = TOGGLES * (2 if pulse else 1)
    calibration, run = writes[:calibrated], writes[calibrated:]
    assert [fields for _, _, fields in calibration] == [["2", "1"], ["2", "0"]] * (
        calibrated // 2)

    # the chip saw exactly the edges the engine recorded, in the order recorded
    edges = result["edges"]
    assert [(int(f[0]), int(f[1])) for _, _, f in run] == [(pin, level) for pin, _, level
                                                           in edges]
    events = result["events"]
    publishes = [e for e in events if e[0] == "publish"]
    deliveries = {r: [e for e in events if e[0] == "delivery" and e[3] == r]
                  for r in ("sub-0", "sub-1")}
    assert len(publishes) == 40 and all(len(d) == 40 for d in deliveries.values())
    by_pin: dict[int, list[tuple[int, int, int]]] = {2: [], 3: [], 4: []}
    for (t_set, _, _), (pin, t_edge, level) in zip(run, edges, strict=True):
        by_pin[pin].append((t_set, t_edge, level))
    if pulse:  # a raise per turn that published or received (events handled together
        # share one: a turn's batch, reads that arrived together), each lowered after it
        for writes_of in by_pin.values():
            assert [w[2] for w in writes_of] == [1, 0] * (len(writes_of) // 2)
            assert 1 <= len(writes_of) // 2 <= 40
    else:      # an edge per publish and per receive
        assert {pin: len(w) for pin, w in by_pin.items()} == {2: 40, 3: 40, 4: 40}

    # each write follows its recorded edge, within the SET_VALUES time the run reports
    write_max, lag_max = report["gpio_write_max_ns"], report["gpio_edge_lag_max_ns"]
    assert write_max is not None and lag_max is not None and report["gpio_write_p99_ns"]
    for t_set, t_edge, _ in (w for writes_of in by_pin.values() for w in writes_of):
        assert t_edge <= t_set <= t_edge + write_max
    if not pulse:  # ... and the call it marks: sent before, received within the edge lag
        for (t_set, t_edge, _), publish in zip(by_pin[2], publishes, strict=True):
            assert publish[9] <= t_edge <= t_set   # t_pub is read before the send
        for pin, receiver in ((3, "sub-0"), (4, "sub-1")):
            for (t_set, t_edge, _), delivery in zip(by_pin[pin], deliveries[receiver],
                                                    strict=True):
                t_recv_user = delivery[12]
                assert 0 <= t_edge - t_recv_user <= lag_max
                assert t_set - t_recv_user <= lag_max + write_max
    # nanoseconds, not garbage: sanity bounds on a loaded machine, not a figure
    assert 0 < write_max < 1_000_000_000 and 0 <= lag_max < 1_000_000_000


@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("case", ["busy", "missing"])
def test_a_chip_that_refuses_the_lines_fails_the_run_before_it_starts_naming_chip_and_why(
        fake_chip, tmp_path, broker, case):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    chip.touch()
    if case == "busy":
        result = _session(fake_chip, chip, log, broker, FAKE_GPIOCHIP_HELD="3")
        reason = (rf"GpioUnavailable: GPIO lines \[2, 3, 4\] for the native engine: "
                  rf"requesting 3 lines of {re.escape(str(chip))}: Device or resource busy "
                  r"\(another request holds a line: `gpioinfo` names its consumer\)")
    else:  # the device went away after the backend opened (a chip unbound, a board reset)
        result = _session(fake_chip, chip, log, broker, vanish=True,
                          FAKE_GPIOCHIP_PATH=str(tmp_path / "another-gpiochip"))
        reason = (rf"GpioUnavailable: GPIO lines \[2, 3, 4\] for the native engine: "
                  rf"opening GPIO chip {re.escape(str(chip))}: No such file or directory")
    assert "error" in result, result
    assert re.fullmatch(reason, result["error"]), result["error"]
    # nothing was published or written: the run never started
    rows = _log(log) if log.exists() else []
    assert [what for _, what, _ in rows if what in ("set", "same")] == []



# -- end to end: an agent process with agents.gpio: gpiod ------------------------------

@pytest.mark.integration  # Mosquitto, the controller, an agent process
def test_a_campaign_with_gpiod_agents_drives_their_lines_from_c_and_records_which_chip(
        controller, fake_chip, tmp_path, monkeypatch):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    chip.touch()
    # the agent processes inherit these (their broker does too: it opens no such path)
    for name, value in _env(fake_chip, chip, log).items():
        monkeypatch.setenv(name, value)
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "chip", "agents": {"count": 1, "gpio": "gpiod", "gpio_chip": str(chip)},
         "workload": {"subscribers": 1, "rate_hz": 200, "messages": 20,
                      "warmup_messages": 0}}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
    record = run_record(run.run_metadata, run.id)
    (line,) = record.gpio.values()
    assert (line.backend, line.driver, line.chip) == ("gpiod", "native", str(chip))
    assert line.toggle_ns is not None and line.toggle_ns > 0  # through the engine's request
    (generator,) = record.generators.values()
    assert generator.mqtt_client == "native" and generator.gpio_chip == str(chip)
    assert generator.gpio_write_max_ns is not None
    rows = _log(log)
    assert [what for _, what, _ in rows].count("request") == 1
    assert not [r for r in rows if r[1] == "same"]
    assert rows[0][1:] == ("request", ["mqttbed", "2", "3"])
    assert rows[-1][1:] == ("release", ["2", "3"])
    # the runner's 2000-toggle calibration on the first client's line, then the run's
    # edges: 20 publishes and 20 receives, each line toggling up and down from low
    calibration, run = rows[1:2001], rows[2001:-1]
    calibrated = {fields[0] for _, _, fields in calibration}
    assert len(calibrated) == 1 and [fields[1] for _, _, fields in calibration] == [
        "1", "0"] * 1000
    for pin in ("2", "3"):
        assert [fields[1] for _, _, fields in run if fields[0] == pin] == ["1", "0"] * 10
    assert len(run) == 40


# -- the lab check a Pi user runs: python -m mqttbed.agents.native --gpio-check ---------

def test_the_gpio_check_drives_the_lines_through_the_engine_or_names_the_refusal(
        fake_chip, tmp_path):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    argv = [sys.executable, "-m", "mqttbed.agents.native", "--gpio-check", str(chip), "17",
            "27", "--toggles", "5"]
    report = json.loads(_run(argv, _env(fake_chip, chip, log)))
    assert report["state"] == "driven" and report["lines"] == [17, 27]
    assert report["writes"] == 20 and 0 < report["set_values_p50_ns"] <= report[
        "set_values_max_ns"]
    rows = _log(log)
    assert [(what, fields) for _, what, fields in rows] == [
        ("request", ["mqttbed", "17", "27"]),
        *[("set", [line, level]) for _ in range(5) for line in ("17", "27")
          for level in ("1", "0")],
        ("release", ["17", "27"])]
    busy = subprocess.run(argv, env=_env(fake_chip, chip, log, FAKE_GPIOCHIP_HELD="27"),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1
    assert json.loads(busy.stdout) == {
        "state": "refused", "reason": f"requesting 2 lines of {chip}: Device or resource busy"}


# -- who holds the lines ----------------------------------------------------------------

class _HeldRequest:
    """A libgpiod line request as GpiodLines holds one after a lean-client run."""

    def __init__(self) -> None:
        self.released = False
        self.values: list[tuple[int, object]] = []

    def set_value(self, pin: int, value: object) -> None:
        self.values.append((pin, value))

    def release(self) -> None:
        self.released = True


def test_gpiod_lines_release_their_request_before_the_engine_takes_the_lines(tmp_path):
    from mqttbed.agents.gpio import GpiodLines

    chip = tmp_path / "gpiochip0"
    chip.touch()
    gpio = GpiodLines(str(chip))
    held = _HeldRequest()
    gpio._request = held          # an earlier lean run's request, still held
    writes: list[tuple[int, int]] = []
    gpio.hand_over([2, 3], lambda pin, level: writes.append((pin, level)))
    assert held.released and gpio.driven_elsewhere   # one request per line: the kernel's rule
    gpio.toggle(2)
    gpio.toggle(2)
    assert writes == [(2, 1), (2, 0)] and held.values == []
    gpio.take_back({2: 0, 3: 1})
    assert not gpio.driven_elsewhere  # the next lean run's setup() requests them again


def test_rpi_lines_stay_on_the_lean_client_and_the_reason_says_why_and_what_to_choose():
    from mqttbed.agents.gpio import RpiGpio, VirtualGpio
    from mqttbed.agents.native_session import unsupported_reason
    from mqttbed.core.protocol import ClientAssignment, Role

    clients = [ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="t", qos=0,
                                gpio_pin=17, messages=1, rate_hz=1)]
    endpoint = Endpoint(host="127.0.0.1", port=1883)
    assert unsupported_reason(endpoint, clients, VirtualGpio()) is None
    rpi = RpiGpio.__new__(RpiGpio)  # not __init__: that needs a Pi and RPi.GPIO
    reason = unsupported_reason(endpoint, clients, rpi)
    assert reason == (
        "GPIO backend 'rpi': the native engine drives virtual lines and GPIO character "
        "devices (agents.gpio: gpiod) only; 'rpi' lines (RPi.GPIO, /dev/gpiomem on a Pi "
        "1-4) are toggled from Python by the lean client. On a Pi, agents.gpio: gpiod drives "
        "them from C")


@pytest.mark.integration  # Mosquitto
def test_line_writes_the_chip_refuses_during_a_run_fail_it_with_their_count_and_errno(
        fake_chip, tmp_path, broker):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    chip.touch()
    # the calibration's 20 writes and 10 of the run's go through, then the driver fails
    result = _session(fake_chip, chip, log, broker, FAKE_GPIOCHIP_FAIL_AFTER=str(TOGGLES + 10))
    refused = len(result["edges"]) - 10
    assert refused > 0
    assert result["run_error"] == (f"GPIO chip {chip}: {refused} line writes (SET_VALUES) "
                                   f"failed, the last with Input/output error")
    assert [what for _, what, _ in _log(log)].count("set") == TOGGLES + 10


@pytest.mark.integration  # Mosquitto, the controller, an agent process
def test_a_campaign_whose_chip_holds_a_line_elsewhere_fails_before_running_naming_it(
        controller, updates, fake_chip, tmp_path, monkeypatch):
    chip, log = tmp_path / "gpiochip-fake", tmp_path / "chip.log"
    chip.touch()
    for name, value in _env(fake_chip, chip, log, FAKE_GPIOCHIP_HELD="3").items():
        monkeypatch.setenv(name, value)
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "busy", "agents": {"count": 1, "gpio": "gpiod", "gpio_chip": str(chip)},
         "workload": {"subscribers": 1, "messages": 20, "warmup_messages": 0}}))
    assert controller.engine.run_campaign(campaign_id) == "failed"
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
    assert "running" not in updates.states(run.id)
    assert (f"GPIO lines [2, 3] for the native engine: requesting 2 lines of {chip}: Device "
            f"or resource busy") in run.reason, run.reason
    assert not log.exists() or "set" not in log.read_text()
