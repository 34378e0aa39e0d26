"""What the docs show is what the code takes: every campaign spec of the docs loads with the
real spec loader, and every ``mqttbed ...`` command written in them, in the prose or in a
block, has the subcommands, options and choices of the real parser."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.test_docs import FENCE, ROOT, SHELL_LANGUAGES

PAGES = sorted((ROOT / "docs").rglob("*.md"))
SPEC_LANGUAGES = {"yaml", "yml", "json"}
# A spec written in a shell block: `cat > NAME.yaml <<'SPEC'` ... `SPEC`.
HEREDOC = re.compile(r"<<-?\s*'?(?P<tag>\w+)'?[^\n]*\n(?P<body>.*?)\n\s*(?P=tag)\s*$",
                     re.DOTALL | re.MULTILINE)
# A page that writes a backend plug-in registers it: its specs for that backend load only
# once the page's own steps installed it (tests/test_docs.py runs them).
PLUGINS = re.compile(r'^\[project\.entry-points\."mqttbed\.backends"\]\n'
                     r"(?P<entries>(?:[\w-]+ *=.*\n)+)", re.MULTILINE)
INLINE = re.compile(r"(?<!`)`(?P<code>mqttbed [^`]+)`(?!`)")
# A command line in a block: `mqttbed ...`, `.venv/bin/mqttbed ...`, `$ mqttbed ...`.
BLOCK_COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:\S*/)?(?P<command>mqttbed\s.*)$")
# What a synopsis writes for a value to fill in: ID, URL, ID1, NAME..., <name>, ..., $var.
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_=-]*(\.\.\.|…)?|<[^>]+>|\.\.\.|…|\$.*|.*(\.\.\.|…)")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>"}


@dataclass(frozen=True)
class Block:
    """One fenced block of a docs page."""

    page: Path
    line: int
    language: str
    code: str


@dataclass(frozen=True)
class Command:
    """One ``mqttbed ...`` command written in the docs: in the prose, or a line of a block."""

    page: Path
    line: int
    text: str
    in_prose: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: `{self.text}`"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with its language and its first line's number."""
    lines = page.read_text().splitlines()
    found, n = [], 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if not fence:
            n += 1
            continue
        end = n + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(line.removeprefix(fence["indent"]) for line in lines[n + 1:end])
        found.append(Block(page, n + 1, fence["language"], code))
        n = end + 1
    return found


def prose(page: Path) -> Iterator[tuple[int, str]]:
    """The lines of ``page`` outside its fenced blocks, numbered."""
    inside = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            continue
        if not inside:
            yield number, line


# -- campaign specs ------------------------------------------------------------------------

def spec_texts(page: Path) -> Iterator[tuple[int, str]]:
    """Every campaign spec, or part of one, that ``page`` shows: a YAML or JSON block, or a
    heredoc of a shell block, whose top-level keys include a field of a campaign spec."""
    from mqttbed.campaigns.spec import CampaignSpec

    fields = {field.alias or name for name, field in CampaignSpec.model_fields.items()}
    plugins = {entry.split("=")[0].strip() for m in PLUGINS.finditer(page.read_text())
               for entry in m["entries"].splitlines()}
    for block in blocks(page):
        if block.language in SPEC_LANGUAGES:
            texts = [(block.line, block.code)]
        elif block.language in SHELL_LANGUAGES:
            texts = [(block.line + block.code[:m.start("body")].count("\n"), m["body"])
                     for m in HEREDOC.finditer(block.code)]
        else:
            continue
        for line, text in texts:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue  # a heredoc of something else than YAML
            if not isinstance(data, dict) or not set(data) & fields:
                continue
            broker = data.get("broker")
            if not (isinstance(broker, dict) and broker.get("backend") in plugins):
                yield line, text


