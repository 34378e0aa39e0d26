"""The docs site: it builds with no warning, and its generated reference leaves nothing out."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]


def _reference() -> ModuleType:
    """scripts/docs_reference.py, the MkDocs hook that writes the Reference pages."""
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_models() -> list[type[BaseModel]]:
    from mqttbed.campaigns.spec import CampaignSpec
    from mqttbed.core import backends
    from mqttbed.core.settings import AgentSettings, ClientSettings, Settings

    options = [backends.options_model(name) for name in backends.backend_names()]
    return [CampaignSpec, *options, Settings, ClientSettings, AgentSettings]


def _a_tag(annotation: object) -> bool:
    """A field of one possible value (``backend: Literal["fpga"]``) tags its model: the
    reference shows that value, and ``broker.backend`` says what it is."""
    return typing.get_origin(annotation) is typing.Literal and len(typing.get_args(annotation)) == 1


def test_every_spec_backend_option_and_setting_field_has_a_description():
    reference = _reference()
    missing = sorted({f"{owner.__module__}.{owner.__qualname__}.{name}"
                      for model in _documented_models()
                      for owner, name, field in reference.model_fields(model)
                      if not (field.description or "").strip() and not _a_tag(field.annotation)})
    assert not missing, ("fields without a description (add Field(description=...); the "
                         "reference shows it):\n  " + "\n  ".join(missing))


def test_spec_reference_lists_every_field_of_every_model_with_its_bounds():
    from mqttbed.campaigns.spec import CampaignSpec, Workload

    reference = _reference()
    page = reference.spec_page()
    for model in _documented_models()[:-3]:
        for _owner, name, field in reference.model_fields(model):
            assert f"| `{field.alias or name}` |" in page, name
    assert set(Workload.model_fields) <= {n for _o, n, _f in reference.model_fields(CampaignSpec)}
    # bounds come from the model's metadata: retries is 0 ... 10
    assert "| `retries` | integer | `1` | ≥ 0, ≤ 10 |" in page
    # a field of two forms names both (repetitions: a count, or {min, max, until})
    assert "| `repetitions` | integer \\| RepetitionsUntil | `1` |" in page
    assert "| `max` | integer | **required** | ≥ 2, ≤ 10000 |" in page


def test_cli_reference_has_every_subcommand_of_the_parser():
    from mqttbed.controller.cli import build_parser

    reference = _reference()
    page = reference.cli_page()
    for name in reference._subparsers(build_parser()):
        assert f"`mqttbed {name}`" in page, name


@pytest.mark.integration  # builds the FastAPI app with its controller and database
def test_rest_api_reference_has_every_route_of_the_openapi_document():
    reference = _reference()
    document = reference.openapi_document()
    page = reference.rest_api_page(document)
    routes = [(method, path) for path, methods in document["paths"].items()
              for method in methods]
    assert any(path == "/api/v1/campaigns" for _m, path in routes)
    for method, path in routes:
        assert f"`{method.upper()} {path}`" in page


@pytest.mark.integration  # mkdocs builds the whole site with every generated page
@pytest.mark.timeout(300)
def test_docs_site_builds_strict_without_a_warning(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in ("index.html", "reference/spec/index.html", "reference/cli/index.html",
                 "reference/rest-api/index.html", "reference/results/index.html",
                 "reference/settings/index.html", "writing-a-backend/index.html",
                 "stats.schema.json", "explanation/architecture/index.html"):
        assert (tmp_path / page).is_file(), page


# ---------------------------------------------------------------------------------------
# Docs that run: every shell block of the tutorials is executed here, or marked as needing
# hardware (a `<!-- docs-test: hardware -->` marker this test reads, under a visible
# "Needs hardware" admonition). A block marked `<!-- docs-test: system -->` is long: it runs
# in `make test-system`, with the page's other blocks, in order, in one shell. Unmarked
# blocks are short: they run in `make test`, and must not need the long ones before them.
# A block marked `<!-- docs-test: cleanup -->` undoes what the page did (uninstalls a
# package): it runs with the long ones, after them, in a shell of its own, even when they
# failed; and the venv's packages must then be as they were before the page ran.
# A block marked `<!-- docs-test: setup -->` installs what the test's environment already
# has (`make demo`, `make install`: the tests run from the checkout's venv): it is never
# run, but each of its lines must be a target of the Makefile that `make -n` accepts.

TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
SHELL_LANGUAGES = {"", "sh", "bash", "shell", "console"}
TIERS = {"short", "system", "hardware", "cleanup", "setup"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<tier>[\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class ShellBlock:
    """One fenced shell block of a docs page: where it is, its tier, its commands."""

    page: Path
    line: int
    tier: str
    code: str
    preceding: str  # the page's text since the block before (where an admonition goes)


def shell_blocks(page: Path) -> list[ShellBlock]:
    """Every shell block of ``page``, in order, with the tier its marker gives."""
    lines = page.read_text().splitlines()
    blocks, n, since = [], 0, 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if not fence:
            n += 1
            continue
        indent, language = fence["indent"], fence["language"]
        end = n + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if language in SHELL_LANGUAGES:
            before = [line for line in lines[since:n] if line.strip()]
            marker = MARKER.match(before[-1]) if before else None
            code = "\n".join(line.removeprefix(indent) for line in lines[n + 1:end])
            blocks.append(ShellBlock(page, n + 1, marker["tier"] if marker else "short", code,
                                     "\n".join(lines[since:n])))
        since = n = end + 1
    return blocks


def _bash(blocks: list[ShellBlock], workdir: Path, timeout_s: float) -> tuple[str, str]:
    """Run ``blocks`` in order in one bash in ``workdir``; (script, failure or "")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQTTBED_")}
    # A user's defaults but two that change only when Spark works, never what a page prints
    # (tests/test_analysis_warm_up.py and tests/test_lifecycle.py test each by itself): the
    # warm-up analysis and each run's own analysis between runs held the tutorials' runs
    # ~230 s and more per CI run.
    env |= {"MQTTBED_SPARK_WARM_UP": "0", "MQTTBED_ANALYSIS_PER_RUN": "0"}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    script = "set -euo pipefail\n" + "\n".join(
        f"# {block.page.name}:{block.line}\n{block.code}" for block in blocks)
    result = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, text=True,
                            capture_output=True, timeout=timeout_s)
    failure = "" if result.returncode == 0 else (
        f"exit {result.returncode}:\n{script}\n--- stdout\n"
        f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    return script, failure


def _run_blocks(blocks: list[ShellBlock], workdir: Path, timeout_s: float,
                cleanup: list[ShellBlock] | None = None) -> None:
    """Run ``blocks`` in order in one bash, in ``workdir`` beside the repository's
    campaigns/ and .venv/ (the paths the tutorials use), with its own data dir; then the
    ``cleanup`` blocks in a bash of their own, whatever became of the others."""
    for name in ("campaigns", ".venv"):
        (workdir / name).symlink_to(ROOT / name)
    failure = cleanup_failure = ""
    try:
        _script, failure = _bash(blocks, workdir, timeout_s)
    finally:
        if cleanup:
            _script, cleanup_failure = _bash(cleanup, workdir, 60)
    assert not failure, f"a tutorial's shell blocks failed ({failure}"
    assert not cleanup_failure, f"a tutorial's cleanup blocks failed ({cleanup_failure}"


def _installed_packages() -> list[str]:
    """The venv's distributions and versions, as pip lists them: from the venv's folder,
    so that ``python -m`` does not put the checkout on the path, whose ``*.egg-info`` a build
    of the tree (tests/test_extras_install.py) rewrites."""
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                             "list", "--format=freeze"], capture_output=True, text=True,
                            check=True, timeout=120, cwd=Path(sys.executable).parent)
    return sorted(result.stdout.splitlines())


