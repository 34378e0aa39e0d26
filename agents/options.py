"""The options of ``mqttbed agent``, apart from the agent itself.

``mqttbed --help`` builds every subcommand's parser; importing the agent program for that
would import its MQTT stack (paho), which a controller-only or client-only install lacks.
"""

from __future__ import annotations

import argparse
import socket
from importlib.metadata import PackageNotFoundError, version

from mqttbed.agents.gpio import BACKENDS  # gpio imports its device libraries lazily
from mqttbed.core.settings import AgentSettings
from mqttbed.core.tls import add_ca_file_option


def _version() -> str:
    try:
        return version("mqttbed")
    except PackageNotFoundError:
        return "unknown"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add the agent's options to ``parser`` (a subcommand of ``mqttbed``) or a new one."""
    parser = parser or argparse.ArgumentParser(prog="mqttbed agent")
    parser.add_argument("--version", action="version", version=f"mqttbed {_version()}")
    settings = AgentSettings.load()
    parser.add_argument("--controller", required=True,
                        help="controller URL, e.g. http://host:8000 or https://host:8443")
    parser.add_argument("--token", default=settings.agent_token,
                        help="agent token (or MQTTBED_AGENT_TOKEN)")
    add_ca_file_option(parser, settings.ca_file)
    parser.add_argument("--name", default=socket.gethostname(), help="name shown by the controller")
    parser.add_argument("--gpio", default="auto", choices=BACKENDS,
                        help="GPIO backend: auto (default: rpi on a Raspberry Pi, else "
                             "virtual), virtual, rpi (RPi.GPIO / rpi-lgpio), gpiod")
    parser.add_argument("--gpio-chip", default="/dev/gpiochip0",
                        help="GPIO character device for the gpiod backend")
    return parser
