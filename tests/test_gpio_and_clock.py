"""GPIO backends off a Pi, toggle cost, and the agents' clock offsets."""

from __future__ import annotations

from array import array

import pytest

from mqttbed.agents import gpio as gpio_module
from mqttbed.agents.gpio import GpioUnavailable, VirtualGpio, open_gpio, toggle_cost_ns
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.clock import ntp_offset
from mqttbed.core.run_record import run_record


def test_rpi_backend_off_a_pi_names_the_missing_device_and_the_fix():
    with pytest.raises(GpioUnavailable, match=r"/dev/gpiomem.*gpio: gpiod .* or virtual"):
        open_gpio("rpi")


def test_a_gpio_chip_on_a_board_that_is_no_pi_is_not_taken_for_one(tmp_path, monkeypatch):
    chip = tmp_path / "gpiochip0"
    chip.touch()
    model = tmp_path / "model"
    model.write_bytes(b"Pine64 RockPro64\0")
    monkeypatch.setattr(gpio_module, "DEVICE_TREE_MODEL", model)
    real_exists = gpio_module.os.path.exists
    monkeypatch.setattr(gpio_module.os.path, "exists",
                        lambda p: p == "/dev/gpiomem" or real_exists(p))
    with pytest.raises(GpioUnavailable, match=r"model names no Raspberry Pi"):
        open_gpio("rpi")


def test_auto_is_virtual_off_a_pi_and_rpi_on_one(tmp_path, monkeypatch):
    assert gpio_module.raspberry_pi_model() is None  # this machine
    assert open_gpio("auto").backend == "virtual"
    model = tmp_path / "model"
    model.write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\0")
    monkeypatch.setattr(gpio_module, "DEVICE_TREE_MODEL", model)
    assert gpio_module.raspberry_pi_model() == "Raspberry Pi 4 Model B Rev 1.4"
    # on a "Pi" auto means rpi: here it then stops at the missing device, not at virtual
    with pytest.raises(GpioUnavailable, match="GPIO backend 'rpi'"):
        open_gpio("auto")


def test_gpiod_backend_names_the_missing_chip_and_the_fix():
    with pytest.raises(GpioUnavailable, match=r"/dev/gpiochip7.*agents.gpio: virtual"):
        open_gpio("gpiod", chip="/dev/gpiochip7")


def test_virtual_lines_record_each_edge_once_with_alternating_levels():
    gpio = VirtualGpio()
    gpio.setup([2, 3])
    for pin in (2, 3, 2):
        gpio.toggle(pin)
    edges = gpio.edges()
    assert [(pin, level) for pin, _, level in edges] == [(2, 1), (3, 1), (2, 0)]
    assert [t for _, t, _ in edges] == sorted(t for _, t, _ in edges)
    assert gpio.edges() == []


def engine_edges(pins: list[int], times: list[int], levels: list[int]) -> tuple[bytes, ...]:
    """Edge columns as the native engine's edge table hands them over."""
    return (array("i", pins).tobytes(), array("q", times).tobytes(),
            array("B", levels).tobytes())


def test_engine_edges_stay_the_engines_bytes_up_to_the_uploader():
    gpio = VirtualGpio()
    gpio.setup([2, 3])
    first = engine_edges([2, 3], [10, 11], [1, 1])
    gpio.add_edge_buffers(*first)
    handed = gpio.edge_buffers()
    assert (handed.pin, handed.t_ns, handed.level) == first
    assert all(a is b for a, b in zip((handed.pin, handed.t_ns, handed.level), first,
                                      strict=True))   # the very bytes: no copy, no list
    assert gpio.edge_buffers().rows == 0   # taken: forgotten
    gpio.add_edge_buffers(*first)
    gpio.add_edge_buffers(*engine_edges([2], [12], [0]))
    joined = gpio.edge_buffers()
    assert joined.as_lists() == {"pin": [2, 3, 2], "t_ns": [10, 11, 12], "level": [1, 1, 0]}


