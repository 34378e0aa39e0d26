"""The package layout: every code folder is a subpackage of ``mqttbed``, imported only so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("core", "campaigns", "controller", "agents", "instruments", "brokers",
                "network", "analytics", "api")
CHECKED = CODE_FOLDERS + ("tests", "bench", "mqttbed")


def _python_files() -> list[Path]:
    return sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py")
                  if ".venv" not in p.parts)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def bare_folder_imports(path: Path) -> list[str]:
    """Imports of a code folder by its bare name (``import controller``) in ``path``."""
    shown = path.relative_to(ROOT) if ROOT in path.parents else path
    return [f"{shown}:{line}: import {module}"
            for line, module in _imported_modules(path)
            if module.split(".")[0] in CODE_FOLDERS]


def test_no_code_imports_a_folder_by_its_bare_name():
    offenders = [hit for path in _python_files() for hit in bare_folder_imports(path)]
    assert offenders == [], "import through the mqttbed namespace instead:\n" + "\n".join(offenders)


def test_the_checker_catches_a_bare_import(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import controller.engine\nfrom core import events\nimport mqttbed.core\n")
    assert len(bare_folder_imports(bad)) == 2


@pytest.mark.parametrize("folder, forbidden", [
    ("agents", ("mqttbed.controller", "mqttbed.api", "mqttbed.analytics")),
    ("analytics", ("mqttbed.controller", "mqttbed.api", "mqttbed.agents", "mqttbed.brokers")),
    ("instruments", ("mqttbed.controller", "mqttbed.api", "mqttbed.agents", "mqttbed.brokers")),
    ("network", ("mqttbed.controller", "mqttbed.api", "mqttbed.agents", "mqttbed.brokers",
                 "mqttbed.analytics", "mqttbed.campaigns")),
    ("core", ("mqttbed.controller", "mqttbed.api", "mqttbed.agents", "mqttbed.brokers",
              "mqttbed.analytics", "mqttbed.campaigns", "mqttbed.instruments")),
])
def test_dependency_direction(folder, forbidden):
    offenders = [f"{p.relative_to(ROOT)}:{line}: {module}"
                 for p in (ROOT / folder).rglob("*.py")
                 for line, module in _imported_modules(p) if module.startswith(forbidden)]
    assert offenders == []


def test_each_folder_is_a_subpackage_of_mqttbed():
    import importlib

    for folder in CODE_FOLDERS:
        module = importlib.import_module(f"mqttbed.{folder}")
        assert Path(module.__file__).parent == ROOT / folder
