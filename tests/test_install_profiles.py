"""What each command installs: scripts/system-deps.sh's profiles, the Makefile's targets,
the docs' tables, and the errors that name the one command installing a missing program.

Nothing here installs anything: the script is read with --list and --missing, made to
believe it is not root, or run by `make -n`.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mqttbed.brokers.command import named
from mqttbed.brokers.forkpipe import build as forkpipe_build
from mqttbed.brokers.fpga.rtl import build as rtl_build
from mqttbed.brokers.mosquitto import backend as mosquitto
from mqttbed.brokers.p4 import backend as p4_backend
from mqttbed.brokers.p4 import build as p4_build
from mqttbed.core.backends import unavailable_reason
from mqttbed.core.errors import MissingSystemDependency

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
# The extras make install puts into the venv (the Makefile's EXTRAS).
EVERY_EXTRA = {"agent", "controller", "analytics", "p4", "brokers", "dev"}
SCRIPT = ROOT / "scripts" / "system-deps.sh"
# The hint of core.errors.system_deps_hint, read back: the packages and the profile it names.
HINT = re.compile(r"apt-get install (?P<packages>[\w.:+ -]+?) \(as root; in the mqttbed "
                  r"checkout `scripts/system-deps\.sh (?P<profile>[\w-]+)` does it\)")


def profile_packages(*profiles: str) -> list[str]:
    """The packages of ``profiles`` as the script lists them (installed or not)."""
    done = subprocess.run(["/bin/bash", str(SCRIPT), "--list", *profiles], capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout.split()


def makefile_profiles() -> list[str]:
    """The profiles the Makefile has a system-deps-PROFILE target for."""
    match = re.search(r"^SYSTEM_PROFILES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile has no SYSTEM_PROFILES line"
    return match[1].split()


def dry_run(target: str, venv: Path) -> str:
    """What ``make TARGET`` would run with a venv that does not exist yet (-n runs nothing)."""
    return subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=30, check=True).stdout


def installs(plan: str) -> tuple[list[str], set[str]]:
    """The system-deps.sh profiles and the pip extras a dry run installs."""
    profiles = [word for line in plan.splitlines()
                if (m := re.match(r"^scripts/system-deps\.sh( .*)?$", line))
                for word in (m[1] or " all").split()]
    extras = {extra for found in re.findall(r"pip install [^\n]*-e '\.\[([\w,]+)\]'", plan)
              for extra in found.split(",")}
    return profiles, extras


def assert_hint(message: str, *packages: str) -> None:
    """``message`` names the apt-get packages and the profile whose list holds them."""
    hint = HINT.search(message)
    assert hint, f"no install command in {message!r}"
    named_packages = hint["packages"].split()
    assert set(packages) <= set(named_packages), message
    assert set(named_packages) <= set(profile_packages(hint["profile"])), (
        f"`scripts/system-deps.sh {hint['profile']}` does not install all of "
        f"{named_packages}: {message!r}")


# -- the script's profiles --------------------------------------------------------------

def test_the_demo_profile_is_mosquitto_a_jre_and_the_engines_c_build_only():
    assert sorted(profile_packages("demo")) == sorted(
        ["mosquitto", "default-jre-headless", "gcc", "libc6-dev", "make", "libssl-dev"])


# Profiles only their own targets install, never `make install` or CI: the lab VM's
# image and QEMU (its test is opt-in: `make test-vm`).
ON_DEMAND = {"vm"}


def test_every_makefile_profile_exists_and_all_is_their_union():
    every = set(profile_packages("all"))
    in_all = [p for p in makefile_profiles() if p not in ON_DEMAND]
    for profile in makefile_profiles():
        packages = profile_packages(profile)
        assert packages, f"profile {profile} installs nothing"
        assert len(packages) == len(set(packages)), f"{profile} lists a package twice"
        if profile in ON_DEMAND:
            assert not set(packages) <= every, f"`all` holds the on-demand {profile}"
        else:
            assert set(packages) <= every, f"`all` lacks some of {profile}'s {packages}"
    assert set(makefile_profiles()) >= ON_DEMAND
    assert every == set(profile_packages(*in_all))
    # what the RTL, the browser, the third-party brokers and the Pis' cross build need is
    # in `all` (make install, CI) but not in the demo's
    heavy = {"verilator", "yosys", "chromium", "rabbitmq-server", "ejabberd", "postgresql",
             "qemu-user", "gcc-aarch64-linux-gnu", "clang", "valgrind"}
    assert heavy <= every and not heavy & set(profile_packages("demo"))


def test_an_unknown_profile_is_refused_naming_every_profile():
    done = subprocess.run(["/bin/bash", str(SCRIPT), "rtl", "browsers"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    assert "no profile 'browsers'" in done.stderr
    for profile in makefile_profiles():
        assert f" {profile}" in done.stderr


def test_a_missing_package_off_root_is_named_with_the_command_to_run(tmp_path):
    # A PATH with neither a compiler nor make, and an `id` that says uid 1000: the script
    # must print what to run as root and stop (no apt-get is reachable on this PATH either).
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")
    (tmp_path / "id").chmod(0o755)
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run(["/bin/bash", str(SCRIPT), "build"], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    missing = re.search(r"needs these system packages: (.+)", done.stderr)
    assert missing and {"gcc", "make"} <= set(missing[1].split()), done.stderr
    assert re.search(r"sudo sh -c 'apt-get update && apt-get install -y "
                     r"--no-install-recommends [^']*\bgcc\b", done.stderr), done.stderr
    assert "sudo scripts/system-deps.sh build" in done.stderr
    listed = subprocess.run(["/bin/bash", str(SCRIPT), "--missing", "build"],
                            capture_output=True, text=True, timeout=30, env=env)
    assert {"gcc", "make"} <= set(listed.stdout.split())


# -- the Makefile's targets -------------------------------------------------------------

def test_make_demo_installs_the_demo_profile_and_the_demo_extras_only(tmp_path):
    plan = dry_run("demo", tmp_path / "fresh-venv")
    profiles, extras = installs(plan)
    assert profiles == ["demo"]
    # spark (part of analytics) first, so that Spark's class archive is made while pip
    # installs the rest
    assert extras == {"spark", "controller", "analytics"}
    assert plan.index("-e '.[spark]'") < plan.index("class_archive --from-list") \
        < plan.index("mqttbed run quickstart")


def test_make_install_still_installs_every_profile_and_every_extra(tmp_path):
    # CI (.ci/run) runs make install, then make test, the RTL's targets and make test-system
    profiles, extras = installs(dry_run("install", tmp_path / "fresh-venv"))
    assert profiles == ["all"]
    assert extras == EVERY_EXTRA


@pytest.mark.parametrize(("target", "expected"), [
    ("rtl-build", ["rtl"]), ("rtl-test", ["rtl"]), ("fuzz", ["fuzz"]), ("bench", ["bench"]),
    ("lab-up", ["lab"]), ("postgres-up", ["postgres"]),
    ("test-postgres", ["demo", "postgres"]), ("docs", []), ("lint", [])])
def test_each_target_installs_the_profiles_it_uses(target, expected, tmp_path):
    profiles, _extras = installs(dry_run(target, tmp_path / "fresh-venv"))
    assert profiles == expected


# -- the docs' tables -------------------------------------------------------------------

def table_rows(page: Path, first_header: str) -> list[list[str]]:
    """The rows of the Markdown table of ``page`` whose first header is ``first_header``,
    as cells with their backticks removed."""
    lines = page.read_text().splitlines()
    start = next(n for n, line in enumerate(lines)
                 if re.match(rf"^\|\s*{re.escape(first_header)}\s*\|", line))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("`", "") for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/tutorials/first-campaign.md"])
def test_the_docs_install_table_says_what_each_make_command_installs(page, tmp_path):
    rows = table_rows(ROOT / page, "command")
    assert rows, f"{page} has no install table"
    for command, profiles_cell, extras_cell in (row[:3] for row in rows):
        profiles_named = re.findall(r"[\w-]+", profiles_cell.split(":")[0])
        profiles_named = [] if profiles_named == ["none"] else profiles_named
        # "every extra" alone, or the extras by name
        words = set(re.findall(r"[\w-]+", extras_cell))
        extras_named = words & (EVERY_EXTRA | {"spark"}) or (
            EVERY_EXTRA if "every" in words else set())
        for target in re.findall(r"make ([\w-]+)", command):
            profiles, extras = installs(dry_run(target, tmp_path / "fresh-venv"))
            where = f"{page}, `make {target}`"
            assert profiles == profiles_named, f"{where}: the Makefile installs {profiles}"
            assert extras_named == extras, (
                f"{where}: the Makefile installs the extras {sorted(extras)}")


def test_the_first_tutorials_profile_table_lists_each_profiles_packages_exactly():
    rows = table_rows(ROOT / "docs" / "tutorials" / "first-campaign.md", "profile")
    assert {row[0] for row in rows} == {*makefile_profiles(), "all"}
    for profile, _used_by, includes, packages in (row[:4] for row in rows):
        own = set(re.findall(r"[\w.:+-]+", packages)) - {"none"}
        included = set(profile_packages(*re.findall(r"[\w-]+", includes))) if (
            includes != "none") else set()
        assert own | included == set(profile_packages(profile)), (
            f"profile {profile}: the table says {sorted(own)} + {includes}")


# -- errors that name the command -------------------------------------------------------

def test_a_missing_mosquitto_names_the_demo_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without /usr/sbin
    monkeypatch.setattr(mosquitto, "FALLBACK_BINARIES", (str(tmp_path / "mosquitto"),))
    with pytest.raises(MissingSystemDependency) as err:
        mosquitto.find_binary(None)
    assert_hint(str(err.value), "mosquitto")
    assert_hint(unavailable_reason("mosquitto") or "", "mosquitto")
    assert_hint(unavailable_reason("mqtt-st") or "", "mosquitto")


def test_a_missing_compiler_for_the_fork_pipe_broker_names_the_build_profile(monkeypatch,
                                                                             tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(forkpipe_build, "build_dir", lambda: tmp_path)  # nothing built
    with pytest.raises(MissingSystemDependency) as err:
        forkpipe_build.ensure_built()
    assert_hint(str(err.value), "make")


def test_a_missing_verilator_names_the_rtl_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(rtl_build, "build_root", lambda: tmp_path)  # nothing built
    with pytest.raises(MissingSystemDependency) as err:
        rtl_build.ensure_sim()
    assert_hint(str(err.value), "verilator", "make")


def test_missing_ebpf_tools_name_the_network_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(p4_backend.os, "geteuid", lambda: 0)  # past the root check
    assert_hint(unavailable_reason("p4") or "", "clang", "bpftool")
    monkeypatch.setattr(p4_build, "build_dir", lambda: tmp_path)  # nothing built
    with pytest.raises(MissingSystemDependency) as err:
        p4_build.ensure_built()
    assert_hint(str(err.value), "clang", "libbpf-dev")


@pytest.mark.parametrize(("preset", "package"), [
    ("rabbitmq", "rabbitmq-server"), ("nats", "nats-server"),
    ("activemq", "activemq"), ("ejabberd", "ejabberd")])
def test_a_missing_third_party_broker_names_the_brokers_profile(preset, package, monkeypatch):
    monkeypatch.setattr(named.shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setattr(named.glob, "glob", lambda _pattern: [])
    assert_hint(unavailable_reason(preset) or "", package)
