"""docker/ as data: the Dockerfile's stages (read with BuildKit's own parser, the
``dockerfile`` package), the compose file's services, and the checks
tests/test_docker_files.py makes of them, written to be run on broken texts as well."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
VENV_BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# -- the Dockerfile, as stages -------------------------------------------------------------

@dataclass
class Stage:
    """One ``FROM ... AS name`` and the instructions under it."""

    name: str
    base: str
    instructions: list[dockerfile.Command] = field(default_factory=list)

    def all(self, cmd: str) -> list[dockerfile.Command]:
        return [i for i in self.instructions if i.cmd == cmd]


def stages_of(text: str) -> dict[str, Stage]:
    """The named stages of a Dockerfile, in order."""
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for instruction in dockerfile.parse_string(text):
        if instruction.cmd == "FROM":
            base, *alias = instruction.value
            assert alias and alias[0].upper() == "AS", f"unnamed stage: {instruction.original}"
            current = stages[alias[1]] = Stage(alias[1], base)
        elif current is not None:
            current.instructions.append(instruction)
    return stages


def chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and the stages it is built on, itself first."""
    found = []
    while name in stages:
        found.append(stages[name])
        name = stages[name].base
    return found


def flag(instruction: dockerfile.Command, name: str) -> str | None:
    return next((f.split("=", 1)[1] for f in instruction.flags
                 if f.startswith(f"--{name}=")), None)


def mount_stage(run: dockerfile.Command) -> str | None:
    """The stage a ``RUN --mount=...,from=STAGE`` reads, if any."""
    for value in filter(None, [flag(run, "mount")]):
        options = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        return options.get("from")
    return None


def dockerignored(path: str) -> bool:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = Path(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes for pattern in patterns)


def copy_problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile's COPY and ADD sources and stage references."""
    problems, seen = [], set()
    for name, stage in stages_of(text).items():
        for instruction in stage.instructions:
            source_stage = (flag(instruction, "from") if instruction.cmd in ("COPY", "ADD")
                            else mount_stage(instruction) if instruction.cmd == "RUN" else None)
            if source_stage is not None:
                if source_stage not in seen:
                    problems.append(f"{name}: {instruction.original!r} reads stage "
                                    f"{source_stage!r}, which is not defined before it")
            elif instruction.cmd in ("COPY", "ADD"):
                for source in instruction.value[:-1]:
                    if not (REPO / source).exists():
                        problems.append(f"{name}: COPY source {source!r} is not in the "
                                        "repository")
                    elif dockerignored(source):
                        problems.append(f"{name}: COPY source {source!r} is excluded by "
                                        ".dockerignore")
        seen.add(name)
    return problems


def installs_of(stage: Stage) -> list[tuple[set[str], str]]:
    """Each ``pip install`` of mqttbed in a stage: its extras and where its code comes from
    (the stage whose files it reads)."""
    found = []
    for run in stage.all("RUN"):
        command = " ".join(run.value)
        if "pip install" not in command:
            continue
        match = re.search(r"(?:mqttbed-\*\.whl\)|\s\.)\[([\w,-]+)\]", command)
        if match:
            found.append((set(match.group(1).split(",")), mount_stage(run) or stage.name))
    return found


def package_folder_problems(text: str) -> list[str]:
    """Package folders of pyproject's package-dir that an installing image never gets."""
    folders = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    needed = folders | {"pyproject.toml", PYPROJECT["project"]["readme"]}
    stages = stages_of(text)
    problems = []
    for stage in stages.values():
        for _, source in installs_of(stage):
            copied = {s.rstrip("/") for i in stages[source].all("COPY") if not flag(i, "from")
                      for s in i.value[:-1]}
            problems += [f"{stage.name} installs mqttbed from {source}, which does not copy "
                         f"{missing!r}" for missing in sorted(needed - copied)]
    return problems


# -- the compose file ----------------------------------------------------------------------

def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def built(service: dict) -> bool:
    return "build" in service


def entry_argv(service: dict) -> list[str]:
    """The argv a built service runs: its image's entrypoint, through the script it execs,
    then the compose command."""
    stage_chain = chain(stages_of(DOCKERFILE.read_text()), service["build"]["target"])
    entrypoint = next(s.all("ENTRYPOINT")[-1].value for s in stage_chain if s.all("ENTRYPOINT"))
    return [*script_command(stage_chain, entrypoint[0]), *entrypoint[1:], *service["command"]]


def script_command(stage_chain: list[Stage], program: str) -> list[str]:
    """What an entrypoint runs: for one of our scripts (COPYed to ``program``), the command
    of its ``exec ... "$@"`` line; otherwise the program itself."""
    for stage in stage_chain:
        for copy in stage.all("COPY"):
            if Path(copy.value[-1]).name == program:
                script = (REPO / copy.value[0]).read_text()
                line = re.search(r'^exec (.+) "\$@"$', script, re.MULTILINE)
                assert line, f"{copy.value[0]} has no `exec ... \"$@\"` line"
                return shlex.split(line.group(1))
    return [program]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def help_text(argv: list[str]) -> str:
    """``ARGV --help`` of the real program, from the venv."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, f"{argv} --help failed: {done.stderr[-2000:]}"
    return done.stdout + done.stderr


def subcommand_of(argv: list[str]) -> list[str]:
    """The program and its subcommands: the words before the first option."""
    words = []
    for word in argv:
        if word.startswith("-"):
            break
        words.append(word)
    return words
