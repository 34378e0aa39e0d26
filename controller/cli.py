"""The ``mqttbed`` command line.

Subcommands import what they need when they run, so ``mqttbed agent`` on a Pi needs only
the agent extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mqttbed.campaigns.spec import load_spec
    from mqttbed.controller.analysis import analyze_campaign
    from mqttbed.controller.embedded_controller import EmbeddedController
    from mqttbed.controller.engine import RunUpdate
    from mqttbed.controller.states import TERMINAL_STATES
    from mqttbed.core.errors import MqttbedError
    from mqttbed.core.settings import Settings

    console = Console(stderr=True)
    try:
        spec = load_spec(args.spec)
    except MqttbedError as exc:
        console.print(f"[red]invalid campaign spec {args.spec}:[/red] {exc}")
        return 2
    settings = Settings.from_env(args.data_dir, args.spark_master)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console)
    task = progress.add_task(spec.name, total=None)
    failures: list[str] = []

    def show(update: RunUpdate) -> None:
        params = ", ".join(f"{k}={v}" for k, v in update.params.items()) or "-"
        progress.update(task, total=update.total,
                        description=f"{spec.name} run {update.ordinal + 1}/{update.total} "
                                    f"[{params} rep {update.repetition}] {update.state}")
        if update.state in TERMINAL_STATES:
            progress.advance(task)
        if update.reason:
            failures.append(f"run {update.run_id} {update.state}: {update.reason}")
            progress.console.print(f"[yellow]run {update.run_id} {update.state}:[/yellow] "
                                   f"{update.reason}")

    with EmbeddedController(settings, listeners=[show]) as controller:
        campaign_id = controller.engine.create_campaign(spec)
        with progress:
            status = controller.engine.run_campaign(campaign_id)
        console.print(f"campaign {campaign_id} {status}; computing statistics with Spark ...")
        stats, json_path, _ = analyze_campaign(controller.sessions, controller.layout,
                                               campaign_id, settings.spark_master)
    print_points(stats)
    print(f"dataset: {controller.layout.events / f'campaign_id={campaign_id}'}")
    print(f"stats:   {json_path}")
    return 0 if status == "done" else 1


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


def print_points(stats: dict[str, Any]) -> None:
    """Print one table row per sweep point to stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{stats['campaign']['name']} ({stats['campaign']['id']})")
    for column in ("point", "backend", "runs", "latency p50 µs", "latency p99 µs",
                   "spread p50 µs", "spread p99 µs", "received", "lost"):
        table.add_column(column, justify="left" if column in ("point", "backend") else "right")
    for point in stats["points"]:
        params = ", ".join(f"{k}={v}" for k, v in point["params"].items()) or "(no sweep)"
        latency, spread = point["latency_us"], point["sync_spread_us"]
        runs = f"{point['runs']}" + (f" (+{point['runs_failed']} failed)"
                                     if point.get("runs_failed") else "")
        table.add_row(params, point["backend"], runs, _us(latency["p50"]), _us(latency["p99"]),
                      _us(spread["p50"]), _us(spread["p99"]),
                      f"{point['deliveries_received']}/{point['deliveries_expected']}",
                      str(point["lost"]))
    Console(width=160).print(table)


def _agent(args: argparse.Namespace) -> int:
    from mqttbed.agents.main import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqttbed", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a campaign with an embedded controller")
    run.add_argument("spec", type=Path, help="campaign spec (YAML or JSON)")
    run.add_argument("--data-dir", help="where the database, dataset and stats go "
                                        "(default: MQTTBED_DATA_DIR or ./data)")
    run.add_argument("--spark-master", help="Spark master URL (default: MQTTBED_SPARK_MASTER "
                                            "or local[*])")
    run.set_defaults(func=_run)

    agent = commands.add_parser("agent", help="run an agent that obeys a controller")
    from mqttbed.agents.main import build_parser as agent_options

    agent_options(agent)
    agent.set_defaults(func=_agent)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
