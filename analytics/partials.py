"""A run's own figures, computed when the run ends and kept beside it.

Every figure of a campaign is a group of figure rows (:mod:`mqttbed.analytics.passes`)
at some level: a run's own level (``("run", run_id)``, its timeline bins too) or a sweep
point's, which pools the point's done runs. A run's own groups depend on nothing but that
run: its events, broker samples and backend records, what the controller knows of it
(:class:`~mqttbed.analytics.stats.RunInfo`) and the analysis code. So they are computed
once, when the run has ended (while the next one deploys), as a :class:`RunPartial`; the
campaign's analysis then aggregates only the pooled groups of its points and takes each
run's own groups from its partial. The document is the one a whole analysis gives: the
same counts and exact percentiles and sketches, and sums and moments up to the order
Spark adds them in.

A partial is used only while its *fingerprint* holds: the analysis code (every module
of this package and of :mod:`mqttbed.core`, which defines the events it reads), the run's
RunInfo, the section types asked for, and the name, size and modification time of each
of the run's data files. Anything else (a stale, foreign or unreadable partial) is
ignored and the run's groups are computed with the pooled ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import mqttbed.core
from mqttbed.analytics.datasets import run_files_signature
from mqttbed.analytics.figures import RUN_LEVEL
from mqttbed.analytics.passes import Aggregate, GroupKey

# the layout of a partial's JSON; a partial of another version is not read
PARTIAL_FORMAT = 1
# the packages a run's own figures are computed by: this one, and mqttbed.core (the
# events' kinds and clocks, backend sections, withholding), whose code is fingerprinted
FINGERPRINTED_PACKAGES = (Path(__file__).parent, Path(mqttbed.core.__file__).parent)


@dataclass(frozen=True)
class RunPartial:
    """One run's own figure groups (its level and its timeline), with their fingerprint."""

    run_id: str
    fingerprint: str
    groups: dict[GroupKey, Aggregate]

    def to_json(self) -> dict[str, Any]:
        """The partial as a JSON document (floats round-trip exactly through ``json``)."""
        return {"format": PARTIAL_FORMAT, "run_id": self.run_id,
                "fingerprint": self.fingerprint,
                "groups": [{"key": list(key), **dataclasses.asdict(found)}
                           for key, found in self.groups.items()]}

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> RunPartial:
        """The partial of :meth:`to_json`; ValueError for another format."""
        if document.get("format") != PARTIAL_FORMAT:
            raise ValueError(f"a run partial of format {document.get('format')!r}; this "
                             f"version reads format {PARTIAL_FORMAT}")
        groups: dict[GroupKey, Aggregate] = {}
        for entry in document["groups"]:   # read, not consumed: the caller's document stays
            fields = dict(entry)
            family, level, key, sub, figure = fields.pop("key")
            groups[(family, level, key, sub, figure)] = Aggregate(**fields)
        return cls(run_id=str(document["run_id"]), fingerprint=str(document["fingerprint"]),
                   groups=groups)


def own_groups(groups: Mapping[GroupKey, Aggregate], run_id: str
               ) -> dict[GroupKey, Aggregate]:
    """The groups of ``run_id``'s own level among ``groups`` (timeline bins included)."""
    return {key: found for key, found in groups.items()
            if key[1] == RUN_LEVEL and key[2] == run_id}


def run_fingerprint(run_info: Any, data: Sequence[tuple[Path, str]],
                    section_types: Sequence[str]) -> str:
    """The fingerprint of a run's own figures: a SHA-256 over the analysis code, the
    run's ``RunInfo``, the section types and the run's files in each ``(dataset root,
    campaign id)`` of ``data``."""
    digest = hashlib.sha256(_code_digest())
    digest.update(json.dumps(dataclasses.asdict(run_info), sort_keys=True,
                             default=str).encode())
    digest.update(json.dumps(sorted(section_types)).encode())
    for root, campaign_id in data:
        digest.update(json.dumps([str(root.name),
                                  run_files_signature(root, campaign_id, run_info.run_id)])
                      .encode())
    return digest.hexdigest()


def code_digest(packages: Sequence[Path]) -> bytes:
    """A digest of every module (``*.py``) of each package folder, by package and name."""
    digest = hashlib.sha256()
    for package in packages:
        for module in sorted(package.glob("*.py")):
            digest.update(f"{package.name}/{module.name}".encode() + b"\0"
                          + module.read_bytes())
    return digest.digest()


@cache
def _code_digest() -> bytes:
    """The digest of the FINGERPRINTED_PACKAGES: a partial of other code is stale."""
    return code_digest(FINGERPRINTED_PACKAGES)
