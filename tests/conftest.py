"""Shared fixtures: an embedded controller on a temporary data dir, one Spark session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import psutil
import pytest

from mqttbed.controller.embedded_controller import EmbeddedController
from mqttbed.controller.engine import RunUpdate
from mqttbed.core.settings import Settings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


class UpdateLog(list[RunUpdate]):
    """Every RunUpdate the engine emitted, in order."""

    def states(self, run_id: str) -> list[str]:
        return [u.state for u in self if u.run_id == run_id]


@pytest.fixture
def updates() -> UpdateLog:
    return UpdateLog()


@pytest.fixture
def controller(tmp_path, updates) -> Iterator[EmbeddedController]:
    with EmbeddedController(Settings(data_dir=tmp_path / "data"),
                            listeners=[updates.append]) as ctl:
        yield ctl


@pytest.fixture(scope="session")
def spark():
    from mqttbed.analytics.spark import get_spark, stop_spark

    session = get_spark()
    yield session
    stop_spark()


def child_processes(name_part: str) -> list[psutil.Process]:
    """Descendants of this test process whose command line contains ``name_part``."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if name_part in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found
