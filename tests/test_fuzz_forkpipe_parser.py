"""The fork/pipe broker's client packet path under libFuzzer (coverage-guided, clang):
a bounded, seeded run with AddressSanitizer and UBSan finds no crash, no leak, no broken
invariant (brokers/forkpipe/fuzz/fuzz_packets.c says which), and every input that once
crashed it (fuzz/regressions/) still runs clean. ``make fuzz`` runs it for longer."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FORKPIPE = Path(__file__).resolve().parents[1] / "brokers" / "forkpipe"
RUNS = 150_000   # about 2 s here; coverage flattens out well before


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    if shutil.which("clang") is None:
        pytest.fail("clang not found: scripts/system-deps.sh installs it (make install)")
    build = tmp_path_factory.mktemp("fuzz-build")
    made = subprocess.run(["make", "-s", "-C", str(FORKPIPE), "fuzz-build", f"BUILD={build}"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr + made.stdout
    return build / "fuzz-packets"


def test_a_bounded_seeded_run_finds_nothing_and_reaches_every_packet_type(harness, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = subprocess.run([str(harness), f"-runs={RUNS}", "-seed=1", "-max_len=1024",
                          "-timeout=5", f"-dict={FORKPIPE / 'fuzz' / 'mqtt.dict'}",
                          f"-artifact_prefix={tmp_path}/", str(corpus),
                          str(FORKPIPE / "fuzz" / "seeds")],
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("leak-*"))
    done = re.search(r"DONE\s+cov: (\d+)", run.stderr)
    assert done and int(done[1]) >= 200, run.stderr[-1500:]  # the seeds lead past CONNECT


def test_every_input_that_ever_crashed_it_runs_clean(harness):
    inputs = sorted((FORKPIPE / "fuzz" / "regressions").glob("*"))
    inputs += sorted((FORKPIPE / "fuzz" / "seeds").glob("*"))
    run = subprocess.run([str(harness), *map(str, inputs)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"Executed {inputs[-1]}" in run.stderr
