"""The docs site: it builds with no warning, and its generated reference leaves nothing out."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import typing
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
    # bounds come from the model's metadata: repetitions is 1 ... 10,000
    assert "| `repetitions` | integer | `1` | ≥ 1, ≤ 10000 |" in page


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
