"""Write the record of one quickstart-size run (one point of campaigns/quickstart.yaml, two
agents, a virtual scope) as the engine stores it: ``python capture_run_record.py OUT.json``.

``run_metadata_quickstart_scoped.json`` beside this file was written so by the engine of
commit 4abbbdd, before the record was typed; tests/test_run_record.py checks that such
rows still load.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from mqttbed.campaigns.spec import builtin_spec_path, parse_spec
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow
from mqttbed.core.settings import Settings


def main(out: Path) -> int:
    spec = yaml.safe_load(builtin_spec_path("quickstart").read_text())
    spec.pop("sweep")
    spec.update(repetitions=1, agents={"count": 2}, measurement={"scope": {
        "resource": "virtual", "dialect": "rigol-ds1000z", "acquisitions": 4,
        "channels": {"publisher": 1, "subscribers": {"first": 2, "last": 3}},
        "timebase_s_per_div": 0.001}})
    with tempfile.TemporaryDirectory() as tmp, \
            create_controller(Settings(data_dir=Path(tmp))) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(spec))
        status = controller.engine.run_campaign(campaign_id)
        with controller.sessions() as s:
            run = s.get(RunRow, f"{campaign_id}-r0000")
        if status != "done":
            print(f"the run ended {run.state}: {run.reason}", file=sys.stderr)
            return 1
        out.write_text(json.dumps(run.run_metadata, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
