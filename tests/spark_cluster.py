"""A real Spark standalone cluster on loopback: one master, one worker, from the venv's pyspark.

Both run in the foreground as children of the test (``spark-class ...Master`` and
``...Worker``), each in its own process group with its logs, work dir and local dirs
inside one directory, so stopping them stops their executors too and leaves nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

# Spark logs the port each service bound, which is the one asked for unless something took it
# between _free_port() and the bind (another JVM's UI, in a busy CI run): then the next one
STARTED = re.compile(r"Successfully started service '(?P<service>\w+)' on port (?P<port>\d+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    """``spark://127.0.0.1:<port>`` with one worker of ``cores`` cores, kept in ``root``."""

    def __init__(self, root: Path, cores: int = 1, memory: str = "1g"):
        spark_class = Path(sys.executable).with_name("spark-class")
        if not spark_class.exists() or shutil.which("java") is None:
            pytest.fail(f"a Spark cluster needs {spark_class} (pyspark in the venv) and java "
                        "(a JRE; `make install` installs both)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOG_DIR": str(root / "logs"), "SPARK_LOCAL_DIRS": str(root / "local"),
                    "SPARK_WORKER_DIR": str(root / "work"),
                    "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        self._procs: list[subprocess.Popen] = []
        try:   # whatever stops the start (a failed wait, an unexpected answer) stops the cluster
            self._start(root / "master.log", [str(spark_class),
                                              "org.apache.spark.deploy.master.Master",
                                              "--host", "127.0.0.1", "--port", str(self.port),
                                              "--webui-port", str(self.ui_port)])
            self._wait(lambda state: state.get("status") == "ALIVE", "the master to be alive")
            self.url = f"spark://127.0.0.1:{self.port}"
            self._start(root / "worker.log", [str(spark_class),
                                              "org.apache.spark.deploy.worker.Worker",
                                              self.url, "--host", "127.0.0.1", "--cores",
                                              str(cores), "--memory", memory, "--webui-port",
                                              "0", "--work-dir", str(root / "work")])
            self._wait(lambda state: any(w.get("state") == "ALIVE"
                                         for w in state.get("workers", [])),
                       "a worker to register")
        except BaseException:
            self.stop()
            raise

    def _start(self, log: Path, argv: list[str]) -> None:
        with open(log, "wb") as out:
            self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True))

    def _bound_ports(self) -> bool:
        """Take the master's ports from its log, once it says it bound both."""
        bound = {m["service"]: int(m["port"])
                 for m in STARTED.finditer((self.root / "master.log").read_text(errors="replace"))}
        if "sparkMaster" not in bound or "MasterUI" not in bound:
            return False
        self.port, self.ui_port = bound["sparkMaster"], bound["MasterUI"]
        return True

    def state(self) -> dict:
        """The master's view (its web UI's JSON): status, workers, applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def _wait(self, ready, what: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    pytest.fail(f"a Spark process exited ({proc.returncode}) while waiting for "
                                f"{what}; logs in {self.root}")
            try:
                if self._bound_ports() and ready(self.state()):
                    return
            except OSError:
                pass  # the UI is not up yet
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}; logs in {self.root}")

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: master, worker, executors, Python workers."""
        marker = str(self.root)
        found = []
        for proc in psutil.process_iter(["cmdline", "environ"]):
            try:
                text = " ".join(proc.info["cmdline"] or [])
                env = proc.info["environ"] or {}
                ours = marker in text or env.get("SPARK_LOG_DIR", "").startswith(marker)
                if ours and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def stop(self) -> None:
        """Stop the worker (and its executors), then the master; kill what outlives that."""
        for proc in reversed(self._procs):
            # the whole group: a worker's executors are in it, even if the worker is gone
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for leftover in self.processes():
            leftover.kill()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is empty: all gone
        os.killpg(pgid, signum)
