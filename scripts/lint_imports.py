"""Check the import contracts of pyproject.toml ([tool.importlinter]) on mqttbed's code.

The code folders are subpackages of ``mqttbed`` through setuptools' ``package-dir``
mapping, so the file tree is not the import tree that import-linter walks. This builds
that tree out of symbolic links under ``build/import-graph/mqttbed`` and runs the
contracts there: every import of every module is checked, function-level ones included.

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("core", "campaigns", "controller", "agents", "instruments", "brokers",
                "network", "analytics", "api")


def import_tree(where: Path) -> Path:
    """Build ``where/mqttbed`` (the namespace's own modules plus a link per code folder)."""
    package = where / "mqttbed"
    shutil.rmtree(where, ignore_errors=True)
    package.mkdir(parents=True)
    for module in (ROOT / "mqttbed").glob("*.py"):   # __init__ and the top-level modules
        shutil.copy(module, package / module.name)
    for folder in CODE_FOLDERS:
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return where


def check(tree: Path) -> int:
    """Run the contracts on the import tree at ``tree``; 0 if every one is kept."""
    sys.path.insert(0, str(tree))
    os.chdir(tree)  # import-linter puts the working directory first on the path
    from importlinter.cli import lint_imports

    return lint_imports(config_filename=str(ROOT / "pyproject.toml"))


if __name__ == "__main__":
    sys.exit(check(import_tree(ROOT / "build" / "import-graph")))
