"""make test deals its tests to pytest-xdist's workers by group: a module's tests stay on
one worker, so its module fixtures are made once, and a named ``xdist_group`` spans the
modules that share a per-process fixture (tests/conftest.py, ``--dist loadgroup``).

pytest 9.2 broke the grouping without a word (pytest-xdist issue 1386: xdist renames a
test into its group by a field pytest 9.2 no longer reads), so every test was dealt alone
and each worker made every module fixture again. pyproject.toml pins pytest below 9.2;
this test runs the grouping for real, in a pytest of its own with this suite's hooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULE = """\
import os

import pytest

{mark}


def record(request):
    with open(os.environ["GROUPS_LOG"], "a") as log:
        log.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{request.node.path.name}}\\n")


@pytest.mark.parametrize("i", range(4))
def test_it(request, i):
    record(request)
"""


def test_a_modules_tests_share_a_worker_and_a_named_group_spans_modules(tmp_path):
    marks = {"alone_a": "", "alone_b": "", "alone_c": "",
             "shared_a": 'pytestmark = pytest.mark.xdist_group("shared")',
             "shared_b": 'pytestmark = pytest.mark.xdist_group("shared")'}
    for name, mark in marks.items():
        (tmp_path / f"test_{name}.py").write_text(MODULE.format(mark=mark))
    log = tmp_path / "groups.log"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-n", "2", "--dist", "loadgroup", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "GROUPS_LOG": str(log),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 4 * len(marks)
    workers: dict[str, set[str]] = {}
    for worker, module in ran:
        workers.setdefault(module, set()).add(worker)
    assert all(len(found) == 1 for found in workers.values()), workers
    assert workers["test_shared_a.py"] == workers["test_shared_b.py"]
    # and the work was dealt: not all on one worker by accident
    assert len(set().union(*workers.values())) == 2, workers
