"""Compiling mqttbed-forkpipe from its C sources with the system compiler and make.

The binary is built on first use and rebuilt whenever a source, header or the Makefile is
newer than it (:mod:`mqttbed.core.make_build` does the building: lock, staleness, build
directory or user cache).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from mqttbed.core import make_build
from mqttbed.core.errors import MissingSystemDependency, system_deps_hint

SOURCE_DIR = Path(__file__).resolve().parent
INSTALL_HINT = (f"install a C compiler and make: {system_deps_hint('build', 'gcc make libc6-dev')}"
                ", or set the broker option `binary`")
PROJECT = make_build.MakeProject(name="mqttbed-forkpipe", source_dir=SOURCE_DIR,
                                 patterns=("Makefile", "src/*.[ch]"), cache_name="forkpipe",
                                 install_hint=INSTALL_HINT)


class Variant(StrEnum):
    """Which build of the broker: plain, or with AddressSanitizer + UBSan."""

    RELEASE = "release"
    SANITIZED = "sanitized"

    @property
    def target(self) -> str:
        """The make target that builds this variant."""
        return "all" if self is Variant.RELEASE else "sanitize"

    @property
    def binary_name(self) -> str:
        """The file name of this variant's binary."""
        return "mqttbed-forkpipe" if self is Variant.RELEASE else "mqttbed-forkpipe-asan"


def sources() -> list[Path]:
    """Return every file the binary is built from (C sources, headers, the Makefile)."""
    return PROJECT.sources()


def build_dir() -> Path:
    """Return where builds go: ``build/`` beside the sources if writable, else a user cache."""
    return PROJECT.build_dir()


def is_stale(binary: Path) -> bool:
    """Return True if ``binary`` is missing or older than any file it is built from."""
    return PROJECT.is_stale(binary)


def ensure_built(variant: Variant = Variant.RELEASE) -> Path:
    """Return the path of an up-to-date binary of ``variant``, building it if needed."""
    binary = build_dir() / variant.binary_name
    if not is_stale(binary):
        return binary
    if (missing := missing_build_tool()) is not None:
        raise MissingSystemDependency(missing)
    return PROJECT.ensure_built(variant.target, binary)


def missing_build_tool() -> str | None:
    """Why the binary cannot be built here (a tool not on PATH), or None if it can."""
    return PROJECT.missing_build_tool()


compiler_version = make_build.compiler_version