def test_lists_of_engine_edges_are_made_only_for_readers_of_lists_python_edges_first():
    """Edges toggled in Python (a calibration, the lean client) come first, then the
    engine's; every reader (tuples, columns, buffers) sees the same edges."""
    def recorded() -> VirtualGpio:
        gpio = VirtualGpio()
        gpio.setup([2, 3])
        gpio.toggle(3)
        gpio.add_edge_buffers(*engine_edges([2, 2], [10, 11], [1, 0]))
        gpio.add_edge_buffers(*engine_edges([3], [12], [0]))
        return gpio

    edges = recorded().edges()
    assert [(pin, level) for pin, _, level in edges] == [(3, 1), (2, 1), (2, 0), (3, 0)]
    assert [t for _, t, _ in edges[1:]] == [10, 11, 12]
    pins, times, levels = recorded().edge_columns()
    assert (pins, times[1:], levels) == ([3, 2, 2, 3], [10, 11, 12], [1, 1, 0, 0])
    assert times[0] > 0   # the Python toggle's CLOCK_MONOTONIC stamp
    buffers = recorded().edge_buffers().as_lists()
    assert (buffers["pin"], buffers["t_ns"][1:], buffers["level"]) == \
        ([3, 2, 2, 3], [10, 11, 12], [1, 1, 0, 0])
    python_only = VirtualGpio()
    python_only.setup([4])
    python_only.toggle(4)
    python_only.toggle(4)
    (one, two) = python_only.edges()
    python_only.toggle(4)
    assert python_only.edge_buffers().as_lists()["level"] == [1]
    assert (one[2], two[2]) == (1, 0)


def test_engine_edge_columns_of_unequal_lengths_are_refused_by_name():
    gpio = VirtualGpio()
    pins, times, levels = engine_edges([2, 3], [10, 11], [1, 1])
    with pytest.raises(ValueError, match=r"edges: column 't_ns' holds 8 bytes; 2 edges"):
        gpio.add_edge_buffers(pins, times[:8], levels)
    assert gpio.edge_buffers().rows == 0


def test_toggle_cost_is_measured_and_leaves_the_line_as_it_was():
    gpio = VirtualGpio()
    gpio.setup([2])
    cost = toggle_cost_ns(gpio, 2, toggles=500)
    assert 0 < cost < 1_000_000
    gpio.toggle(2)
    assert gpio.edges()[0][2] == 1  # still low before this toggle


def test_ntp_offset_recovers_a_known_offset_within_half_the_round_trip():
    # server clock = ours + 5_000; 300 ns each way, 100 ns inside the server
    t0 = 1_000_000
    t1 = t0 + 300 + 5_000
    t2 = t1 + 100
    t3 = t0 + 300 + 100 + 300
    offset, half_rtt = ntp_offset(t0, t1, t2, t3)
    assert offset == 5_000 and half_rtt == 300


@pytest.mark.integration
def test_agents_on_the_controllers_machine_share_its_clock(controller):
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "clk", "agents": {"count": 1},
         "workload": {"subscribers": 1, "rate_hz": 200, "messages": 20, "warmup_messages": 0}}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
    record = run_record(run.run_metadata, run.id)
    (clock,) = record.agent_clocks.values()
    assert (clock.offset_ns, clock.uncertainty_ns, clock.method) == (0, 0, "same-clock")
    # what keeps this machine's clock is reported too, though one clock needs none
    assert clock.discipline in ("none", "chrony", "ptp")
    (gpio,) = record.gpio.values()
    assert gpio.backend == "virtual" and gpio.toggle_ns is not None and gpio.toggle_ns > 0


@pytest.mark.integration
def test_probed_offset_on_loopback_is_zero_within_its_uncertainty(controller):
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "ntp", "agents": {"count": 1, "force_clock_probe": True},
         "workload": {"subscribers": 1, "rate_hz": 200, "messages": 20, "warmup_messages": 0}}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
    (clock,) = run_record(run.run_metadata, run.id).agent_clocks.values()
    assert clock.method == "ntp"
    assert 0 < clock.uncertainty_ns < 5_000_000
    # the true offset is 0 (one machine): the estimate must be within its own bound
    assert abs(clock.offset_ns) <= clock.uncertainty_ns


@pytest.mark.integration
def test_asking_for_pi_gpio_off_a_pi_fails_the_run_before_it_starts(controller, updates):
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "gpio", "agents": {"count": 1, "gpio": "gpiod", "gpio_chip": "/dev/gpiochip9"},
         "workload": {"subscribers": 1, "messages": 20, "warmup_messages": 0}}))
    assert controller.engine.run_campaign(campaign_id) == "failed"
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
    assert "running" not in updates.states(run.id)
    assert "exited with code 3" in run.reason and "/dev/gpiochip9" in run.reason


def test_pulse_mode_raises_on_events_and_lowers_on_settle():
    gpio = VirtualGpio()
    gpio.setup([2, 3])
    gpio.pulse_mode = True
    gpio.toggle(2)
    gpio.toggle(2)  # a second event before settling: the pulse is already up
    gpio.toggle(3)
    gpio.settle()
    gpio.toggle(2)
    gpio.settle()
    assert [(pin, level) for pin, _, level in gpio.edges()] == [
        (2, 1), (3, 1), (2, 0), (3, 0), (2, 1), (2, 0)]