def spec_problem(text: str) -> str:
    """Why ``text`` is not a valid campaign spec ("" if it is). A part of a spec without a
    name gets one; a spec named like a built-in campaign must be that campaign."""
    from mqttbed.campaigns.library import builtin_names
    from mqttbed.campaigns.spec import builtin_spec_path, load_spec, parse_spec
    from mqttbed.core.errors import SpecError

    data = yaml.safe_load(text)
    data.setdefault("name", "a-docs-example")
    try:
        spec = parse_spec(data)
    except (SpecError, ValueError) as exc:
        return str(exc)
    if spec.name in builtin_names() and spec != load_spec(builtin_spec_path(spec.name)):
        return (f"named {spec.name!r} like the built-in campaign, but not the same spec as "
                f"campaigns/{spec.name}.yaml (copy it again, or rename the example)")
    return ""


def test_every_campaign_spec_in_the_docs_loads_with_the_spec_loader():
    checked, problems = 0, []
    for page in PAGES:
        for line, text in spec_texts(page):
            checked += 1
            if problem := spec_problem(text):
                problems.append(f"{page.relative_to(ROOT)}:{line}: {problem}")
    assert checked >= 20, f"only {checked} campaign specs found in docs/: is the scan broken?"
    assert not problems, "campaign specs the spec loader refuses:\n" + "\n".join(problems)


def test_a_bad_spec_and_a_stale_copy_of_a_built_in_campaign_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```yaml\nworkload: {rate_hz: -5}\n```\n\n"
                    "```sh\ncat > q.yaml <<'SPEC'\nname: quickstart\nrepetitions: 2\nSPEC\n```\n"
                    "\n```yaml\nscrape_configs: [{job_name: mqttbed}]\n```\n")
    found = list(spec_texts(page))
    assert [line for line, _text in found] == [1, 6]
    assert "workload.rate_hz" in spec_problem(found[0][1])
    assert "not the same spec as campaigns/quickstart.yaml" in spec_problem(found[1][1])


# -- commands ------------------------------------------------------------------------------

def commands(page: Path) -> Iterator[Command]:
    """Every ``mqttbed ...`` command of ``page``: written inline in its prose, or as a line
    of a shell block or of a console transcript (``$ mqttbed ...``)."""
    for number, line in prose(page):
        for match in INLINE.finditer(line.replace("\\|", "|")):
            yield Command(page, number, match["code"], in_prose=True)
    for block in blocks(page):
        if block.language not in SHELL_LANGUAGES | {"text"}:
            continue
        for offset, line in enumerate(block.code.splitlines(), start=1):
            if block.language == "text" and not line.lstrip().startswith("$"):
                continue
            if match := BLOCK_COMMAND.match(line):
                yield Command(page, block.line + offset, match["command"], in_prose=False)


def words_of(command: Command) -> list[str]:
    """The words of a command line: brackets of optional parts dropped, comments left out,
    a shell line cut at its first operator (in prose, a lone ``|`` parts alternatives)."""
    text = command.text.replace("[", " ").replace("]", " ")
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote of a synopsis
        words = text.split()
    if not command.in_prose:
        cut = next((n for n, word in enumerate(words) if word in SHELL_OPERATORS), len(words))
        words = words[:cut]
    return [word for word in words if word != "|"]


def _placeholder(word: str) -> bool:
    return PLACEHOLDER.fullmatch(word) is not None


@dataclass
class Checked:
    """What walking a command through the parser found: its problems, and a broker model's
    own options, which only that model's parser knows (``mqttbed broker run NAME ...``)."""

    problems: list[str]
    handed_on: list[str] | None = None


