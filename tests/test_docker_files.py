"""docker/: everything that can be checked without a container engine (none runs here).

The Dockerfile is read with BuildKit's own parser (the ``dockerfile`` package) and linted
with hadolint, the entrypoint scripts with shellcheck; the compose file is validated
against the Compose Specification (``compose-spec``) and then against this repository:
build targets, COPY sources, package folders, extras, the settings the code reads and the
real command lines. The entrypoints run here, outside a container, with the venv's mqttbed.
No image is built and no container runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from compose_spec import PyCompose

from mqttbed.core.settings import ENV_PREFIX, AgentSettings, ClientSettings, Settings
from tests.docker_files import (
    COMPOSE,
    DOCKER,
    DOCKERFILE,
    PYPROJECT,
    REPO,
    VENV_BIN,
    built,
    chain,
    compose,
    copy_problems,
    dockerignored,
    entry_argv,
    help_text,
    installs_of,
    option,
    package_folder_problems,
    services,
    stages_of,
    subcommand_of,
)

# What each image is for, in extras; the agent's must stay free of these packages.
IMAGE_EXTRAS = {"agent": {"agent"}, "spark": {"analytics"},
                "controller": {"controller", "analytics"}}
NOT_ON_AN_AGENT = {"pyspark", "fastapi", "sqlalchemy", "uvicorn", "alembic"}


# -- the Dockerfile ------------------------------------------------------------------------

def test_dockerfile_and_entrypoints_pass_hadolint_and_shellcheck():
    hadolint = subprocess.run([str(VENV_BIN / "hadolint"), "--no-color", str(DOCKERFILE)],
                              capture_output=True, text=True)
    assert (hadolint.returncode, hadolint.stdout) == (0, "")
    scripts = sorted(DOCKER.glob("*.sh"))
    assert scripts
    shellcheck = subprocess.run([str(VENV_BIN / "shellcheck"), *map(str, scripts)],
                                capture_output=True, text=True)
    assert (shellcheck.returncode, shellcheck.stdout) == (0, "")


def test_every_copy_source_is_in_the_repository_and_sent_to_the_build():
    assert copy_problems(DOCKERFILE.read_text()) == []


def test_the_checks_report_a_missing_copy_source_and_a_package_folder_left_out():
    text = DOCKERFILE.read_text()
    assert "COPY network network\n" in text
    broken = text.replace("COPY network network\n",
                          "COPY networks networks\nCOPY --from=nowhere /x /x\n")
    assert copy_problems(broken) == [
        "wheel: COPY source 'networks' is not in the repository",
        "wheel: 'COPY --from=nowhere /x /x' reads stage 'nowhere', which is not defined "
        "before it"]
    assert package_folder_problems(broken) == [
        f"{image} installs mqttbed from wheel, which does not copy 'network'"
        for image in ("agent", "spark", "controller")]


def test_every_image_that_installs_mqttbed_gets_every_package_folder_of_pyproject():
    text = DOCKERFILE.read_text()
    assert {s.name for s in stages_of(text).values() if installs_of(s)} == set(IMAGE_EXTRAS)
    assert package_folder_problems(text) == []


def test_each_image_installs_the_extras_it_is_for_and_the_agent_nothing_heavier():
    stages = stages_of(DOCKERFILE.read_text())
    extras = PYPROJECT["project"]["optional-dependencies"]
    for image, wanted in IMAGE_EXTRAS.items():
        installed = {e for stage in chain(stages, image) for es, _ in installs_of(stage)
                     for e in es}
        assert installed == wanted, image
        assert installed <= set(extras), f"{image} installs an extra pyproject lacks"
    agent_requirements = [*PYPROJECT["project"]["dependencies"], *extras["agent"]]
    names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() for r in agent_requirements}
    assert names & NOT_ON_AN_AGENT == set()
    agent_runs = " ".join(" ".join(r.value) for s in chain(stages, "agent") for r in s.all("RUN"))
    assert "apt-get" not in agent_runs  # no JRE, no compiler: the slim Python image as it is
    assert "jre" in " ".join(" ".join(r.value) for r in stages["spark"].all("RUN"))
    assert stages["controller"].base == "spark"  # the driver's pyspark is the executors'


# -- the compose file ----------------------------------------------------------------------

def test_compose_file_follows_the_compose_specification():
    parsed = PyCompose.from_yaml(COMPOSE.read_text())
    assert set(parsed.service_names()) == {"controller", "mosquitto", "spark-master",
                                           "spark-worker", "agent-1", "agent-2"}


def test_every_build_names_an_existing_context_dockerfile_and_target():
    targets = set(stages_of(DOCKERFILE.read_text()))
    for name, service in services().items():
        if not built(service):
            continue
        context = (DOCKER / service["build"]["context"]).resolve()
        assert context == REPO, name
        assert (context / service["build"]["dockerfile"]).resolve() == DOCKERFILE, name
        assert service["build"]["target"] in targets, name


def test_depends_on_names_services_and_waits_only_on_ones_with_a_healthcheck():
    declared = services()
    for name, service in declared.items():
        for needed, how in service.get("depends_on", {}).items():
            assert needed in declared, f"{name} depends on {needed}, which is no service"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in declared[needed], f"{needed} has no healthcheck"


def test_every_mqttbed_variable_set_is_one_the_code_reads():
    settings = {ENV_PREFIX + name.upper() for model in (Settings, ClientSettings, AgentSettings)
                for name in model.model_fields}
    sources = [p for top in PYPROJECT["tool"]["setuptools"]["package-dir"].values()
               for p in (REPO / top).rglob("*.py")]
    read_elsewhere = {m for p in sources for m in re.findall(r"MQTTBED_[A-Z0-9_]+",
                                                              p.read_text())}
    stages = stages_of(DOCKERFILE.read_text())
    set_in_images = {i.value[k] for s in stages.values() for i in s.all("ENV")
                     for k in range(0, len(i.value), 2)}
    set_in_compose = {k for s in services().values() for k in s.get("environment", {})}
    ours = {v for v in set_in_images | set_in_compose if v.startswith(ENV_PREFIX)}
    assert "MQTTBED_DATA_DIR" in ours
    assert ours - (settings | read_elsewhere) == set()
    # Tokens come from secrets at run time, never from the image or the compose file.
    assert ours & {"MQTTBED_AGENT_TOKEN", "MQTTBED_TOKEN"} == set()


@pytest.mark.integration  # Spark's Master and Worker print their usage from a JVM
def test_every_command_uses_subcommands_and_options_the_real_cli_has():
    from mqttbed.controller.cli import build_parser

    for name, service in services().items():
        if not built(service):
            continue
        argv = entry_argv(service)
        program = subcommand_of(argv)
        known = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text(program)))
        used = {word for word in argv if word.startswith("--")}
        assert used - known == set(), f"{name}: {shlex.join(argv)}"
        if argv[0] == "mqttbed":  # and the real parser takes the values too
            assert build_parser().parse_args(argv[1:]).func, name


def test_ports_and_urls_name_the_services_that_listen_on_them():
    declared = services()
    controller = entry_argv(declared["controller"])
    master = entry_argv(declared["spark-master"])
    worker = entry_argv(declared["spark-worker"])
    master_url = f"spark://spark-master:{option(master, '--port')}"
    assert option(master, "--host") == "spark-master"
    assert option(controller, "--spark-master") == master_url
    assert worker[worker.index("org.apache.spark.deploy.worker.Worker") + 1] == master_url
    api = urlsplit(f"http://controller:{option(controller, '--port')}")
    for agent in ("agent-1", "agent-2"):
        url = urlsplit(option(entry_argv(declared[agent]), "--controller"))
        assert (url.hostname, url.port) == (api.hostname, api.port), agent
        assert option(entry_argv(declared[agent]), "--name") == agent
    assert f"{api.port}:{api.port}" in declared["controller"]["ports"]
    for name, port in (("controller", api.port), ("spark-master", option(master, "--webui-port")),
                       ("spark-worker", option(worker, "--webui-port"))):
        check = " ".join(declared[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/" in check, name


def test_data_is_on_a_named_volume_at_the_same_path_for_the_controller_and_the_worker():
    declared = compose()
    data_dir = declared["services"]["controller"]["environment"]["MQTTBED_DATA_DIR"]
    mount = f"mqttbed-data:{data_dir}"
    assert "mqttbed-data" in declared["volumes"]
    for name in ("controller", "spark-worker"):
        assert mount in declared["services"][name]["volumes"], name
    for name, service in declared["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).is_file(), f"{name} mounts {source}, which is missing"


def test_agent_tokens_are_secret_files_at_the_path_the_entrypoint_reads():
    declared = compose()
    script = (DOCKER / "agent-entrypoint.sh").read_text()
    default = re.search(r"AGENT_TOKEN_FILE:-(/run/secrets/[\w.-]+)", script).group(1)
    for agent in ("agent-1", "agent-2"):
        (secret,) = declared["services"][agent]["secrets"]
        assert f"/run/secrets/{secret['target']}" == default
        source = (DOCKER / declared["secrets"][secret["source"]]["file"]).resolve()
        assert source.parent == DOCKER / "secrets"
    # Never committed, never sent to a build.
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/secrets/agent-1.token"],
                             cwd=REPO)
    assert ignored.returncode == 0
    assert dockerignored("docker/secrets/agent-1.token")


# -- the entrypoints, outside a container --------------------------------------------------

def _entrypoint_env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return {**clean, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.integration  # a real controller and agent
def test_entrypoints_serve_a_controller_and_register_an_agent_from_a_token_file(tmp_path):
    controller_entry = DOCKER / "controller-entrypoint.sh"
    agent_entry = DOCKER / "agent-entrypoint.sh"
    env = _entrypoint_env()
    data = tmp_path / "data"

    def token(role: str, name: str) -> str:
        done = subprocess.run([str(controller_entry), "token", "create", "--name", name,
                               "--role", role, "--data-dir", str(data)],
                              capture_output=True, text=True, env=env, timeout=60, check=True)
        return done.stdout.strip()

    user_token, agent_token = token("user", "test"), token("agent", "agent-1")
    token_file = tmp_path / "agent-1.token"
    token_file.write_text(agent_token + "\n")
    log = (tmp_path / "controller.log").open("w+")
    controller = subprocess.Popen([str(controller_entry), "serve", "--host", "127.0.0.1",
                                   "--port", "0", "--data-dir", str(data)],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
    agent = None
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"controller on (http://127\.0\.0\.1:\d+)",
                                  log_text := Path(log.name).read_text())):
            assert controller.poll() is None and time.monotonic() < deadline, log_text
            time.sleep(0.2)
        url = m.group(1)
        # exec: the process is mqttbed itself, with the address the script derived.
        environ = dict(e.split("=", 1) for e in
                       Path(f"/proc/{controller.pid}/environ").read_text().split("\0") if "=" in e)
        assert environ["MQTTBED_LAB_ADDRESS"] == socket.gethostbyname(socket.gethostname())
        agent = subprocess.Popen([str(agent_entry), "--controller", url, "--name", "agent-1",
                                  "--gpio", "virtual"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.STDOUT,
                                 env=_entrypoint_env(AGENT_TOKEN_FILE=str(token_file)))
        request = urllib.request.Request(f"{url}/api/v1/agents",
                                          headers={"authorization": f"Bearer {user_token}"})
        while True:
            with urllib.request.urlopen(request, timeout=5) as answer:
                agents = json.load(answer)
            if any(a["name"] == "agent-1" and a["state"] == "idle" for a in agents):
                break
            assert agent.poll() is None and time.monotonic() < deadline, agents
            time.sleep(0.2)
        # The token went through the environment, not the command line.
        assert agent_token not in Path(f"/proc/{agent.pid}/cmdline").read_text()
    finally:
        if agent is not None:
            _stop(agent)
        _stop(controller)
        log.close()


def test_agent_entrypoint_refuses_an_empty_token_file_naming_it(tmp_path):
    empty = tmp_path / "agent.token"
    empty.write_text("\n")
    done = subprocess.run([str(DOCKER / "agent-entrypoint.sh"), "--controller",
                           "http://127.0.0.1:9", "--gpio", "virtual"], capture_output=True,
                          text=True, env=_entrypoint_env(AGENT_TOKEN_FILE=str(empty)),
                          timeout=30)
    assert done.returncode == 2
    assert f"the token file {empty} is empty" in done.stderr


@pytest.mark.parametrize("target", sorted(IMAGE_EXTRAS))
def test_every_image_is_built_by_a_compose_service(target):
    assert any(s["build"]["target"] == target for s in services().values() if built(s))
