"""The docs site's Reference pages, generated from the code when the site is built.

A MkDocs hook (``hooks:`` in mkdocs.yml): ``on_files`` adds the pages below as generated
files, so nothing in Reference is written by hand and none of it can drift from the code.

- ``reference/spec.md``: every campaign-spec field from the pydantic models in
  ``campaigns/spec.py``, and every backend's ``broker:`` options model from its
  ``BackendDeclaration`` (``core/backends.py``);
- ``reference/cli.md``: every ``mqttbed`` command from the argparse parser;
- ``reference/rest-api.md`` (+ ``openapi.json``): the FastAPI app's OpenAPI document;
- ``reference/results.md``: the results document (``stats.json``) from its JSON schema;
- ``reference/settings.md``: the ``MQTTBED_*`` settings from ``core/settings.py``;
- ``reference/event-columns.md``: the events dataset's columns (``core/events.py``, their
  text in ``mqttbed/results.py``);
- ``reference/stats-columns.md``: ``stats.parquet``'s columns, from the results model.

``python scripts/docs_reference.py OUT_DIR`` writes the same pages to a folder.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

GENERATED_NOTE = ("!!! note \"Generated\"\n    This page is generated from the code when the "
                  "site is built (`scripts/docs_reference.py`); change the code, not the page.\n")

# Bounds pydantic keeps in a field's metadata (annotated_types), as the page shows them.
_BOUND_SYMBOLS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "min length",
                  "max_length": "max length", "multiple_of": "multiple of"}


# ---------------------------------------------------------------------------------------
# pydantic models: the campaign spec, backend options, settings


def _cell(text: str) -> str:
    """Text that fits in one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    """A field's type as a reader writes it in YAML terms (models by their class name)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple, set, frozenset):
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"list[{inner}]"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]"
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " | ".join(json.dumps(m.value) for m in annotation)
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "Path": "path", "Any": "any"}.get(annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(its own defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value, default=str)}`"


def _bounds(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        for attribute, symbol in _BOUND_SYMBOLS.items():
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{symbol} {value}")
        if getattr(item, "pattern", None):
            found.append(f"matches `{item.pattern}`")
    return ", ".join(found)


def _nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg)


def model_fields(model: type[BaseModel]) -> Iterator[tuple[type[BaseModel], str, FieldInfo]]:
    """Every (model, field name, field) of ``model`` and the models its fields hold, each
    model once, depth first in declaration order."""
    seen: set[type[BaseModel]] = set()

    def walk(current: type[BaseModel]) -> Iterator[tuple[type[BaseModel], str, FieldInfo]]:
        if current in seen:
            return
        seen.add(current)
        for name, field in current.model_fields.items():
            yield current, name, field
        for field in current.model_fields.values():
            for nested in _nested_models(field.annotation):
                yield from walk(nested)

    yield from walk(model)


def _model_tables(model: type[BaseModel], path_of: dict[type[BaseModel], str],
                  heading: str = "###") -> str:
    """One table per model reachable from ``model``: field, type, default, bounds, what."""
    out: list[str] = []
    current: type[BaseModel] | None = None
    for owner, name, field in model_fields(model):
        if owner is not current:
            current = owner
            where = path_of.get(owner, owner.__name__)
            doc = (owner.__doc__ or "").strip().split("\n\n")[0]
            out += ["", f"{heading} `{where}`", ""]
            if doc:
                out += [" ".join(doc.split()).replace("``", "`"), ""]
            out += ["| field | type | default | bounds | description |",
                    "| --- | --- | --- | --- | --- |"]
        key = field.alias or name
        out.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | "
                   f"{_cell(_default(field))} | {_cell(_bounds(field))} | "
                   f"{_cell(field.description or '')} |")
    return "\n".join(out)


def _paths(model: type[BaseModel], prefix: str) -> dict[type[BaseModel], str]:
    """Each nested model's dotted path in the spec (its first occurrence)."""
    found: dict[type[BaseModel], str] = {model: prefix or model.__name__}

    def walk(current: type[BaseModel], at: str) -> None:
        for name, field in current.model_fields.items():
            for nested in _nested_models(field.annotation):
                if nested not in found:
                    found[nested] = f"{at}.{name}" if at else name
                    walk(nested, found[nested])

    walk(model, prefix)
    return found