def check_words(words: list[str], parser: argparse.ArgumentParser) -> Checked:
    """Walk ``words`` (``mqttbed`` first) through ``parser`` as argparse would: each
    subcommand must be one of its parser's, each option one its parser has, each value of a
    field with choices one of them (a placeholder such as ``ID`` stands for any value)."""
    from mqttbed.campaigns.library import builtin_names

    checked, path, given = Checked([]), [words[0]], []
    # argparse offers no public way to walk its tree: its _actions, as scripts/docs_reference.py
    positionals = [a for a in parser._actions if not a.option_strings]
    n, at = 1, 0
    while n < len(words):
        if at < len(positionals) and positionals[at].nargs == argparse.REMAINDER:
            checked.handed_on = [*path, *given, *words[n:]]  # a model's options, its parser's
            return checked
        word, n = words[n], n + 1
        if word.startswith("-") and not _placeholder(word):
            for name in (alt.split("=", 1)[0] for alt in word.split("|")):
                action = parser._option_string_actions.get(name)
                if action is None:
                    checked.problems.append(f"`{' '.join(path)}` has no option {name}")
                elif action.nargs != 0 and "=" not in word and n < len(words):  # a value
                    value, n = words[n], n + 1
                    checked.problems += _choice_problems(action, value, path)
            continue
        if at >= len(positionals):
            checked.problems.append(f"`{' '.join(path)}` takes no further word {word!r}")
            continue
        action = positionals[at]
        if isinstance(action, argparse._SubParsersAction):
            if _placeholder(word):
                return checked  # `mqttbed campaigns …`: which subcommand is left open
            names = word.split("|")
            unknown = [name for name in names if name not in action.choices]
            if unknown:
                checked.problems.append(
                    f"`{' '.join(path)}` has no subcommand {', '.join(unknown)} (it has "
                    f"{', '.join(action.choices)})")
                return checked
            parser, at, given = action.choices[names[0]], 0, []
            path.append(names[0])
            positionals = [a for a in parser._actions if not a.option_strings]
            continue
        given.append(word)
        checked.problems += _choice_problems(action, word, path)
        if action.dest == "spec" and not _placeholder(word):
            checked.problems += _spec_ref_problems(word, builtin_names())
        if action.nargs not in ("*", "+"):
            at += 1
    return checked


def _choice_problems(action: argparse.Action, value: str, path: list[str]) -> list[str]:
    if action.choices is None or _placeholder(value):
        return []
    return [f"`{' '.join(path)}` {'/'.join(action.option_strings) or action.dest} takes "
            f"{', '.join(map(str, action.choices))}, not {alt!r}"
            for alt in value.split("|") if alt not in action.choices]


def _spec_ref_problems(ref: str, builtins: list[str]) -> list[str]:
    """A spec a command names: a built-in campaign's name, or a file of the repository's
    campaigns/ (other paths are the reader's own files)."""
    if "/" not in ref and "." not in ref and ref not in builtins:
        return [f"no built-in campaign {ref!r} (built-in: {', '.join(builtins)})"]
    if ref.startswith("campaigns/") and not (ROOT / ref).is_file():
        return [f"{ref} is not a file of the repository"]
    return []


@functools.cache
def mqttbed_parser() -> argparse.ArgumentParser:
    """The real ``mqttbed`` parser, built once (parsing leaves it as it was)."""
    from mqttbed.controller.cli import build_parser

    return build_parser()


def parse_problem(words: list[str]) -> str:
    """For a command with nothing left to fill in: what the real parser says of its values
    ("" if it takes them), as ``mqttbed`` would print it."""
    if any(_placeholder(word) or "|" in word for word in words):
        return ""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            mqttbed_parser().parse_args(words[1:])
    except SystemExit as exc:
        if exc.code:  # --help and --version exit 0
            return stderr.getvalue().strip().splitlines()[-1]
    return ""


def command_problems(command: Command) -> Checked:
    """Everything wrong with ``command`` that the real parser knows of."""
    words = words_of(command)
    checked = check_words(words, mqttbed_parser())
    if not checked.problems and checked.handed_on is None:
        problem = parse_problem(words)
        # the prose names a command (`mqttbed run`) without the arguments it needs to run
        if problem and not (command.in_prose and "arguments are required" in problem):
            checked.problems.append(problem)
    return checked


def _every_command() -> list[Command]:
    return [command for page in PAGES for command in commands(page)]


