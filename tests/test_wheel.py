"""The package as a user gets it: an sdist and a wheel that ``python -m build`` makes and
``twine check`` passes, installed into fresh venvs away from this checkout.

One build per module, from a copy of the tree's source files (tracked, and new ones not
ignored) so that nothing is written into the checkout; ``python -m build`` makes the sdist
and then the wheel from the unpacked sdist, so a file the sdist leaves out fails the wheel
too. Every file of a package folder must be in the wheel or in :data:`NOT_IN_WHEEL` with its
reason, and every source file in the sdist or in :data:`NOT_IN_SDIST`: a file added later
cannot be forgotten by package-data or MANIFEST.in without this failing.

The installs use uv (the dev extra), as tests/test_extras_install.py does, with its cache.
pyspark is published as an sdist only (~450 MB, built on install): the analytics install
takes the wheel pip built of the very version in this venv from pip's cache (``make
install`` left it there) through ``--find-links``, pinned to that version, so it is neither
downloaded nor built again; without one, uv fetches and builds it once into its cache.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml

# (parallel: it builds from a copy of the tree into venvs of its own and asserts contents,
# states and counts; one worker builds the module's wheel)
pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.timeout(900),
              pytest.mark.parallel, pytest.mark.xdist_group("wheel")]

REPO = Path(__file__).resolve().parents[1]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
# top-level folder -> its place in the wheel ("core" -> "mqttbed/core")
PACKAGE_FOLDERS = {folder: package.replace(".", "/") for package, folder
                   in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}

# Files of the package folders the installed package never reads, and why. The sdist has
# them; each pattern must still match a file, and no file it matches may be in the wheel.
NOT_IN_WHEEL = {
    "agents/native/fuzz/*": "the engine's libFuzzer harness and seeds (`make fuzz`)",
    "agents/native/tests/*": "the engine's selftest program (`make selftest`, cross checks)",
    "brokers/forkpipe/fuzz/*": "the fork/pipe broker's libFuzzer harness and seeds",
    "brokers/*/README.md": "a backend's notes for its developers",
    "brokers/thirdparty-notes.md": "measurements behind the command presets, for developers",
}
# Source files the sdist leaves out, and why.
NOT_IN_SDIST = {
    ".ci/*": "this repository's CI script",
    ".gitignore": "git's",
    ".dockerignore": "docker build's",
    "docker/secrets/*": "a folder for agent tokens, never shipped",
}


def source_files() -> list[str]:
    """The tree's source files: tracked, and new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted(name for name in listed if name and (REPO / name).is_file())