def spec_page() -> str:
    """The campaign spec: every field of every model, then each backend's options."""
    from mqttbed.campaigns.spec import CampaignSpec
    from mqttbed.core import backends

    lines = ["# Campaign spec", "", GENERATED_NOTE,
             "A campaign spec is YAML or JSON. Unknown keys are refused; each bad value is "
             "refused naming its field and value, before anything runs. The top level is "
             "`CampaignSpec`; each nested section is listed by its path in the spec.", "",
             "## The spec", _model_tables(CampaignSpec, _paths(CampaignSpec, "")), "",
             "## Broker backends", "",
             "`broker.backend` names the backend; the rest of the `broker:` section is that "
             "backend's options model, below (built in, or registered by an installed "
             "package in the `mqttbed.backends` entry-point group).", ""]
    for name in backends.backend_names():
        declared = backends.declaration(name)
        lines += [f"### `{name}`", "", _cell(declared.summary).replace("``", "`"), ""]
        qos = ", ".join(str(q) for q in declared.features.qos) if hasattr(
            declared.features, "qos") else ""
        if qos:
            lines += [f"QoS delivered: {qos}.", ""]
        if declared.placements:
            lines += ["Placements (`workload.placement`): "
                      + ", ".join(f"`{p}`" for p in declared.placements) + ".", ""]
        lines.append(_model_tables(declared.options,
                                   _paths(declared.options, "broker"), heading="####"))
        lines.append("")
    return "\n".join(lines) + "\n"


