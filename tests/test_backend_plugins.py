"""A backend from outside: a package installed with pip, found through the
``mqttbed.backends`` entry-point group, measured by a campaign, and gone when uninstalled.

The plug-in is written here as a user would write it, against mqttbed's public contract
only (core.backends); it wraps a Mosquitto process started by its own code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.core import backends
from mqttbed.core.errors import SpecError

pytestmark = pytest.mark.integration

PLUGIN = "mqttbed-plugin-probe"
MODULE = "mqttbed_plugin_probe"

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{PLUGIN}"
version = "0.0.1"

[project.entry-points."mqttbed.backends"]
probe = "{MODULE}:DECLARATION"
"""

# A whole backend in one file: options, the class, the declaration.
SOURCE = '''
"""A test backend: Mosquitto started by the plug-in's own code."""

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from mqttbed.core.backends import BackendDeclaration, BrokerFeatures, DeploymentRecord
from mqttbed.core.host import Host, wait_for_tcp
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.instruments.resources import ProcessTreeSampler


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backend: Literal["probe"] = "probe"


class ProbeBackend:
    name = "probe"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="probe-"))
        self.sampler: ProcessTreeSampler | None = None
        self.port = 0

    def deploy(self, spec: Options, host: Host) -> Endpoint:
        self.port = host.free_port()
        conf = self.dir / "m.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\\nallow_anonymous true\\nuser root\\n")
        self.proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto",
                                      "-c", str(conf)], start_new_session=True)
        wait_for_tcp("127.0.0.1", self.port, 5.0)
        self.sampler = ProcessTreeSampler(self.proc.pid, 0.2)
        self.sampler.start()
        return Endpoint(host="127.0.0.1", port=self.port, transport=Transport.MQTT_TCP)

    def health(self) -> str | None:
        if self.proc is None:
            return "not deployed"
        code = self.proc.poll()
        return None if code is None else f"broker probe exited with code {code}"

    def resource_samples(self) -> list[BrokerResourceSample]:
        return [] if self.sampler is None else self.sampler.samples

    def deployment(self) -> DeploymentRecord:
        return DeploymentRecord(backend=self.name, version="probe-1", port=self.port,
                                pid=None if self.proc is None else self.proc.pid)

    def section_records(self) -> dict[str, list[float]]:
        return {}

    def teardown(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


DECLARATION = BackendDeclaration(
    name="probe", summary="a test plug-in: Mosquitto from outside mqttbed",
    options=Options, backend="mqttbed_plugin_probe:ProbeBackend",
    unavailable=lambda: None,
    features=BrokerFeatures(qos=frozenset({0, 1}), note="the probe offers QoS 0 and 1"))
'''


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                   check=True, timeout=300)


@pytest.fixture
def installed_plugin(tmp_path: Path):
    """The probe package pip-installed (not editable: a real install), then uninstalled."""
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    _pip("install", "--no-deps", "--no-build-isolation", str(tmp_path))
    backends.refresh()
    try:
        yield
    finally:
        _pip("uninstall", "-y", PLUGIN)
        sys.modules.pop(MODULE, None)
        backends.refresh()


@pytest.mark.system  # a pip install, a campaign, a pip uninstall
def test_an_installed_plugin_is_found_runs_a_campaign_and_is_gone_when_uninstalled(
        installed_plugin, controller):
    assert "probe" in backends.backend_names()
    assert backends.unavailable_reason("probe") is None
    # its declared features reach spec validation: QoS 2 is refused before anything runs
    with pytest.raises((ValueError, SpecError), match="workload.qos 2: broker probe"):
        parse_spec({"name": "p", "broker": {"backend": "probe"}, "workload": {"qos": 2}})

    spec = parse_spec({"name": "plugin", "broker": {"backend": "probe"}, "agents": {"count": 1},
                       "workload": {"subscribers": 2, "rate_hz": 200, "messages": 100,
                                    "warmup_messages": 0, "qos": 1}})
    campaign_id = controller.engine.create_campaign(spec)
    status = controller.engine.run_campaign(campaign_id)
    from mqttbed.controller.db import RunRow
    from mqttbed.core.run_record import run_record

    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        assert (status, run.state) == ("done", "done"), run.reason
        broker = run_record(run.run_metadata, run.id).broker
        assert broker is not None and (broker.backend, broker.version) == ("probe", "probe-1")
    from tests.test_engine_failures import dataset_rows

    # 100 publishes, 2 x 100 deliveries, 2 subscriptions: nothing lost at QoS 1
    assert dataset_rows(controller, campaign_id, run.id) == 100 + 200 + 2


def test_an_uninstalled_plugin_is_an_unknown_backend_naming_the_installed_ones():
    backends.refresh()
    assert "probe" not in backends.backend_names()
    with pytest.raises(ValueError, match="unknown broker backend 'probe'; available: .*mosquitto"):
        backends.declaration("probe")
