"""Lab machines (Raspberry Pis): provisioned over SSH, kept in the controller's database.

``mqttbed lab provision`` builds mqttbed's wheel here, copies it to each host with the
wheels of what the agent extra needs (a wheelhouse), creates a venv there, installs into
it without an index, checks ``mqttbed agent --version`` and records the host's facts
(:mod:`mqttbed.agents.facts`). The wheelhouse is built once per machine type and Python
here and cached in the data dir, so the next host (or the next provision) installs
offline. A host whose machine or Python differs from this one's (an ARM Pi provisioned
from an x86 laptop) gets only the mqttbed wheel and installs the rest from its own index
(PyPI, or piwheels on Raspberry Pi OS): binary wheels built here would not run there.

Specs name provisioned hosts (``agents.hosts: [{name: pi-07}]``);
:func:`resolve_named_hosts` fills in how to reach them when a campaign is created.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker

from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.controller.db import LabHostRow, utcnow
from mqttbed.core.backends import RunsOnLabHost, backend_names, declaration
from mqttbed.core.errors import MqttbedError, SpecError
from mqttbed.core.ssh import SshError, SshHost, SshTarget

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
EXTRAS = ("agent", "pi", "pi5")
REMOTE_DIR_NAME = ".mqttbed"
PIP_TIMEOUT_S = 600
PARALLEL_HOSTS = 4


def lab_host_backends() -> list[str]:
    """Backends whose broker can be deployed to a lab host over SSH (``broker.host``)."""
    return [name for name in backend_names() if declaration(name).supports(RunsOnLabHost)]


def check_lab_host_backend(backend: str) -> None:
    """Raise SpecError unless ``backend`` can run its broker on a lab host."""
    if not declaration(backend).supports(RunsOnLabHost):
        raise SpecError(f"broker.host: backend {backend!r} runs on the controller's machine "
                        f"only; on a lab host: {', '.join(lab_host_backends())}")


class LabError(MqttbedError):
    """Provisioning or managing a lab host failed; the message names the host and step."""


@dataclass(frozen=True)
class HostArg:
    """One ``HOST`` argument of ``mqttbed lab provision``: ``[name=]user@address[:port]``."""

    name: str
    destination: str
    ssh_port: int | None

    @classmethod
    def parse(cls, text: str) -> HostArg:
        name, sep, destination = text.partition("=")
        if not sep:
            name, destination = "", text
        address_port = destination.rpartition("@")[2]
        address, _, port_text = address_port.partition(":")
        if not address or "@" not in destination or not destination.partition("@")[0]:
            raise LabError(f"host {text!r}: expected [name=]user@address[:port], e.g. "
                           "pi-07=pi@192.168.1.57")
        port = None
        if port_text:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise LabError(f"host {text!r}: port {port_text!r} is not 1-65535")
            port = int(port_text)
        name = name or address
        if not HOST_NAME.fullmatch(name):
            raise LabError(f"host {text!r}: name {name!r} must be 1-64 letters, digits, "
                           "'.', '_' or '-', starting with a letter or digit")
        return cls(name=name, destination=destination.rpartition(":")[0] if port else
                   destination, ssh_port=port)


def parse_extras(text: str) -> list[str]:
    """``agent,pi`` as a list; ``agent`` is always in, ``pi`` and ``pi5`` exclude each other."""
    extras = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise LabError(f"--extras {text!r}: unknown {', '.join(unknown)}; choose from "
                       f"{', '.join(EXTRAS)} (an agent host needs nothing else: no Spark)")
    if "pi" in extras and "pi5" in extras:
        raise LabError(f"--extras {text!r}: pi (RPi.GPIO, Pi 1-4) and pi5 (rpi-lgpio) "
                       "cannot both be installed; pick the one for the board")
    return ["agent", *[e for e in extras if e != "agent"]]


class Wheels:
    """mqttbed's wheel, built once from the source tree, and the agent's wheelhouse."""

    def __init__(self, cache_dir: Path, source: Path | None = None, wheel: Path | None = None,
                 log: Callable[[str], None] = print):
        self.cache_dir = cache_dir
        self.source = source
        self._wheel = wheel
        self._log = log
        self._lock = threading.Lock()
        self._houses: dict[str, Path] = {}

    def mqttbed_wheel(self) -> Path:
        """The wheel to install (built from ``source`` on first use)."""
        with self._lock:
            if self._wheel is None:
                self._wheel = self._build()
            return self._wheel

    def build_id(self) -> str | None:
        """What this controller would install: its sources' digest (or the given wheel's)."""
        if self._wheel is not None and self._wheel.parent.parent != self.cache_dir / "dist":
            return hashlib.sha256(self._wheel.read_bytes()).hexdigest()[:16]
        try:
            return _source_digest(self.source or _source_tree())
        except LabError:
            return None

    def _build(self) -> Path:
        """Build from the source tree, unless a wheel of the very same sources is cached."""
        source = self.source or _source_tree()
        dist = self.cache_dir / "dist" / _source_digest(source)
        if built := sorted(dist.glob("mqttbed-*.whl")):
            return built[0]
        dist.mkdir(parents=True, exist_ok=True)
        self._log(f"building the mqttbed wheel from {source}")
        _pip(["wheel", "--no-deps", "--wheel-dir", str(dist),
              str(source)], "build mqttbed's wheel")
        built = sorted(dist.glob("mqttbed-*.whl"))
        if len(built) != 1:
            raise LabError(f"building mqttbed's wheel left {len(built)} wheels in {dist}")
        return built[0]

    def wheelhouse(self, extras: list[str]) -> Path:
        """Wheels for ``mqttbed[extras]`` on this machine's platform, cached (offline first)."""
        wheel = self.mqttbed_wheel()
        key = ",".join(extras)
        with self._lock:
            if key in self._houses:
                return self._houses[key]
            house = self.cache_dir / f"wheelhouse-{platform.machine()}-py" \
                f"{sys.version_info[0]}{sys.version_info[1]}"
            house.mkdir(parents=True, exist_ok=True)
            requirement = f"{wheel}[{key}]"
            base = ["wheel", "--wheel-dir", str(house), "--find-links", str(house),
                    "--find-links", str(wheel.parent)]
            try:
                _pip([*base, "--no-index", requirement], "fill the wheelhouse offline")
            except LabError:
                self._log(f"wheelhouse {house}: fetching what the agent needs from the index")
                _pip([*base, requirement], "fill the wheelhouse from the package index")
            # pip copies mqttbed's wheel in too: an older build under the same file name
            # must never be taken for the current one
            for copied in house.glob("mqttbed-*.whl"):
                copied.unlink()
            self._houses[key] = house
            return house


