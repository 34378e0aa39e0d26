"""The types: mypy ([tool.mypy] of pyproject.toml) finds no error in mqttbed's code."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    from lint_imports import import_tree
    from typecheck import check
finally:
    sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.timeout(600)  # a cold mypy cache checks every module: a minute or two here
def test_the_code_has_no_type_error(tmp_path):
    status, report = check(import_tree(tmp_path / "graph"))
    assert status == 0, report
    assert "Success: no issues found" in report


def test_the_type_check_catches_a_wrong_return_type(tmp_path):
    tree = import_tree(tmp_path / "graph")
    core = tree / "mqttbed" / "core"
    core.unlink()
    shutil.copytree(ROOT / "core", core, ignore=shutil.ignore_patterns("__pycache__"))
    (core / "probe.py").write_text("def port() -> int:\n    return '1883'\n")
    status, report = check(tree, "mqttbed.core", cache=tmp_path / "cache")
    assert status != 0
    assert 'core/probe.py:2: error: Incompatible return value type (got "str", expected "int")' \
        in report