def matches(name: str, patterns: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def in_wheel_as(name: str) -> str | None:
    """Where source file ``name`` goes in the wheel (None: not under a package folder)."""
    top, _, rest = name.partition("/")
    return f"{PACKAGE_FOLDERS[top]}/{rest}" if top in PACKAGE_FOLDERS and rest else None


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    sources: list[str]  # what the tree held when the packages were built

    def wheel_names(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as archive:
            return set(archive.namelist())

    def sdist_names(self) -> set[str]:
        prefix = f"mqttbed-{VERSION}/"
        with tarfile.open(self.sdist) as archive:
            return {member.name.removeprefix(prefix) for member in archive.getmembers()
                    if member.isfile()}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Dist:
    root = tmp_path_factory.mktemp("wheel")
    tree, out = root / "tree", root / "dist"
    sources = source_files()
    for name in sources:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    # --no-isolation: setuptools and wheel come from this venv, no index is asked
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(out), str(tree)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return Dist(sdist=sdist, wheel=wheel, sources=sources)


def test_twine_checks_the_sdist_and_the_wheel_as_pypi_would(dist):
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                              str(dist.sdist), str(dist.wheel)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_the_packages_carry_the_one_version_of_pyproject(dist):
    assert dist.wheel.name == f"mqttbed-{VERSION}-py3-none-any.whl"
    assert dist.sdist.name == f"mqttbed-{VERSION}.tar.gz"
    with zipfile.ZipFile(dist.wheel) as archive:
        metadata = archive.read(f"mqttbed-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    # the extras a Pi and a controller install by name
    for extra in ("agent", "controller", "analytics"):
        assert f"Provides-Extra: {extra}\n" in metadata


def test_the_wheel_holds_every_file_the_package_reads_and_nothing_else(dist):
    names = dist.wheel_names()
    expected = {in_wheel_as(name): name for name in dist.sources
                if in_wheel_as(name) and not matches(name, NOT_IN_WHEEL)}
    missing = sorted(source for target, source in expected.items() if target not in names)
    assert not missing, ("files of the package folders that the wheel lacks: add them to "
                         "[tool.setuptools.package-data] in pyproject.toml (or a package to "
                         "`packages`), or to NOT_IN_WHEEL here with the reason: "
                         + ", ".join(missing))
    for pattern in NOT_IN_WHEEL:
        matched = [name for name in dist.sources if fnmatch.fnmatchcase(name, pattern)]
        assert matched, f"NOT_IN_WHEEL pattern {pattern!r} matches no file any more: remove it"
        assert not [name for name in matched if in_wheel_as(name) in names], pattern
    # no build product, cache or stray file: only the sources and the metadata
    extra = sorted(name for name in names - set(expected)
                   if not name.startswith(f"mqttbed-{VERSION}.dist-info/"))
    assert not extra, f"files in the wheel that are no package source: {extra}"


def test_the_sdist_holds_every_source_file_to_build_test_and_document_it(dist):
    names = dist.sdist_names()
    missing = sorted(name for name in dist.sources
                     if name not in names and not matches(name, NOT_IN_SDIST))
    assert not missing, ("source files the sdist lacks: add them to MANIFEST.in, or to "
                         "NOT_IN_SDIST here with the reason: " + ", ".join(missing))
    for pattern in NOT_IN_SDIST:
        assert not [name for name in names if fnmatch.fnmatchcase(name, pattern)], pattern
    built = sorted(name for name in names if "__pycache__" in name or name.endswith(".so")
                   or "/build/" in f"/{name}")
    assert not built, f"build products in the sdist: {built}"


# -- installed ---------------------------------------------------------------------------


def fresh_venv(root: Path, name: str) -> Path:
    if UV is None:
        pytest.fail("uv not found: it comes with the dev extra (make install)")
    venv = root / name
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   timeout=120)
    return venv


def uv_install(venv: Path, requirement: str, *extra: str) -> None:
    done = subprocess.run([UV, "pip", "install", "-q", "--python", str(venv / "bin/python"),
                           *extra, requirement], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: this PATH, none of the test run's Python, mqttbed or Spark settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME")
           and not k.startswith(("MQTTBED_", "PYSPARK_"))}
    env["HOME"] = str(home)
    return env


def run_in(venv: Path, cwd: Path, *argv: str, timeout: float = 120,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a program of ``venv`` in ``cwd``, a folder outside the checkout."""
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env or user_env(cwd))


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def pyspark_links(root: Path) -> list[str]:
    """uv options that install this venv's pyspark from the wheel pip built of it, if pip's
    cache has it (module docstring), else nothing."""
    pinned = installed_version("pyspark")
    listed = subprocess.run([sys.executable, "-m", "pip", "cache", "list", "pyspark",
                             "--format=abspath"], capture_output=True, text=True, timeout=60)
    wheels = [Path(line) for line in listed.stdout.splitlines()
              if Path(line).name.startswith(f"pyspark-{pinned}-")]
    if not wheels:
        return []
    links = root / "links"
    links.mkdir(exist_ok=True)
    (links / wheels[0].name).symlink_to(wheels[0])
    constraints = root / "constraints.txt"
    constraints.write_text(f"pyspark=={pinned}\n")
    return ["--find-links", str(links), "--constraint", str(constraints)]


@pytest.fixture(scope="module")
def agent_venv(dist, tmp_path_factory) -> Path:
    """A venv with the wheel and its agent extra, as on a Pi (the tests only read it)."""
    venv = fresh_venv(tmp_path_factory.mktemp("agent"), "venv")
    uv_install(venv, f"{dist.wheel}[agent]")
    return venv


def test_the_agent_extra_gives_an_agent_that_builds_its_native_engine(agent_venv, tmp_path):
    venv, home = agent_venv, tmp_path
    shown = run_in(venv, home, "mqttbed", "--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"mqttbed {VERSION}", shown
    helped = run_in(venv, home, "mqttbed", "agent", "--help")
    assert helped.returncode == 0 and "--controller" in helped.stdout, helped.stderr
    assert run_in(venv, home, "python", "-c", "import fastapi").returncode != 0
    # What `mqttbed lab provision` runs on a Pi after installing: the engine compiled from
    # the C the wheel installed, by this machine's compiler, into the package's own folder
    # (a venv is writable; a read-only install builds under ~/.cache/mqttbed instead).
    built = run_in(venv, home, "python", "-m", "mqttbed.agents.native", timeout=300)
    assert built.returncode == 0, built.stderr
    report = json.loads(built.stdout)
    assert report["state"] == "built", report
    engine_dir = site_packages(venv) / "mqttbed" / "agents" / "native"
    assert Path(report["library"]) == engine_dir / "build" / "libmqttbed-engine.so"
    # ... and it loads and runs: an engine made and closed through its C API
    made = run_in(venv, home, "python", "-c",
                  "from mqttbed.agents.native import engine\n"
                  "e = engine.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=16)\n"
                  "e.close(); print(engine.__file__)")
    assert made.returncode == 0, made.stderr
    assert Path(made.stdout.strip()) == engine_dir / "engine.py"


def test_a_read_only_install_builds_its_engine_in_the_user_cache(agent_venv, tmp_path):
    """Root may write anywhere, so the package folder is made read-only as a system-wide
    install is: bind-mounted read-only in a mount namespace of this command alone."""
    package = site_packages(agent_venv) / "mqttbed"
    cache = tmp_path / "cache"
    script = (f"mount --bind {package} {package} && mount -o remount,bind,ro {package} && "
              f"exec {agent_venv}/bin/python -m mqttbed.agents.native")
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare --mount) to make the package read-only")
    built = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path,
                           env=user_env(tmp_path) | {"XDG_CACHE_HOME": str(cache)})
    assert built.returncode == 0, built.stderr
    report = json.loads(built.stdout)
    assert report["state"] == "built", report
    assert report["library"] == str(cache / "mqttbed" / "native-engine" /
                                    "libmqttbed-engine.so")


# The quickstart's own spec, read from the installed package, cut to one run (its first
# point, one repetition): the same broker, workload, engine, analysis and report in a ninth
# of its runs. A loaded CI machine gets more room to start and answer than the defaults
# give (the engine is compiled by the first run's agents, as after any install).
ONE_RUN = {"sweep": {"workload.subscribers": [2]}, "repetitions": 1,
           "timing": {"setup_timeout_s": 120.0, "heartbeat_timeout_s": 10.0}}

# Runs the console script's function in this process, then lists where every module it
# loaded came from.
RUN_AND_LIST_MODULES = """
import json, sys
from mqttbed.controller.cli import main
try:
    code = main(sys.argv[1:])
finally:
    files = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()}
    with open("modules.json", "w") as out:
        json.dump({name: path for name, path in files.items() if path}, out)
sys.exit(code)
"""


def test_controller_and_analytics_run_the_quickstart_from_the_installed_package(dist, tmp_path):
    venv = fresh_venv(tmp_path, "controller")
    uv_install(venv, f"{dist.wheel}[controller,analytics]", *pyspark_links(tmp_path))
    installed = site_packages(venv) / "mqttbed"
    user = tmp_path / "user"
    user.mkdir()
    env = user_env(user) | {
        # the analysis at the end only: no JVM started beside the run's measurement on a
        # loaded machine (each is tested by itself: tests/test_analysis_warm_up.py,
        # tests/test_lifecycle.py)
        "MQTTBED_SPARK_WARM_UP": "0", "MQTTBED_ANALYSIS_PER_RUN": "0"}

    validated = run_in(venv, user, "mqttbed", "validate", "quickstart", env=env)
    assert validated.returncode == 0, validated.stderr
    assert f"quickstart ({installed / 'campaigns' / 'quickstart.yaml'}): valid" in \
        validated.stdout

    spec = yaml.safe_load((installed / "campaigns" / "quickstart.yaml").read_text())
    (user / "one-run.yaml").write_text(yaml.safe_dump(spec | ONE_RUN))
    ran = run_in(venv, user, "python", "-c", RUN_AND_LIST_MODULES, "run", "one-run.yaml",
                 "--data-dir", "data", timeout=600, env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]

    modules = json.loads((user / "modules.json").read_text())
    assert modules["mqttbed"] == str(installed / "__init__.py")
    assert {"mqttbed.controller.engine", "mqttbed.analytics.stats", "pyspark"} <= set(modules)
    from_checkout = sorted(name for name, path in modules.items()
                           if Path(path).resolve().is_relative_to(REPO))
    assert not from_checkout, f"modules loaded from the checkout: {from_checkout}"

    (campaign,) = (user / "data" / "campaigns").iterdir()
    stats = json.loads((campaign / "stats.json").read_text())
    (run,) = stats["runs"]
    assert run["state"] == "done", run.get("reason")
    (point,) = stats["points"]
    assert point["messages_sent"] > 0 and point["latency_us"]["count"] > 0, point
    assert (campaign / "stats.parquet").is_file()

    report = run_in(venv, user, "mqttbed", "report", "latest", "--data-dir", "data",
                    "--out", "report.html", timeout=300, env=env)
    assert report.returncode == 0, report.stderr
    page = (user / "report.html").read_text()
    # the installed templates, with the installed plotly's own bundle inlined (no CDN)
    bundle = site_packages(venv) / "plotly" / "package_data" / "plotly.min.js"
    banner = bundle.read_text()[:200].split("\n")[1]  # "* plotly.js vX.Y.Z"
    assert banner.startswith("* plotly.js v") and banner in page
    assert "quickstart" in page and "Plotly.newPlot(" in page
