"""One agent session on the ``gpiod`` backend, run in a process of its own under the fake
GPIO chip (LD_PRELOAD=fake_gpiochip.so: the preload must be there when the process
starts, so tests/test_native_gpio_chip.py runs this file as a program).

Usage: python chip_session.py <chip path> <broker host> <broker port> <pulse 0|1> <vanish|stay>
(vanish: the chip's path is removed once the backend has checked it, before the run)
Prints one JSON document: the session's engine, its generator report, the recorded edges
and the publish and delivery events; or, when the session cannot start, its error.
"""

from __future__ import annotations

import json
import os
import sys

from mqttbed.agents.gpio import GpiodLines, toggle_cost_ns
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role

MESSAGES = 40
PUBLISHER_PIN = 2


def clients() -> list[ClientAssignment]:
    """One QoS 1 publisher (line 2) and two subscribers (lines 3 and 4)."""
    publisher = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="chip/x", qos=1,
                                 gpio_pin=PUBLISHER_PIN, payload_bytes=64, rate_hz=400,
                                 messages=MESSAGES)
    subscribers = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic="chip/x",
                                    qos=1, gpio_pin=3 + j, expected_messages=MESSAGES,
                                    subscribe_rank=j) for j in range(2)]
    return [publisher, *subscribers]


def main() -> None:
    chip, host, port, pulse = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    gpio = GpiodLines(chip)
    if sys.argv[5] == "vanish":
        os.remove(chip)
    events: list[tuple] = []
    try:
        session = MqttSession(Endpoint(host=host, port=port), clients(), gpio, events.append,
                              gpio_pulses=pulse)
    except Exception as exc:  # noqa: BLE001 - the test reads what failed and why
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    try:
        # the runner's calibration: through the engine's request, edges dropped
        toggle_ns = toggle_cost_ns(gpio, PUBLISHER_PIN, toggles=20)
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 5_000_000_000, abort=lambda: False)
    except RuntimeError as exc:
        print(json.dumps({"run_error": str(exc), "edges": gpio.edges()}))
        return
    finally:
        session.close()
    print(json.dumps({
        "native": session.native, "gpio_chip": session.gpio_chip, "toggle_ns": toggle_ns,
        "report": session.generator_report().model_dump(),
        "edges": gpio.edges(), "events": events,
        "driven_elsewhere_after": gpio.driven_elsewhere}))


if __name__ == "__main__":
    main()
