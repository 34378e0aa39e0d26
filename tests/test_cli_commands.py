"""The commands a user reaches for: ``run NAME``, ``campaigns list`` on the local data
dir, ``latest`` / ``latest~N`` in ``report``, ``analyze`` and ``compare``, ``--version``,
``validate``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import processes_tagged, wait_until
from tests.results_campaigns import RESULTS_CAMPAIGNS, Campaigns, two_campaigns

# The first test to use the campaigns makes them (tests/results_campaigns.py).
# with tests/test_results_api.py on one worker: the two campaigns are made once a process
pytestmark = [pytest.mark.timeout(480), pytest.mark.xdist_group(RESULTS_CAMPAIGNS)]

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("mqttbed"))


def mqttbed(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``mqttbed ARGS`` with no controller or data dir from this environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQTTBED_")}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout_s,
                          cwd=cwd, env={**clean, **(env or {})})


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory) -> Campaigns:
    return two_campaigns(tmp_path_factory)


# --- --version, validate, run NAME: no campaign needed ---------------------------------

def test_version_is_pyprojects_one():
    from mqttbed import __version__

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = mqttbed("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"mqttbed {declared}"
    assert __version__ == declared


def test_validate_a_built_in_campaign_prints_runs_time_and_checks_and_runs_nothing(tmp_path):
    done = mqttbed("validate", "quickstart", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("quickstart (") and "quickstart.yaml): valid" in out
    assert "backend mosquitto: available here; delivers QoS 0, 1, 2 (the workload uses 0)" in out
    assert "planned runs: 9 (3 points x 3 repetitions, interleaved)" in out
    assert "point 2: workload.subscribers=50  [mosquitto, 6.5 s window per run]" in out
    # 9 windows of 500 messages at 100 Hz + 0.5 s lead + 1 s drain, a default overhead
    assert ("estimated time: about 2 min 23 s = 59 s measuring + 9 x 6.0 s per run (a "
            "default: the data dir has no done run of mosquitto") in out
    assert not (tmp_path / "data").exists()   # nothing ran, nothing was stored


def test_validate_a_search_bounds_its_probes(tmp_path):
    done = mqttbed("validate", "capacity-search", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # 250 .. 16000 doubling, then 20000: 8 brackets; ln 2 / ln 1.1 -> 3 bisections; 1 more
    assert "at most 12 (bracketing, bisection to 0.1, 1 confirmation(s); max_probes 24)" \
        in done.stdout
    assert "broker.cpu_limit: cgroups usable here" in done.stdout


def test_validate_names_the_bad_value_and_the_missing_campaign(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nbroker: {backend: mosquitto}\nworkload: {rate_hz: 0}\n")
    bad = mqttbed("validate", str(spec))
    assert bad.returncode != 0 and "workload.rate_hz: bad value 0" in bad.stderr, bad.stderr
    assert f"invalid campaign spec {spec}" in bad.stderr
    unknown = mqttbed("validate", "quickstrat")
    assert unknown.returncode != 0
    assert ("campaign spec 'quickstrat': no such file here, and no built-in campaign of that "
            "name; built-in: ") in unknown.stderr and "capacity-search" in unknown.stderr
    missing = mqttbed("validate", "specs/nope.yaml")
    assert "campaign spec file 'specs/nope.yaml' does not exist" in missing.stderr


def test_run_by_an_unknown_name_lists_the_built_in_ones(tmp_path):
    done = mqttbed("run", "capacity-serch", "--data-dir", str(tmp_path / "data"),
                   env={"COLUMNS": "400"})   # the console wraps at its width
    assert done.returncode == 2
    assert ("no built-in campaign of that name; built-in: broker-shapes, brokers, "
            "capacity-search") in done.stderr


@pytest.mark.integration  # Mosquitto under a CPU budget, agents: the campaign's first run
def test_run_capacity_search_by_name_starts_its_first_probe(tmp_path):
    """The issue's `mqttbed run capacity-search`: it starts by name, its first run gets
    to measure; then Ctrl-C stops it cleanly (the search in full is a system test)."""
    from sqlalchemy import create_engine, text

    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQTTBED_")}
    env |= {"MQTTBED_SPARK_WARM_UP": "0", "MQTTBED_TEST_TAG": str(tmp_path)}
    # to files, not pipes: the check for leftovers below is made the moment the CLI exits
    # (with pipes, waiting for their end also waits for any child holding them)
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err_file:
        # SIGINT as a terminal's foreground job has it: a suite started in the background
        # (CI's) inherits it ignored, and Python then takes no Ctrl-C (it hung 180 s so)
        proc = subprocess.Popen([CLI, "run", "capacity-search", "--data-dir", str(data_dir)],
                                stdout=out, stderr=err_file, text=True, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def run_states() -> list[tuple[str, str]]:
            if not (data_dir / "mqttbed.sqlite").exists():
                return []
            engine = create_engine(f"sqlite:///{data_dir / 'mqttbed.sqlite'}")
            try:
                with engine.connect() as db:
                    return [tuple(r) for r in db.execute(text(
                        "SELECT c.name, r.state FROM runs r JOIN campaigns c "
                        "ON c.id = r.campaign_id"))]
            except Exception:  # noqa: BLE001 - the schema is still being made
                return []
            finally:
                engine.dispose()

        wait_until(lambda: ("capacity-search", "running") in run_states(), 120,
                   "capacity-search's first probe to measure")
        proc.send_signal(signal.SIGINT)
        # 5 s here, loaded or not (the Spark JVM ended first: it outlived the CLI and held
        # its caller's pipes). A stuck stop fails with where each thread of the CLI was.
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            spy = Path(sys.executable).with_name("py-spy")
            dump = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)],
                                  capture_output=True, text=True, timeout=60)
            pytest.fail(f"Ctrl-C did not end mqttbed run within 180 s; its threads:\n"
                        f"{dump.stdout}{dump.stderr}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leftovers = processes_tagged(str(tmp_path))   # its Spark JVM included
    err = err_path.read_text()
    assert leftovers == set(), err[-2000:]
    assert proc.returncode == 130, err[-2000:]   # interrupted, not done: said, no traceback
    assert err.rstrip().endswith("mqttbed run: interrupted") and "Traceback" not in err, \
        err[-4000:]
    assert run_states()[0] == ("capacity-search", "interrupted"), err[-2000:]


# --- campaigns list, latest and latest~N: on two real campaigns -------------------------

@pytest.mark.integration
def test_campaigns_list_reads_the_local_data_dir_without_a_controller(campaigns, tmp_path):
    data = str(campaigns.data_dir)
    by_flag = mqttbed("campaigns", "list", "--data-dir", data)
    assert by_flag.returncode == 0, by_flag.stderr
    lines = by_flag.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "status", "created", "(UTC)", "runs"]
    assert lines[1].startswith(f"{campaigns.second}  results-second  done")
    assert lines[1].rstrip().endswith("1/1 done             latest")
    assert lines[2].startswith(f"{campaigns.first}  results-first   done")
    assert lines[2].rstrip().endswith("4/4 done             latest~1")
    # MQTTBED_DATA_DIR, no controller named: the same list
    by_env = mqttbed("campaigns", "list", env={"MQTTBED_DATA_DIR": data})
    assert by_env.stdout == by_flag.stdout
    # a controller named: its list, not the local one (here: it wants a token, or answers
    # nothing)
    remote = mqttbed("campaigns", "list", env={"MQTTBED_DATA_DIR": data,
                                               "MQTTBED_URL": "http://127.0.0.1:9"})
    assert remote.returncode != 0 and "a user token is needed" in remote.stderr
    remote = mqttbed("campaigns", "list", "--token", "mqb_x",
                     env={"MQTTBED_DATA_DIR": data})
    assert "http://127.0.0.1:8000" in remote.stderr   # MQTTBED_URL's default: not local
    nowhere = mqttbed("campaigns", "list", "--data-dir", str(tmp_path / "nope"))
    assert nowhere.returncode != 0
    assert f"no mqttbed data dir at {tmp_path / 'nope'}" in nowhere.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.integration
def test_report_and_compare_take_latest_and_latest_n(campaigns, tmp_path):
    data = str(campaigns.data_dir)
    out = tmp_path / "first.html"
    report = mqttbed("report", "latest~1", "--out", str(out), "--data-dir", data)
    assert report.returncode == 0, report.stderr
    assert campaigns.first in out.read_text() and "results-first" in out.read_text()

    compare = mqttbed("compare", "latest~1", "latest", "--data-dir", data,
                      env={"COLUMNS": "200"})
    assert compare.returncode == 0, compare.stderr
    assert f"{campaigns.first} vs {campaigns.second}" in compare.stdout

    too_far = mqttbed("report", "latest~2", "--data-dir", data)
    assert too_far.returncode != 0
    assert ("mqttbed report: campaign 'latest~2': " in too_far.stderr
            and "holds 2 campaigns (latest ... latest~1)" in too_far.stderr)
    unknown = mqttbed("compare", "latest", "c000000000000", "--data-dir", data)
    assert "mqttbed compare: no campaign 'c000000000000' in" in unknown.stderr


@pytest.mark.integration
def test_analyze_takes_latest_n(campaigns, capsys):
    """In this process, so that it takes the session's Spark rather than starting one."""
    from mqttbed.controller.cli import main

    assert main(["analyze", "latest~1", "--data-dir", str(campaigns.data_dir)]) == 0
    out = capsys.readouterr().out
    assert f"results-first ({campaigns.first})" in out
    assert f"campaigns/{campaigns.first}/stats.json" in out
