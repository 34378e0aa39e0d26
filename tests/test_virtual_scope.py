"""The virtual scope, through pyvisa-py over real TCP, driven by the RigolDS1000Z driver."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import pyvisa

from mqttbed.core.clock import monotonic_ns
from mqttbed.instruments.scope import RigolDS1000Z, open_scope
from mqttbed.instruments.scope.virtual import IDENTITY, VirtualScope
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(30)

TIMEBASE_S = 50e-6  # 11 divisions after the trigger: 550 us
US = 1_000


@pytest.fixture
def virtual():
    scope = VirtualScope().start()
    yield scope
    scope.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("scpi-")] == []


@pytest.fixture
def visa(virtual):
    manager = pyvisa.ResourceManager("@py")
    resource = manager.open_resource(f"TCPIP0::127.0.0.1::{virtual.port}::SOCKET",
                                     read_termination="\n", write_termination="\n",
                                     timeout=2000)
    yield resource
    resource.close()
    manager.close()


@pytest.fixture
def scope(visa):
    driver = RigolDS1000Z(visa, poll_interval_s=0.002)
    driver.configure(1, [2, 3], timebase_s_per_div=TIMEBASE_S)
    return driver


def publish_at(virtual: VirtualScope, t_ns: int, delays_ns: dict[int, int]) -> None:
    """A 100 us publisher pulse on CH1 at ``t_ns``, and a pulse on each subscriber later."""
    virtual.feed(1, [(t_ns, 1), (t_ns + 100 * US, 0)])
    for channel, delay_ns in delays_ns.items():
        virtual.feed(channel, [(t_ns + delay_ns + 100 * US, 0), (t_ns + delay_ns, 1)])


def test_delays_between_fed_edges_are_measured_to_the_nanosecond(virtual, scope):
    assert scope.identify() == IDENTITY
    scope.arm_single()
    t0 = monotonic_ns() + 10 * US
    publish_at(virtual, t0, {2: 87 * US + 3, 3: 120 * US})
    virtual.advance(t0 + 1_000 * US)
    assert scope.wait_triggered(timeout_s=5.0) is True
    delays = scope.edge_delays_s()
    assert sorted(delays) == [2, 3]
    assert round(delays[2] * 1e9) == 87_003
    assert round(delays[3] * 1e9) == 120_000


def test_an_edge_before_arming_does_not_trigger(virtual, scope):
    early = monotonic_ns()
    publish_at(virtual, early, {2: 50 * US, 3: 60 * US})
    wait_until(lambda: monotonic_ns() > early + 60 * US, 1, "the clock to pass the edges",
               poll_s=0.0001)
    scope.arm_single()
    virtual.advance(early + 5_000 * US)
    assert scope.wait_triggered(timeout_s=0.1) is False
    assert scope.trigger_status() == "WAIT"

    later = monotonic_ns() + 10 * US
    publish_at(virtual, later, {2: 30 * US, 3: 40 * US})
    virtual.advance(later + 1_000 * US)
    assert scope.wait_triggered(timeout_s=5.0) is True
    assert scope.edge_delays_s() == {2: pytest.approx(30e-6, abs=1e-9),
                                     3: pytest.approx(40e-6, abs=1e-9)}


def test_the_acquisition_completes_only_once_the_horizon_passes_the_record(virtual, scope):
    scope.arm_single()
    t0 = monotonic_ns() + 10 * US
    publish_at(virtual, t0, {2: 87 * US, 3: 120 * US})
    virtual.advance(t0 - 1)
    assert scope.trigger_status() == "WAIT"  # the trigger edge is beyond the horizon
    virtual.advance(t0 + 549 * US)
    assert scope.trigger_status() == "TD"  # triggered, record not yet full
    assert scope.wait_triggered(timeout_s=0.05) is False
    virtual.advance(t0 + 550 * US)
    assert scope.wait_triggered(timeout_s=5.0) is True


def test_a_subscriber_without_an_edge_in_the_record_measures_none(virtual, scope):
    scope.arm_single()
    t0 = monotonic_ns() + 10 * US
    publish_at(virtual, t0, {2: 87 * US, 3: 600 * US})  # CH3 only after the record's end
    virtual.advance(t0 + 2_000 * US)
    assert scope.wait_triggered(timeout_s=5.0) is True
    delays = scope.edge_delays_s()
    assert delays[3] is None
    assert delays[2] == pytest.approx(87e-6, abs=1e-9)


def test_edges_fed_late_in_batches_from_another_thread_are_measured(virtual, scope):
    scope.arm_single()
    t0 = monotonic_ns() + 10 * US

    def agent_uploads():
        time.sleep(0.02)  # window: late, while the scope already waits
        virtual.feed(3, [(t0 + 120 * US, 1)])
        virtual.advance(t0 - 1)
        time.sleep(0.02)  # window: a second batch later still
        virtual.feed(1, [(t0, 1)])
        virtual.feed(2, [(t0 + 87 * US, 1)])
        virtual.advance(t0 + 1_000 * US)

    uploader = threading.Thread(target=agent_uploads)
    uploader.start()
    assert scope.wait_triggered(timeout_s=5.0) is True
    uploader.join()
    assert scope.edge_delays_s() == {2: pytest.approx(87e-6, abs=1e-9),
                                     3: pytest.approx(120e-6, abs=1e-9)}


def test_the_settings_configure_wrote_read_back_as_the_instrument_reports_them(scope):
    assert scope.timebase_scale == pytest.approx(TIMEBASE_S)
    assert scope.timebase_offset == pytest.approx(5 * TIMEBASE_S)
    assert scope.trigger_source == "CHANnel1"
    assert scope.trigger_slope == "POSitive"
    assert scope.trigger_level == pytest.approx(1.65)
    assert scope.channel_display[3] is True
    assert scope.channel_offset[2] == pytest.approx(-1.65)
    assert scope.channel_display[4] is False


def test_short_forms_and_compound_commands_are_understood(visa):
    visa.write(":TRIG:EDG:SOUR CHAN2;LEV 1.2")
    assert visa.query(":TRIGger:EDGe:SOURce?;LEVel?") == "CHAN2;1.200000e+00"


def test_garbage_is_ignored_with_an_error_queued_and_the_server_keeps_answering(virtual, visa):
    visa.write("THIS IS NOT SCPI")
    visa.write(":TIMebase:MAIN:SCALe banana")
    visa.write_raw(b"\xff\xfe\x00;;\n")
    visa.write(":CHANnel9:DISPlay ON")
    assert visa.query("*IDN?") == IDENTITY
    errors = [visa.query(":SYSTem:ERRor?") for _ in range(5)]
    assert errors == ['-113,"Undefined header"', '-104,"Data type error"',
                      '-113,"Undefined header"', '-114,"Header suffix out of range"',
                      '0,"No error"']
    with socket.create_connection(("127.0.0.1", virtual.port), timeout=2) as raw:
        raw.sendall(b"*IDN?\n*OPC?\n")
        answer = b""
        while answer.count(b"\n") < 2:
            answer += raw.recv(4096)
    assert answer == IDENTITY.encode() + b"\n1\n"


def test_open_scope_opens_the_resource_with_pyvisa_py_and_returns_the_rigol_driver(virtual):
    scope = open_scope(virtual.resource, "rigol-ds1000z")
    try:
        assert isinstance(scope, RigolDS1000Z)
        assert scope.identify() == IDENTITY
    finally:
        scope.close()


def test_open_scope_refuses_an_unknown_dialect_listing_the_known_ones(virtual):
    with pytest.raises(ValueError, match="'tek'.*keysight-x, rigol-ds1000z"):
        open_scope(virtual.resource, "tek")


def test_stop_closes_the_port(virtual):
    port = virtual.port
    virtual.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
