"""Compiling mqttbed-forkpipe from its C sources with the system compiler and make.

The binary is built on first use and rebuilt whenever a source, header or the Makefile is
newer than it, so a checkout never runs a stale broker. Builds go to ``build/`` beside the
sources, or to ``~/.cache/mqttbed/forkpipe`` when the package directory is read-only (an
installed wheel). A lock file serialises concurrent builds (two test workers, two runs).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from enum import StrEnum
from pathlib import Path

from mqttbed.core.errors import BackendError, MissingSystemDependency

SOURCE_DIR = Path(__file__).resolve().parent
INSTALL_HINT = ("install a C compiler and make (`apt-get install gcc make`, or `make install` "
                "in the mqttbed checkout), or set the broker option `binary`")
BUILD_TIMEOUT_S = 300


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
    return sorted([SOURCE_DIR / "Makefile", *(SOURCE_DIR / "src").glob("*.[ch]")])


def build_dir() -> Path:
    """Return where builds go: ``build/`` beside the sources if writable, else a user cache."""
    local = SOURCE_DIR / "build"
    if os.access(SOURCE_DIR, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqttbed" / "forkpipe"


def is_stale(binary: Path) -> bool:
    """Return True if ``binary`` is missing or older than any file it is built from."""
    if not binary.exists():
        return True
    built = binary.stat().st_mtime
    return any(source.stat().st_mtime > built for source in sources())


def ensure_built(variant: Variant = Variant.RELEASE) -> Path:
    """Return the path of an up-to-date binary of ``variant``, building it if needed."""
    out_dir = build_dir()
    binary = out_dir / variant.binary_name
    if not is_stale(binary):
        return binary
    if (missing := missing_build_tool()) is not None:
        raise MissingSystemDependency(missing)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_stale(binary):  # another process may have built it while we waited
            _run_make(variant, out_dir)
    return binary


def missing_build_tool() -> str | None:
    """Why the binary cannot be built here (a tool not on PATH), or None if it can."""
    for tool in ("make", os.environ.get("CC", "cc")):
        if shutil.which(tool) is None:
            return f"building mqttbed-forkpipe needs `{tool}`, which is not on PATH; {INSTALL_HINT}"
    return None


def _run_make(variant: Variant, out_dir: Path) -> None:
    argv = ["make", "-C", str(SOURCE_DIR), f"BUILD={out_dir}", variant.target]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise BackendError(f"building mqttbed-forkpipe ({' '.join(argv)}) took more than "
                           f"{BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-30:]
        raise BackendError(f"building mqttbed-forkpipe failed ({' '.join(argv)}, exit "
                           f"{done.returncode}):\n" + "\n".join(output))


def compiler_version() -> str:
    """Return the first line of ``cc --version`` (recorded with each deploy), or "unknown"."""
    try:
        done = subprocess.run([os.environ.get("CC", "cc"), "--version"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return next(iter(done.stdout.splitlines()), "unknown")
