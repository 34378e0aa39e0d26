"""The package layout: every code folder is a subpackage of ``mqttbed``, imported only so."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

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


def _run_contracts(tree: Path) -> subprocess.CompletedProcess[str]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import lint_imports as li; "
            "from pathlib import Path; sys.exit(li.check(Path(sys.argv[2])))")
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts"), str(tree)],
                          capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold(tmp_path):
    """The dependency direction (pyproject.toml [tool.importlinter]) over every import."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lint_imports import import_tree
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    result = _run_contracts(import_tree(tmp_path / "graph"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_catch_core_importing_the_controller(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lint_imports import import_tree
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    tree = import_tree(tmp_path / "graph")
    core = tree / "mqttbed" / "core"
    core.unlink()
    shutil.copytree(ROOT / "core", core, ignore=shutil.ignore_patterns("__pycache__"))
    (core / "probe.py").write_text("def late():\n    from mqttbed.controller import engine\n"
                                   "    return engine\n")
    result = _run_contracts(tree)
    assert result.returncode != 0
    assert "mqttbed.core.probe -> mqttbed.controller.engine" in result.stdout


def private_imports_across_packages(path: Path, folder: str) -> list[str]:
    """``from mqttbed.<other>... import _name`` in ``path``, which lives in ``folder``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = path.relative_to(ROOT) if ROOT in path.parents else path
    return [f"{shown}:{node.lineno}: {node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            and node.module.startswith("mqttbed.") and node.module.split(".")[1] != folder
            for alias in node.names if alias.name.startswith("_")]


def test_no_private_name_is_imported_across_packages():
    offenders = [hit for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*.py")
                 for hit in private_imports_across_packages(p, folder)]
    assert offenders == [], "give the helper a public home:\n" + "\n".join(offenders)


def test_the_private_name_check_sees_one_and_only_across_packages(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from mqttbed.controller.engine import _hidden\n"
                     "from mqttbed.api.deps import _own\nfrom mqttbed.core.events import public\n")
    assert private_imports_across_packages(probe, "api") == [
        f"{probe}:1: mqttbed.controller.engine._hidden"]


def test_each_folder_is_a_subpackage_of_mqttbed():
    import importlib

    for folder in CODE_FOLDERS:
        module = importlib.import_module(f"mqttbed.{folder}")
        assert Path(module.__file__).parent == ROOT / folder
