"""The built-in campaign library: the YAML specs shipped in this package, found by name.

``mqttbed run NAME`` and ``mqttbed validate NAME`` take a file or a library name; a path
that exists wins, so a file called ``quickstart`` in the working directory is still run
as that file.
"""

from __future__ import annotations

from pathlib import Path

from mqttbed.campaigns.spec import builtin_spec_path
from mqttbed.core.errors import SpecError

LIBRARY = Path(__file__).parent


def builtin_names() -> list[str]:
    """The names of the built-in campaigns, sorted (``quickstart``, ``capacity-search``, ...)."""
    return sorted(path.stem for path in LIBRARY.glob("*.yaml"))


def spec_path(ref: str | Path) -> Path:
    """The spec file ``ref`` names: an existing file, else a built-in campaign's file.

    Neither raises :class:`SpecError` naming ``ref`` and the built-in names, so a typo in a
    name and a missing file both read as what they are.
    """
    path = Path(ref)
    if path.is_file():
        return path
    text = str(ref)
    looks_like_name = (path.name == text and not path.suffix)
    if looks_like_name and text in builtin_names():
        return builtin_spec_path(text)
    if looks_like_name:
        raise SpecError(f"campaign spec {text!r}: no such file here, and no built-in campaign "
                        f"of that name; built-in: {', '.join(builtin_names())}")
    raise SpecError(f"campaign spec file {text!r} does not exist (a built-in campaign is "
                    f"named without a folder or suffix: {', '.join(builtin_names())})")
