"""Mosquitto's persistence, for sessions kept across a restart (``workload.reconnect``
with ``persistent``): the sessions written to a file in the run's directory at the stop
(SIGTERM) and read back at the start."""

from __future__ import annotations

from pathlib import Path


def persistence_lines(workdir: Path | None) -> list[str]:
    """Mosquitto's persistence: on in ``workdir`` (sessions kept across a restart: written
    at the SIGTERM, read at the start), or off (None)."""
    if workdir is None:
        return ["persistence false"]
    return ["persistence true", f"persistence_location {workdir}/",
            "persistence_file mosquitto.db", "autosave_interval 0"]
