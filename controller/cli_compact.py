"""``mqttbed compact``: compact a campaign's ended runs, e.g. one stored before runs were
compacted as they ended (its chunk files load as they are; compacted, Spark reads one
file per run instead of hundreds)."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add the ``compact`` command to the ``mqttbed`` parser."""
    compact = commands.add_parser(
        "compact", help="compact a campaign's ended runs: each run's chunk files become one "
                        "verified Parquet file (done as each run ends; this is for campaigns "
                        "stored before that, or a compaction that failed)")
    compact.add_argument("id", help="campaign id, or 'latest'")
    compact.add_argument("--data-dir", help="default: MQTTBED_DATA_DIR or ./data")
    compact.set_defaults(func=_compact)


def _compact(args: argparse.Namespace) -> int:
    from mqttbed.controller.cli import _campaign_id
    from mqttbed.controller.compaction import compact_run
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.db import RunRow
    from mqttbed.controller.states import TERMINAL_STATES
    from mqttbed.core.settings import Settings

    controller = create_controller(Settings.from_env(args.data_dir), controller_url="")
    try:
        campaign_id = _campaign_id(controller, args.id, "compact")
        with controller.sessions() as s:
            runs = [(run.id, run.state) for run in s.query(RunRow).filter_by(
                campaign_id=campaign_id).order_by(RunRow.ordinal, RunRow.attempt)]
        compacted = 0
        for run_id, state in runs:
            if state not in TERMINAL_STATES:
                print(f"{run_id}: {state}, not ended: left as it is")
                continue
            for done in compact_run(controller.layout, campaign_id, run_id):
                compacted += 1
                print(f"{run_id}: {done.dataset}: {done.inputs} files, {done.rows} rows "
                      f"-> 1 file, {done.bytes_written} bytes, {done.seconds:.2f} s")
    finally:
        controller.close()
    print(f"{campaign_id}: {compacted} partitions compacted "
          f"({len(runs)} runs; the others had nothing to compact)")
    return 0
