"""``python -m mqttbed.agents.native``: build the native load engine here, now, and say how
that went (one JSON line).

``mqttbed lab provision`` and ``lab upgrade`` run this on every agent host right after they
install mqttbed, so the C is compiled then, by the host's own compiler for its own CPU
(arm64 or armhf on a Pi), not when the host's first run starts; and a host that cannot
build it is known before any campaign: its agents will run the lean Python client, and
the host's facts (``native_engine``) say why. Prints ``{"state": "built", "library": ...,
"machine": ..., "seconds": ...}`` or ``{"state": "unavailable", "reason": ..., "seconds":
...}`` (seconds: to build, or to find the library built and current); exits 0 either way:
no engine is a fact of the host, not a failed install.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Any

from mqttbed.agents.native import engine


def build_report() -> dict[str, Any]:
    """Build (or find current) and load the engine; what happened (module docstring)."""
    started = time.monotonic()
    reason = engine.unavailable_reason()
    seconds = round(time.monotonic() - started, 2)
    if reason is not None:
        return {"state": "unavailable", "reason": reason, "seconds": seconds}
    return {"state": "built", "library": str(engine.library_path()),
            "machine": platform.machine(), "seconds": seconds}


if __name__ == "__main__":
    json.dump(build_report(), sys.stdout)
    sys.stdout.write("\n")