SOURCE_SUFFIXES = {".py", ".toml", ".yaml", ".c", ".h", ".html", ".mako", ".p4", ".txtpb",
                   ".md", ".cfg"}
NOT_SOURCE = {".venv", "build", "data", "tests", ".git", "test-artifacts", "docs", "bench",
              "__pycache__", "node_modules"}


def _source_digest(root: Path) -> str:
    """A hash of the files a wheel is built from (names and contents), 16 hex digits."""
    import os

    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in SOURCE_SUFFIXES:
                digest.update(str(path.relative_to(root)).encode() + b"\0"
                              + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _source_tree() -> Path:
    """The checkout this mqttbed runs from (a wheel is built from it)."""
    import mqttbed

    root = Path(mqttbed.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").exists():
        raise LabError(f"mqttbed is not running from a source checkout ({root} has no "
                       "pyproject.toml): pass --wheel with an mqttbed wheel to install")
    return root


def _pip(args: list[str], purpose: str) -> str:
    argv = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"pip did not finish in {PIP_TIMEOUT_S} s (to {purpose})") from None
    if done.returncode != 0:
        raise LabError(f"`pip {' '.join(args)}` (to {purpose}) failed: "
                       f"{(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


@dataclass(frozen=True)
class Access:
    """How this controller logs in to its lab hosts."""

    key_filename: str | None = None
    known_hosts: str | None = None
    trust_new: bool = False


class LabHosts:
    """The lab hosts of one controller database: provision, upgrade, status, remove."""

    def __init__(self, sessions: sessionmaker, wheels: Wheels,
                 log: Callable[[str], None] = print):
        self.sessions = sessions
        self.wheels = wheels
        self._log = log

    # -- provision / upgrade ----------------------------------------------------------

    def provision(self, hosts: list[HostArg], access: Access, extras: list[str],
                  remote_dir: str | None = None) -> list[LabHostRow]:
        """Provision every host (in parallel); raise LabError naming each that failed.

        ``extras`` empty: no agent, only the host's facts (a broker machine, broker.host).
        """
        if extras:
            self.wheels.mqttbed_wheel()   # once, before the hosts want it
        return self._provision_all([(host, access, extras, remote_dir) for host in hosts])

    def upgrade(self, names: list[str]) -> list[LabHostRow]:
        """Install the current mqttbed on provisioned hosts (all when ``names`` is empty)."""
        self.wheels.mqttbed_wheel()
        return self._provision_all([
            (HostArg(row.name, row.destination, row.ssh_port),
             Access(row.key_filename, row.known_hosts, row.trust_new),
             [e for e in row.extras.split(",") if e], row.remote_dir)
            for row in self._rows(names)])

    def _provision_all(self, jobs: list[tuple[HostArg, Access, list[str], str | None]]
                       ) -> list[LabHostRow]:
        """:meth:`_provision_one` for every job, up to PARALLEL_HOSTS at once; raise
        LabError naming each host that failed."""
        with ThreadPoolExecutor(min(PARALLEL_HOSTS, max(len(jobs), 1))) as pool:
            futures = [pool.submit(self._provision_one, *job) for job in jobs]
        failures = [str(f.exception()) for f in futures if f.exception() is not None]
        if failures:
            raise LabError("; ".join(failures))
        return [f.result() for f in futures]

    def _provision_one(self, host: HostArg, access: Access, extras: list[str],
                       remote_dir: str | None) -> LabHostRow:
        target = SshTarget(host=host.destination, ssh_port=host.ssh_port,
                           key_filename=access.key_filename, known_hosts=access.known_hosts,
                           trust_new=access.trust_new)
        row = LabHostRow(name=host.name, destination=host.destination, ssh_port=host.ssh_port,
                         key_filename=access.key_filename, known_hosts=access.known_hosts,
                         trust_new=access.trust_new, remote_dir=remote_dir or "",
                         extras=",".join(extras), state="failed", facts={}, version=None)
        try:
            ssh = SshHost(target, name=host.name)
        except SshError as exc:
            self._save(row, reason=str(exc))
            raise LabError(f"{host.name}: {exc}") from None
        try:
            self._install(ssh, row, extras)
        except (SshError, LabError, ValueError) as exc:
            self._save(row, reason=str(exc))
            raise LabError(f"{host.name}: {exc}") from None
        finally:
            ssh.close()
        row.state, row.provisioned_at = "provisioned", utcnow()
        return self._save(row, reason=None)

    def _install(self, ssh: SshHost, row: LabHostRow, extras: list[str]) -> None:
        info = json.loads(ssh.run(["python3", "-c", _PLATFORM_PROBE], "find its Python"))
        if not extras:   # a broker machine: its facts, nothing installed
            row.facts = {"model": info["model"], "kernel": info["kernel"],
                         "machine": info["machine"],
                         "python": ".".join(map(str, info["python"])), "gpio_backends": []}
            self._log(f"{row.name}: no agent; {_summary(row.facts)}")
            return
        if tuple(info["python"]) < (3, 11):
            raise LabError(f"its python3 is {'.'.join(map(str, info['python']))}; mqttbed "
                           "needs 3.11 or newer (Raspberry Pi OS bookworm has 3.11)")
        row.remote_dir = row.remote_dir or f"{info['home']}/{REMOTE_DIR_NAME}"
        remote = row.remote_dir
        same_platform = (info["machine"] == platform.machine()
                         and tuple(info["python"][:2]) == sys.version_info[:2])
        wheel = self.wheels.mqttbed_wheel()
        files = [wheel, *(sorted(self.wheels.wheelhouse(extras).glob("*.whl"))
                          if same_platform else [])]
        ssh.run(["mkdir", "-p", f"{remote}/wheelhouse"], "create its wheelhouse")
        present = set(ssh.run(["ls", f"{remote}/wheelhouse"], "list its wheelhouse").split())
        copied = 0
        for path in files:
            if path.name not in present or path.name == wheel.name:
                ssh.put(path, f"{remote}/wheelhouse/{path.name}")
                copied += 1
        self._log(f"{row.name}: {copied} wheel(s) copied to {remote}/wheelhouse "
                  f"({'offline install' if same_platform else 'dependencies from its index'})")
        venv = f"{remote}/venv"
        try:
            ssh.run(["test", "-x", f"{venv}/bin/python"], "look for its venv")
            fresh = False
        except SshError:
            ssh.run(["python3", "-m", "venv", venv], "create its venv")
            fresh = True
        pip = ["env", "PIP_DISABLE_PIP_VERSION_CHECK=1", f"{venv}/bin/pip", "install",
               # no .pyc up front: the agent compiles what it imports on first start
               "--quiet", "--no-compile", "--find-links", f"{remote}/wheelhouse",
               *(("--no-index",) if same_platform else ())]
        target_wheel = f"{remote}/wheelhouse/{wheel.name}"
        ssh.run([*pip, f"{target_wheel}[{','.join(extras)}]"], "install mqttbed")
        if not fresh:   # the same version number may hold new code: replace it
            ssh.run([*pip, "--no-deps", "--force-reinstall", target_wheel],
                    "reinstall mqttbed")
        printed = ssh.run([f"{venv}/bin/mqttbed", "agent", "--version"], "check the agent")
        if not printed.startswith("mqttbed "):
            raise LabError(f"`mqttbed agent --version` printed {printed[:100]!r}")
        row.version = printed.split()[1]
        row.facts = json.loads(ssh.run([f"{venv}/bin/python", "-m", "mqttbed.agents.facts"],
                                       "record its facts"))
        # the version number stays 0.1.0 while the code moves on: the build says which
        row.facts["build"] = self.wheels.build_id()
        # the native load engine compiled now, by the host for its CPU; a host that cannot
        # build it is not failed (its agents run the lean client), but its facts say why
        row.facts["native_engine"] = json.loads(ssh.run(
            [f"{venv}/bin/python", "-m", "mqttbed.agents.native"],
            "build its native load engine"))
        self._log(f"{row.name}: mqttbed {row.version} in {venv}; {_summary(row.facts)}")

    def _save(self, row: LabHostRow, reason: str | None) -> LabHostRow:
        row.reason = reason
        with self.sessions() as s:
            merged = s.merge(row)
            s.commit()
            s.refresh(merged)
            s.expunge(merged)
            return merged

    # -- status / remove ----------------------------------------------------------------

    def rows(self) -> list[LabHostRow]:
        with self.sessions() as s:
            return list(s.query(LabHostRow).order_by(LabHostRow.name))

    def _rows(self, names: list[str]) -> list[LabHostRow]:
        rows = {row.name: row for row in self.rows()}
        unknown = [name for name in names if name not in rows]
        if unknown:
            raise LabError(f"no lab host named {', '.join(map(repr, unknown))}; known: "
                           f"{', '.join(rows) or 'none (mqttbed lab provision adds them)'}")
        return [rows[name] for name in names] if names else list(rows.values())

    def status(self, names: list[str]) -> list[dict[str, Any]]:
        """Each host's record, whether its agent answers now (over SSH), and whether it
        runs this controller's build (an agent of another build may not speak its protocol)."""
        current = self.wheels.build_id()
        result = []
        for row in self._rows(names):
            argv = ([f"{row.remote_dir}/venv/bin/mqttbed", "agent", "--version"] if row.extras
                    else ["sh", "-c", "echo reachable, no agent"])
            try:
                ssh = SshHost(target_of(row), name=row.name)
                try:
                    live = ssh.run(argv, "check the agent")
                finally:
                    ssh.close()
            except SshError as exc:
                live = f"unreachable: {exc}"
            installed = (row.facts or {}).get("build")
            build = (None if not row.extras or row.state != "provisioned" else
                     "current" if installed and installed == current else
                     "outdated: mqttbed lab upgrade installs this controller's")
            result.append({"name": row.name, "destination": row.destination,
                           "state": row.state, "version": row.version, "answers": live,
                           "build": build, "reason": row.reason, "facts": row.facts})
        return result

    def remove(self, names: list[str], forget_only: bool = False) -> list[str]:
        """Delete each host's venv and wheelhouse there, then its record."""
        removed = []
        for row in self._rows(names):
            if not forget_only and row.remote_dir:
                try:
                    ssh = SshHost(target_of(row), name=row.name)
                    try:
                        ssh.run(["rm", "-rf", "--", row.remote_dir], "remove its venv")
                    finally:
                        ssh.close()
                except SshError as exc:
                    raise LabError(f"{row.name}: {exc}; `mqttbed lab remove --forget "
                                   f"{row.name}` drops the record without touching the "
                                   "host") from None
            with self.sessions() as s:
                s.delete(s.get(LabHostRow, row.name))
                s.commit()
            removed.append(row.name)
        return removed


_PLATFORM_PROBE = (
    "import json, os, platform, sys\n"
    "try: model = open('/proc/device-tree/model', 'rb').read().rstrip(b'\\0').decode()\n"
    "except OSError: model = None\n"
    "print(json.dumps({'machine': platform.machine(), 'python': list(sys.version_info[:3]), "
    "'kernel': platform.release(), 'model': model, 'home': os.path.expanduser('~')}))")


def target_of(row: LabHostRow) -> SshTarget:
    """How to reach a provisioned host."""
    return SshTarget(host=row.destination, ssh_port=row.ssh_port,
                     key_filename=row.key_filename, known_hosts=row.known_hosts,
                     trust_new=row.trust_new)


def _summary(facts: dict[str, Any]) -> str:
    clock = facts.get("clock") or {}
    bound = clock.get("error_bound_ns")
    clock_text = clock.get("source", "?") + (f" ±{bound / 1000:.1f} us" if bound else
                                             "" if clock.get("synchronised") else
                                             " (not synchronised)")
    engine = native_engine_text(facts)
    return (f"{facts.get('model') or facts.get('machine')}, kernel {facts.get('kernel')}, "
            f"Python {facts.get('python')}, GPIO {'/'.join(facts.get('gpio_backends', []))}, "
            f"clock {clock_text}" + (f", {engine}" if engine else ""))


def native_engine_text(facts: dict[str, Any]) -> str | None:
    """What a host's facts say of its native load engine (built at provision), or None for
    a host with no agent or provisioned before the engine was built there."""
    engine = facts.get("native_engine")
    if not engine:
        return None
    if engine.get("state") == "built":
        return f"native engine built ({engine.get('seconds')} s)"
    return f"no native engine: {engine.get('reason')}"


def resolve_named_hosts(spec: CampaignSpec, sessions: sessionmaker) -> CampaignSpec:
    """``agents.hosts`` entries that name a lab host, filled in from its record.

    An unknown name, or a host whose provisioning failed, is a spec error naming it.
    """
    if not any(h.name and not h.host for h in spec.agents.hosts) and spec.broker.host is None:
        return spec
    with sessions() as s:
        rows = {row.name: row for row in s.query(LabHostRow)}
    if spec.broker.host is not None:
        if spec.broker.host not in rows:
            raise SpecError(f"broker.host: no lab host named {spec.broker.host!r}; known: "
                            f"{', '.join(sorted(rows)) or 'none'} (mqttbed lab provision "
                            "adds one)")
        check_lab_host_backend(spec.broker.backend)
    hosts = []
    for i, entry in enumerate(spec.agents.hosts):
        if entry.host:
            hosts.append(entry)
            continue
        row = rows.get(entry.name or "")
        if row is None:
            raise SpecError(f"agents.hosts[{i}].name: no lab host named {entry.name!r}; "
                            f"known: {', '.join(sorted(rows)) or 'none'} (mqttbed lab "
                            "provision adds one, mqttbed lab status lists them)")
        if row.state == "provisioned" and not row.extras:
            raise SpecError(f"agents.hosts[{i}].name: lab host {entry.name!r} has no agent "
                            "(provisioned with --no-agent); provision it with --extras agent")
        if row.state != "provisioned":
            raise SpecError(f"agents.hosts[{i}].name: lab host {entry.name!r} is "
                            f"{row.state}: {row.reason}; provision it again")
        hosts.append(entry.model_copy(update={
            **target_of(row).model_dump(exclude={"connect_timeout_s"}),
            "command": f"{row.remote_dir}/venv/bin/mqttbed"}))
    agents = spec.agents.model_copy(update={"hosts": hosts})
    return spec.model_copy(update={"agents": agents})