def test_every_tutorial_shell_block_runs_or_is_visibly_marked_as_needing_hardware():
    assert TUTORIALS, "docs/tutorials has no page"
    for page in TUTORIALS:
        blocks = shell_blocks(page)
        assert any(block.tier != "hardware" for block in blocks), (
            f"{page.name}: no block the test runs")
        for block in blocks:
            where = f"{page.name}:{block.line}"
            assert block.tier in TIERS, f"{where}: unknown docs-test marker {block.tier!r}"
            if block.tier == "hardware":
                assert '!!! warning "Needs hardware"' in block.preceding, (
                    f"{where}: a hardware block needs a visible 'Needs hardware' admonition "
                    "before it")


def test_setup_blocks_are_make_targets_make_accepts():
    setup = [block for page in TUTORIALS for block in shell_blocks(page)
             if block.tier == "setup"]
    assert setup, "no tutorial shows how to install (a `docs-test: setup` block)"
    for block in setup:
        for line in filter(None, (line.strip() for line in block.code.splitlines())):
            words = line.split()
            where = f"{block.page.name}:{block.line}: {line!r}"
            assert words[0] == "make" and len(words) == 2, (
                f"{where}: a setup block holds `make TARGET` lines only")
            # -n prints what the target would run and runs none of it (a sub-make
            # inherits -n); an unknown target or a broken rule fails
            done = subprocess.run(["make", "-n", words[1]], cwd=ROOT, capture_output=True,
                                  text=True, timeout=30)
            assert done.returncode == 0, f"{where}: {done.stderr[-1000:]}"


