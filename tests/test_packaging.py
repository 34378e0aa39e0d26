"""What a regular (non-editable) install of mqttbed contains: code plus its data files.

The dev install is editable, which reads templates and sources straight from the tree and
so would hide a data file left out of the package. This builds the packages as
``pip install .`` (or the Docker image) would, from a copy of the tracked files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_built_package_carries_templates_campaigns_migrations_and_the_c_and_p4_sources(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    tree = tmp_path / "tree"
    for name in tracked:
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    built = tmp_path / "lib"
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                    "build_py", "--build-lib", str(built)], cwd=tree, check=True,
                   capture_output=True)
    package = built / "mqttbed"
    templates = {p.name for p in (package / "api" / "templates").glob("*.html")}
    assert {"base.html", "index.html", "login.html", "report.html"} <= templates
    assert (package / "campaigns" / "quickstart.yaml").is_file()
    assert (package / "controller" / "migrations" / "script.py.mako").is_file()
    assert list((package / "controller" / "migrations" / "versions").glob("0001_*.py"))
    assert (package / "brokers" / "forkpipe" / "Makefile").is_file()
    assert list((package / "brokers" / "forkpipe" / "src").glob("*.c"))
    p4 = package / "brokers" / "p4"
    assert {"pams.p4", "pams.p4info.txtpb"} <= {p.name for p in p4.iterdir()}
    assert (p4 / "ebpf" / "pams.bpf.c").is_file()
    assert (package / "network" / "topology.py").is_file()


def test_every_tracked_package_folder_is_listed_in_setuptools_packages():
    """A folder with an ``__init__.py`` that ``packages`` leaves out is missing from
    ``pip install .`` and the images, while the editable dev install still finds it."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_of_folder = {folder: package for package, folder in setuptools["package-dir"].items()}
    tracked = subprocess.run(["git", "ls-files", "*__init__.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    in_tree = set()
    for name in tracked:
        top, *rest = Path(name).parent.parts or ("",)
        if top in package_of_folder:
            in_tree.add(".".join([package_of_folder[top], *rest]))
    assert in_tree - set(setuptools["packages"]) == set()
