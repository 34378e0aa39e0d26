"""Building C code that ships as source with the system compiler and make, on first use.

A product (a broker binary, the agents' native engine library) is rebuilt whenever a file
it is built from is newer than it, so a checkout never runs stale C. Builds go to
``build/`` beside the sources, or to ``~/.cache/mqttbed/<cache_name>`` when the package
directory is read-only (an installed wheel). A lock file serialises concurrent builds (two
test workers, two runs, two agents on one machine).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mqttbed.core.errors import BackendError, MissingSystemDependency

BUILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class MakeProject:
    """C sources with a Makefile that takes ``BUILD=<dir>`` and one target per product."""

    name: str                   # what the messages call it: "mqttbed-forkpipe"
    source_dir: Path            # where the Makefile is
    patterns: tuple[str, ...]   # the files products are built from, relative globs
    cache_name: str             # its folder under the user cache when source_dir is read-only
    install_hint: str           # how to get a compiler, or what to do instead

    def sources(self) -> list[Path]:
        """Every file the products are built from (sources, headers, the Makefile)."""
        return sorted({path for pattern in self.patterns
                       for path in self.source_dir.glob(pattern)})

    def build_dir(self) -> Path:
        """``build/`` beside the sources if writable, else the user cache."""
        local = self.source_dir / "build"
        if os.access(self.source_dir, os.W_OK) and (not local.exists()
                                                    or os.access(local, os.W_OK)):
            return local
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        return cache / "mqttbed" / self.cache_name

    def is_stale(self, product: Path) -> bool:
        """True if ``product`` is missing or older than any file it is built from."""
        if not product.exists():
            return True
        built = product.stat().st_mtime
        return any(source.stat().st_mtime > built for source in self.sources())

    def missing_build_tool(self) -> str | None:
        """Why nothing can be built here (a tool not on PATH), or None if it can."""
        for tool in ("make", os.environ.get("CC", "cc")):
            if shutil.which(tool) is None:
                return (f"building {self.name} needs `{tool}`, which is not on PATH; "
                        f"{self.install_hint}")
        return None

    def ensure_built(self, target: str, product: Path) -> Path:
        """Return ``product`` up to date, running ``make <target>`` under the lock if not."""
        if not self.is_stale(product):
            return product
        if (missing := self.missing_build_tool()) is not None:
            raise MissingSystemDependency(missing)
        product.parent.mkdir(parents=True, exist_ok=True)
        with open(product.parent / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_stale(product):  # another process may have built it meanwhile
                self._run_make(target, product.parent)
        return product

    def _run_make(self, target: str, out_dir: Path) -> None:
        argv = ["make", "-C", str(self.source_dir), f"BUILD={out_dir}", target]
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"building {self.name} ({' '.join(argv)}) took more than "
                               f"{BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()[-30:]
            raise BackendError(f"building {self.name} failed ({' '.join(argv)}, exit "
                               f"{done.returncode}):\n" + "\n".join(output))


def compiler_version() -> str:
    """The first line of ``cc --version`` (recorded with what it built), or "unknown"."""
    try:
        done = subprocess.run([os.environ.get("CC", "cc"), "--version"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return next(iter(done.stdout.splitlines()), "unknown")
