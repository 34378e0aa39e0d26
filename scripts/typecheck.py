"""Check the types of mqttbed's code with mypy ([tool.mypy] of pyproject.toml).

mypy walks files as Python imports them, and the code folders are subpackages of
``mqttbed`` only through setuptools' ``package-dir`` mapping; so mypy runs on the same
import tree of symbolic links that ``lint_imports.py`` builds for the import contracts.
Reported paths are those of the source folders (``api/report.py``), not of the tree.
Exits non-zero on any error.

    .venv/bin/python scripts/typecheck.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from lint_imports import CODE_FOLDERS, ROOT, import_tree

# mypy's incremental cache: outside the tree, which import_tree builds anew each time.
CACHE = ROOT / "build" / "mypy-cache"
_TREE_PATH = re.compile(rf"^mqttbed/(?=(?:{'|'.join(CODE_FOLDERS)})/)", re.MULTILINE)


def check(tree: Path, package: str = "mqttbed", cache: Path = CACHE) -> tuple[int, str]:
    """Run mypy on ``package`` in the import tree at ``tree``: its exit status and report."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(cache), "-p", package],
        cwd=tree, capture_output=True, text=True, check=False)
    return result.returncode, _TREE_PATH.sub("", result.stdout + result.stderr)


if __name__ == "__main__":
    status, report = check(import_tree(ROOT / "build" / "type-graph"))
    print(report, end="")
    sys.exit(status)
