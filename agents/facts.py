"""What a lab machine is, as its agent sees it: ``python -m mqttbed.agents.facts`` (JSON).

``mqttbed lab provision`` runs this with the host's new venv and keeps the answer: board
model (device tree), kernel, machine, Python, the GPIO backends that can work there, and
the clock discipline found (:mod:`mqttbed.core.clock_discipline`).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mqttbed.core.clock_discipline import read_discipline

DEVICE_TREE_MODEL = Path("/proc/device-tree/model")


def gpio_backends() -> list[str]:
    """The GPIO backends whose library is installed and whose device exists here."""
    found = ["virtual"]
    if importlib.util.find_spec("RPi") is not None and DEVICE_TREE_MODEL.exists():
        found.append("rpi")   # RPi.GPIO or its drop-in rpi-lgpio
    if importlib.util.find_spec("gpiod") is not None and glob.glob("/dev/gpiochip*"):
        found.append("gpiod")
    return found


def host_facts() -> dict[str, Any]:
    """This machine's facts (module docstring)."""
    try:
        model = DEVICE_TREE_MODEL.read_bytes().rstrip(b"\0").decode(errors="replace").strip()
    except OSError:
        model = None
    try:
        mqttbed_version = version("mqttbed")
    except PackageNotFoundError:
        mqttbed_version = None
    return {"model": model, "kernel": platform.release(), "machine": platform.machine(),
            "python": platform.python_version(), "mqttbed": mqttbed_version,
            "gpio_backends": gpio_backends(),
            "gpio_chips": sorted(glob.glob("/dev/gpiochip*")),
            "clock": read_discipline().model_dump()}


if __name__ == "__main__":
    json.dump(host_facts(), sys.stdout)
    sys.stdout.write("\n")