def test_shell_blocks_are_found_with_their_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n\n```sh\necho short\n```\n\n<!-- docs-test: system -->\n"
                    "```bash\necho long\n```\n\n```yaml\nnot: shell\n```\n\n"
                    '1. step\n\n   !!! warning "Needs hardware"\n       a Pi\n\n'
                    "   <!-- docs-test: hardware -->\n   ```\n   ssh pi\n   ```\n\n"
                    "<!-- docs-test: cleanup -->\n```sh\necho undo\n```\n")
    blocks = shell_blocks(page)
    assert [(b.tier, b.code) for b in blocks] == [
        ("short", "echo short"), ("system", "echo long"), ("hardware", "ssh pi"),
        ("cleanup", "echo undo")]


def test_cleanup_blocks_run_even_when_an_earlier_block_failed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: system -->\n```sh\ntouch made\nfalse\necho never\n```\n\n"
                    "<!-- docs-test: cleanup -->\n```sh\nrm made\ntouch cleaned\n```\n")
    blocks = shell_blocks(page)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with pytest.raises(AssertionError, match="shell blocks failed"):
        _run_blocks(blocks[:1], workdir, timeout_s=30, cleanup=blocks[1:])
    assert (workdir / "cleaned").exists() and not (workdir / "made").exists()


@pytest.mark.integration  # runs mqttbed commands
@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_short_shell_blocks_of_the_tutorial_run(page, tmp_path):
    blocks = [block for block in shell_blocks(page) if block.tier == "short"]
    if not blocks:
        pytest.skip(f"{page.name} has only long or hardware blocks")
    _run_blocks(blocks, tmp_path, timeout_s=100)


def _whole_tutorials() -> list[typing.Any]:
    """Every tutorial, as a parameter: one that installs a package (and so has a cleanup
    block) runs alone, the venv being the machine's; the others may run beside another
    system test (``parallel``: they check exit statuses and text, not times)."""
    return [pytest.param(page, id=page.stem, marks=[] if any(
        block.tier == "cleanup" for block in shell_blocks(page)) else [pytest.mark.parallel])
        for page in TUTORIALS]


@pytest.mark.integration
@pytest.mark.system  # whole campaigns, Spark analyses
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("page", _whole_tutorials())
def test_the_whole_tutorial_runs(page, tmp_path):
    blocks = [block for block in shell_blocks(page) if block.tier in ("short", "system")]
    cleanup = [block for block in shell_blocks(page) if block.tier == "cleanup"]
    if not any(block.tier == "system" for block in blocks):
        pytest.skip(f"{page.name} has no long block (its short ones run in make test)")
    before = _installed_packages()
    _run_blocks(blocks, tmp_path, timeout_s=1050, cleanup=cleanup)
    assert _installed_packages() == before, "the tutorial left the venv's packages changed"
