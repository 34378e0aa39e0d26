"""A run partial's fingerprint covers the code its figures are computed by (no Spark here:
the figures themselves are checked in test_analytics_stats.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import mqttbed.analytics
import mqttbed.core
from mqttbed.analytics.partials import FINGERPRINTED_PACKAGES, code_digest


def test_the_fingerprinted_code_is_the_analysis_and_the_core_it_reads_events_with():
    assert set(FINGERPRINTED_PACKAGES) == {Path(mqttbed.analytics.__file__).parent,
                                           Path(mqttbed.core.__file__).parent}


def test_a_change_to_any_module_of_either_package_changes_the_digest(tmp_path):
    copies = [tmp_path / package.name for package in FINGERPRINTED_PACKAGES]
    for package, copy in zip(FINGERPRINTED_PACKAGES, copies, strict=True):
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = code_digest(copies)
    assert original == code_digest(FINGERPRINTED_PACKAGES)  # the copies are the code
    for copy in copies:
        module = copy / "events.py" if copy.name == "core" else copy / "passes.py"
        source = module.read_bytes()
        module.write_bytes(source + b"\n")
        assert code_digest(copies) != original, module
        module.write_bytes(source)
        assert code_digest(copies) == original
    # a module moved to the other package is other code too
    moved = copies[1] / "events.py"
    shutil.move(moved, copies[0] / "events.py")
    assert code_digest(copies) != original