def test_every_mqttbed_command_in_the_docs_is_one_the_real_parser_takes():
    found = _every_command()
    assert sum(command.in_prose for command in found) >= 40, "the prose's commands not found"
    assert sum(not command.in_prose for command in found) >= 25, "the blocks' not found"
    problems = [f"{command.where}: {problem}" for command in found
                for problem in command_problems(command).problems]
    assert not problems, "commands the docs show that mqttbed does not take:\n" + "\n".join(
        problems)


@pytest.mark.parametrize(("text", "in_prose", "problem"), [
    ("mqttbed campaign list", True, "has no subcommand campaign"),
    ("mqttbed run SPEC [--data-dir DIR] [--spark-mastr URL]", True, "no option --spark-mastr"),
    ("mqttbed token create --name N [--role user|admin]", True, "not 'admin'"),
    ("mqttbed run capacity-serch", True, "no built-in campaign 'capacity-serch'"),
    ("mqttbed run campaigns/quikstart.yaml | tee out.txt", False, "not a file"),
    ("mqttbed serve --port eighty", False, "invalid int value: 'eighty'"),
    ("mqttbed schema stats extra", True, "takes no further word 'extra'"),
])
def test_a_command_the_parser_does_not_take_is_named_with_why(text, in_prose, problem):
    command = Command(ROOT / "docs" / "page.md", 1, text, in_prose)
    assert any(problem in found for found in command_problems(command).problems), (
        command_problems(command).problems)


def test_synopses_pipes_and_placeholders_are_read_as_a_reader_reads_them():
    ok = ["mqttbed token revoke --id N | --name N", "mqttbed compact ID|latest [--data-dir D]",
          "mqttbed campaigns …", "mqttbed broker run <name>", "mqttbed lab upgrade [NAME...]",
          "mqttbed campaigns export ID --format csv|parquet [--out FILE]"]
    for text in ok:
        assert command_problems(Command(ROOT / "x.md", 1, text, True)).problems == [], text
    shell = Command(ROOT / "x.md", 1, 'mqttbed run mosquitto.yaml | tee "$out" # why', False)
    assert words_of(shell) == ["mqttbed", "run", "mosquitto.yaml"]


@pytest.mark.integration  # runs each broker model's own parser: `mqttbed broker run NAME --help`
def test_every_broker_model_option_in_the_docs_is_one_the_model_takes():
    from tests.docker_files import help_text

    handed_on = {tuple(checked.handed_on) for command in _every_command()
                 if (checked := command_problems(command)).handed_on}
    models = {words[:4] for words in handed_on if not _placeholder(words[3])}
    assert {("mqttbed", "broker", "run", "fpga"), ("mqttbed", "broker", "run", "mqtt-sn")} <= models
    known = {model: set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text(list(model))))
             for model in models}
    problems = [f"`{' '.join(words)}`: {word}" for words in handed_on if words[:4] in known
                for word in words[4:] if word.startswith("--") and word not in known[words[:4]]]
    assert not problems, "options the broker models do not have:\n" + "\n".join(problems)


# -- make demo -----------------------------------------------------------------------------

def test_make_demo_writes_where_report_latest_and_the_tutorial_look():
    from mqttbed.controller.cli import build_parser

    dry_run = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True,
                             timeout=30, check=True).stdout
    calls = {args.command: args for args in (
        build_parser().parse_args(shlex.split(line)[1:]) for line in dry_run.splitlines()
        if re.match(r"^\S*/mqttbed ", line))}
    assert set(calls) == {"run", "report"}, dry_run
    run, report = calls["run"], calls["report"]
    # The same data dir as each other, and as a bare `mqttbed report latest` (none given:
    # MQTTBED_DATA_DIR or ./data), so that what the tutorial says next finds the campaign.
    assert run.data_dir is None and report.data_dir is None, dry_run
    assert report.id == "latest"
    tutorial = (ROOT / "docs" / "tutorials" / "first-campaign.md").read_text()
    assert f"`{report.out}`" in tutorial, f"the tutorial does not say where {report.out} is"
