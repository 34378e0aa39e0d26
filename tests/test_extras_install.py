"""Each extra installed alone, in a fresh venv, runs its commands: a client (no extra), a
controller without the agent extra, an agent (a Pi) without the controller's.

Installs with uv (in the dev extra) from a copy of this tree's source files: a few seconds
an install once its cache is warm. (A build inside the checkout would rewrite its
``*.egg-info`` and ``build/``, which other tests read: from the copy the module runs beside
them, on one worker.) In each venv every ``mqttbed`` subcommand's ``--help`` must work (the
parser of every subcommand is built whatever is installed), and each role's own commands
must run: ``campaigns list`` for a client, ``token create/list`` for a controller, the
agent program for an agent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_wheel import source_files

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.timeout(300),
              pytest.mark.parallel, pytest.mark.xdist_group("extras")]

REPO = Path(__file__).resolve().parents[1]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")

# Run inside the fresh venv: every subcommand's --help, through the parser main() uses.
EVERY_HELP = """
import argparse, contextlib, io, json
from mqttbed.controller.cli import build_parser

def paths(parser, prefix):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield [*prefix, name]
                yield from paths(sub, [*prefix, name])

report = {"helped": [], "failed": {}}
for path in paths(build_parser(), []):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            build_parser().parse_args([*path, "--help"])
    except SystemExit as exc:
        if exc.code == 0 and "usage:" in out.getvalue():
            report["helped"].append(" ".join(path))
            continue
        report["failed"][" ".join(path)] = f"exit {exc.code}: {out.getvalue()[-300:]}"
    except Exception as exc:
        report["failed"][" ".join(path)] = f"{type(exc).__name__}: {exc}"
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    if UV is None:
        pytest.fail("uv not found: it comes with the dev extra (make install)")
    root = tmp_path_factory.mktemp("extras")
    tree = root / "tree"
    for name in source_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)

    def install_extra(extra: str | None) -> Path:
        venv = root / (extra or "client")
        subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        target = f"{tree}[{extra}]" if extra else str(tree)
        done = subprocess.run([UV, "pip", "install", "-q", "--python", str(venv / "bin/python"),
                               "--refresh-package", "mqttbed", target],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        return venv

    return install_extra


def run(venv: Path, *argv: str, **kwargs) -> subprocess.CompletedProcess:
    # Run from the venv, not from this tree, whose mqttbed/ folder would shadow the install.
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=60, cwd=venv, **kwargs)


def every_help_works(venv: Path) -> list[str]:
    done = run(venv, "python", "-c", EVERY_HELP)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["failed"] == {}
    assert {"campaigns list", "agent", "serve", "token revoke"} <= set(report["helped"])
    top = run(venv, "mqttbed", "--help")  # the console script itself
    assert top.returncode == 0 and "campaigns" in top.stdout, top.stderr
    return report["helped"]


def importable(venv: Path, module: str) -> bool:
    return run(venv, "python", "-c", f"import {module}").returncode == 0


def test_a_client_install_runs_the_campaign_commands(install):
    venv = install(None)
    every_help_works(venv)
    assert not importable(venv, "paho") and not importable(venv, "fastapi")
    listed = run(venv, "mqttbed", "campaigns", "list", "--url", "http://127.0.0.1:9",
                 "--token", "mqb_x")
    assert listed.returncode == 1
    assert "cannot reach the controller at http://127.0.0.1:9" in listed.stderr


def test_a_controller_install_without_the_agent_extra_runs_its_commands(install, tmp_path):
    venv = install("controller")
    every_help_works(venv)
    assert not importable(venv, "gpiod")  # the agent extra's own
    data = str(tmp_path / "data")
    created = run(venv, "mqttbed", "token", "create", "--name", "ops", "--data-dir", data)
    assert created.returncode == 0 and created.stdout.startswith("mqb_"), created.stderr
    listed = run(venv, "mqttbed", "token", "list", "--data-dir", data)
    assert " ops " in listed.stdout and "active" in listed.stdout, listed.stderr


def test_an_agent_install_without_the_controller_extra_runs_the_agent(install):
    venv = install("agent")
    every_help_works(venv)
    assert not importable(venv, "fastapi") and not importable(venv, "sqlalchemy")
    assert importable(venv, "mqttbed.agents.main")
    refused = run(venv, "mqttbed", "agent", "--controller", "http://127.0.0.1:9",
                  env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0
    assert "--token (or MQTTBED_AGENT_TOKEN) is required" in refused.stderr