def settings_page() -> str:
    """Every ``MQTTBED_*`` setting of the controller, the API client and the agent."""
    from mqttbed.core.settings import ENV_PREFIX, AgentSettings, ClientSettings, Settings

    lines = ["# Settings", "", GENERATED_NOTE,
             "Every setting is a `MQTTBED_*` environment variable, also read from a `.env` "
             "file in the working directory (the environment wins over the file, a "
             "command-line option over both). A bad value stops the command with the "
             "variable and the value: `mqttbed analyze: bad setting: "
             "MQTTBED_SPARK_DRIVER_MEMORY: expected a JVM memory size such as 512m or 2g "
             "(got '2 GB')`. Command-line options that set the same thing (`--data-dir`, "
             "`--spark-master`, `--ca-file`, `--tls-cert`, `--tls-key`: see the "
             "[command line](cli.md)) win over both.", ""]
    for model in (Settings, ClientSettings, AgentSettings):
        doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
        lines += [f"## {model.__name__}", "", doc, "",
                  "| variable | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            lines.append(f"| `{ENV_PREFIX}{name.upper()}` | {_cell(_type_name(field.annotation))}"
                         f" | {_cell(_default(field))} | {_cell(field.description or '')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# argparse: the CLI


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse offers no public way to walk its tree
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _cli_section(parser: argparse.ArgumentParser, words: list[str], help_text: str,
                 out: list[str]) -> None:
    level = "#" * min(len(words) + 1, 4)
    out += [f"{level} `{' '.join(words)}`", ""]
    described = help_text or parser.description or ""
    if described:
        out += [" ".join(described.split()).replace("%%", "%"), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(action.option_strings) or action.dest
        if action.help == argparse.SUPPRESS:
            continue
        default = ("" if action.default in (None, False, argparse.SUPPRESS) or
                   not action.option_strings else f"`{action.default}`")
        described = (action.help or "").replace("%(default)s", str(action.default))
        rows.append(f"| `{name}` | {_cell(described.replace('%%', '%'))} | {_cell(default)} |")
    if rows:
        out += ["| argument | what | default |", "| --- | --- | --- |", *rows, ""]
    for name, child in _subparsers(parser).items():
        _cli_section(child, [*words, name], _help_of(parser, name), out)


def cli_page() -> str:
    """Every command, subcommand and option of ``mqttbed``, from its argparse parser."""
    from mqttbed.controller.cli import build_parser

    out = ["# Command line", "", GENERATED_NOTE]
    _cli_section(build_parser(), ["mqttbed"], "", out)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# The REST API and the results document: JSON schemas


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the app ``mqttbed serve`` serves (over a throwaway data dir:
    building the app creates the controller's database)."""
    from mqttbed.api.app import create_app
    from mqttbed.core.settings import Settings

    with tempfile.TemporaryDirectory(prefix="mqttbed-docs-") as data_dir:
        app = create_app(Settings(data_dir=Path(data_dir)), run_campaigns=False)
        document: dict[str, Any] = app.openapi()
    return document


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " | ".join(_schema_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list[{_schema_type(schema.get('items', {}))}]"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map[string, {_schema_type(schema['additionalProperties'])}]"
    return str(kind)


def _schema_tables(definitions: dict[str, dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for name, schema in definitions.items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [" ".join(schema["description"].split()), ""]
        properties = schema.get("properties", {})
        if not properties:
            out += [f"Type: {_schema_type(schema)}.", ""]
            continue
        required = set(schema.get("required", ()))
        out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
        for field, spec in properties.items():
            out.append(f"| `{field}` | {_cell(_schema_type(spec))} | "
                       f"{'yes' if field in required else ''} | "
                       f"{_cell(spec.get('description', spec.get('title', '')))} |")
        out.append("")
    return out


def rest_api_page(document: dict[str, Any]) -> str:
    """Every route of the OpenAPI document, then its schemas."""
    out = ["# REST API", "", GENERATED_NOTE,
           " ".join(document["info"].get("description", "").split()), "",
           "The whole document: [openapi.json](openapi.json) (a running controller serves it "
           "at `/openapi.json`, and its interactive form at `/docs`).", "", "## Routes", ""]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            out += [f"### `{method.upper()} {path}`", ""]
            summary = operation.get("description") or operation.get("summary") or ""
            if summary:
                out += [" ".join(summary.split()), ""]
            params = operation.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required |", "| --- | --- | --- | --- |"]
                out += [f"| `{p['name']}` | {p['in']} | {_cell(_schema_type(p.get('schema', {})))}"
                        f" | {'yes' if p.get('required') else ''} |" for p in params]
                out.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out += [f"Body ({media}): {_schema_type(content.get('schema', {}))}", ""]
            responses = operation.get("responses", {})
            if responses:
                out += ["Responses: " + "; ".join(
                    f"{code} {_cell(r.get('description', ''))}" for code, r in responses.items()),
                    ""]
    out += ["## Schemas", ""]
    out += _schema_tables(document.get("components", {}).get("schemas", {}))
    return "\n".join(out) + "\n"


def results_page() -> str:
    """The results document (``stats.json``), from the JSON schema of its model."""
    from mqttbed.controller.analysis import results_type

    schema = results_type().model_json_schema()
    definitions = {schema.get("title", "CampaignStats"): {
        key: value for key, value in schema.items() if key != "$defs"}}
    definitions.update(schema.get("$defs", {}))
    out = ["# Results document", "", GENERATED_NOTE,
           "A campaign's results (`stats.json`, `GET /api/v1/campaigns/{id}/stats`) are one "
           "typed document; its JSON schema is served at `GET /api/v1/schemas/stats`, printed "
           "by `mqttbed schema stats` and kept in [stats.schema.json](../stats.schema.json). "
           "What the figures mean: [metric definitions](../explanation/metrics.md).", "",
           "## Types", ""]
    out += _schema_tables(definitions)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# The columns of the Parquet files: the events dataset and stats.parquet

# What a statistic's leaf name means, for stats.parquet columns whose field has no text.
_STATISTICS = {"count": "values the statistics are taken over", "mean": "mean",
               "std": "sample standard deviation (n - 1)", "p50": "median (50th percentile)",
               "p90": "90th percentile", "p99": "99th percentile", "p999": "99.9th percentile",
               "max": "maximum", "min": "minimum"}


def event_columns_page() -> str:
    """The events dataset's columns: names and types from core.events, text from
    mqttbed.results (which a test holds to the same names)."""
    from mqttbed.core.events import EVENT_FIELDS, PARTITION_COLUMNS
    from mqttbed.results import EVENT_COLUMN_DOCS

    lines = ["# Event columns", "", GENERATED_NOTE,
             "Every run's events are one Parquet dataset, `DATA/events/campaign_id=C/"
             "run_id=R/*.parquet` ([data layout](data-layout.md)): one row per publish, "
             "delivery and subscription. `mqttbed.results.Results.events()` opens it as a "
             "pyarrow dataset with both partition columns ([results in Python]"
             "(../how-to/results-in-python.md)). Times are nanoseconds of the recording agent's "
             "CLOCK_MONOTONIC, as recorded: `t - clock_offset_ns` puts one on the controller's "
             "clock ([timing and clocks](../explanation/timing.md)).", "",
             "| column | type | null | description |", "| --- | --- | --- | --- |"]
    for name, kind, nullable in EVENT_FIELDS:
        lines.append(f"| `{name}` | {kind} | {'yes' if nullable else ''} | "
                     f"{_cell(EVENT_COLUMN_DOCS[name])} |")
    for name in PARTITION_COLUMNS:
        lines.append(f"| `{name}` | string (partition) | | {_cell(EVENT_COLUMN_DOCS[name])} |")
    return "\n".join(lines) + "\n"


def stats_columns_page() -> str:
    """``stats.parquet``'s columns, from the results model (analytics.results_files)."""
    from mqttbed.analytics.results_files import stats_columns
    from mqttbed.controller.analysis import results_type

    lines = ["# stats.parquet columns", "", GENERATED_NOTE,
             "`DATA/campaigns/C/stats.parquet` is the [results document](results.md) "
             "(`stats.json`) flattened: one row per sweep point and per run (column `level`), "
             "and one per stream of a message mix (`point_stream`, `run_stream`). A nested "
             "block's fields are joined with `_` (`latency_us.p99` is `latency_us_p99`), an "
             "interval is two columns (`_lo`, `_hi`), mappings and lists are JSON text. The "
             "columns and their types come from the model, so they are the same in every "
             "campaign, filled or not. `mqttbed.results.Results.points()` and `.runs()` give "
             "one level's rows as a pandas DataFrame ([results in Python]"
             "(../how-to/results-in-python.md)); what each figure means: [metric "
             "definitions](../explanation/metrics.md).", "",
             "| column | type | levels | in stats.json | description |",
             "| --- | --- | --- | --- | --- |"]
    for column in stats_columns(results_type()):
        leaf = column.path.rsplit(".", 1)[-1].split("[")[0]
        text = column.description or _STATISTICS.get(leaf, "")
        if column.path.endswith("[0]"):
            text = f"lower end of the interval: {text}".rstrip(": ")
        elif column.path.endswith("[1]"):
            text = f"upper end of the interval: {text}".rstrip(": ")
        lines.append(f"| `{column.name}` | {column.kind} | {', '.join(column.levels)} | "
                     f"`{column.path}` | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every generated file: its path under docs/ and its content."""
    document = openapi_document()
    return {
        "reference/spec.md": spec_page(),
        "reference/cli.md": cli_page(),
        "reference/rest-api.md": rest_api_page(document),
        "reference/openapi.json": json.dumps(document, indent=2) + "\n",
        "reference/results.md": results_page(),
        "reference/settings.md": settings_page(),
        "reference/event-columns.md": event_columns_page(),
        "reference/stats-columns.md": stats_columns_page(),
    }


# ---------------------------------------------------------------------------------------
# The MkDocs hook


def on_files(files: Any, config: Any) -> Any:
    """Add the generated Reference pages to the site's files."""
    from mkdocs.structure.files import File

    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "build/reference")
    for path, content in pages().items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(content)
        print(target / path)
