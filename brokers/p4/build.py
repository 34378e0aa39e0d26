"""Compiling the PAMS eBPF data plane (``ebpf/pams.bpf.c``) with clang ``-target bpf``.

Built on first use and again whenever the source is newer than the object, into
``build/`` beside the source (or a user cache when the package is read-only), under a
lock so two runs never race on one object file.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
from pathlib import Path

from mqttbed.core.errors import BackendError, MissingSystemDependency, system_deps_hint

SOURCE = Path(__file__).resolve().parent / "ebpf" / "pams.bpf.c"
INSTALL_HINT = ("install clang and libbpf's headers: "
                + system_deps_hint("network", "clang libbpf-dev"))
BUILD_TIMEOUT_S = 120


def build_dir() -> Path:
    """``build/`` beside the source if writable, else ``~/.cache/mqttbed/p4``."""
    local = SOURCE.parent / "build"
    if os.access(SOURCE.parent, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqttbed" / "p4"


def ensure_built() -> Path:
    """The path of an up-to-date ``pams.bpf.o``, compiling it if needed."""
    out_dir = build_dir()
    obj = out_dir / "pams.bpf.o"
    if obj.exists() and obj.stat().st_mtime >= SOURCE.stat().st_mtime:
        return obj
    if shutil.which("clang") is None or not Path("/usr/include/bpf/bpf_helpers.h").exists():
        raise MissingSystemDependency(f"building the PAMS data plane needs clang and "
                                      f"libbpf's headers; {INSTALL_HINT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _compile(obj)
    return obj


def _compile(obj: Path) -> None:
    # asm/types.h lives under the multiarch include directory on Debian.
    multiarch = f"/usr/include/{platform.machine()}-linux-gnu"
    argv = ["clang", "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", f"-I{multiarch}",
            "-c", str(SOURCE), "-o", str(obj.with_suffix(".tmp"))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise BackendError(f"building the PAMS data plane failed ({' '.join(argv)}):\n"
                           + done.stderr.strip())
    obj.with_suffix(".tmp").replace(obj)
