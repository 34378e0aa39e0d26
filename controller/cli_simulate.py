"""``mqttbed simulate ...``: the seed papers' simulations, run here without Spark."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqttbed.analytics.cloud_edge_results import CloudEdgeSimulation


def non_negative_int(text: str) -> int:
    """An argparse type: an integer ≥ 0 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more, got 0")
    return value


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` command group to the ``mqttbed`` parser."""
    group = commands.add_parser("simulate", help="the seed papers' simulations (no broker, "
                                                 "no Spark)")
    simulations = group.add_subparsers(dest="simulation", required=True)
    cloud_edge = simulations.add_parser(
        "cloud-edge", help="the cloud-edge paper's withholding policies (Figs. 8 and 9)",
        description="Mean latency of 1 MB messages under no withholding, the conservative, "
                    "probabilistic (good and bad λ) and historic policies, and the "
                    "clairvoyant bound, over threshold_l and the RTT query period TQ.")
    cloud_edge.add_argument("--seed", type=non_negative_int, default=0,
                            help="seed of the RTT trace (default: 0)")
    cloud_edge.add_argument("--units", type=positive_int, default=5000,
                            help="time units of 1 s to simulate (default: 5000, the paper's)")
    cloud_edge.add_argument("--json", action="store_true",
                            help="print the results document as JSON instead of tables")
    cloud_edge.set_defaults(func=_cloud_edge)


def _cloud_edge(args: argparse.Namespace) -> int:
    from mqttbed.analytics.cloud_edge_sim import CloudEdgeScenario, simulate

    try:
        scenario = CloudEdgeScenario(units=args.units)
    except ValueError as exc:  # too few units for one message
        raise SystemExit(f"mqttbed simulate cloud-edge: --units: {exc}") from None
    result = simulate(seed=args.seed, scenario=scenario)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print_cloud_edge(result)
    return 0


def print_cloud_edge(result: CloudEdgeSimulation) -> None:
    """The simulation as tables: per policy, the two sweeps, and the paper's claims."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    baseline = result.policies["baseline"]
    table = Table(title=f"Cloud-edge withholding, 1 MB messages: seed {result.seed}, "
                        f"{result.units} units, {result.large_messages} messages, "
                        f"threshold_l {result.threshold_l_s} s, TQ {result.query_period_s} s "
                        f"({result.congested_fraction:.0%} of the time congested)")
    for column in ("policy", "mean latency s", "95 % CI ±", "vs baseline s"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, mean in result.policies.items():
        table.add_row(name, f"{mean:.2f}", f"{result.policies_ci95_s[name]:.2f}",
                      "" if name == "baseline" else f"{mean - baseline:+.2f}")
    console.print(table)
    console.print(f"historic saving against baseline: {result.historic_saving_s:.2f} s "
                  f"(paper: about {result.paper.historic_saving_s} s)")

    sweep = Table(title="Mean latency (s) over threshold_l (Fig. 8: TQ "
                        f"{result.query_period_s} s; Fig. 9: TQ per row)")
    thresholds = [p.x for p in next(iter(result.threshold_l_sweep.values()))]
    sweep.add_column("policy", justify="left")
    sweep.add_column("TQ s", justify="right")
    for threshold in thresholds:
        sweep.add_column(f"{threshold:g} s", justify="right")
    rows = [(name, result.query_period_s, points)
            for name, points in result.threshold_l_sweep.items()]
    rows += [(name, tq, points) for name, by_tq in result.tq_sweep.items()
             for tq, points in by_tq.items() if tq != result.query_period_s]
    for name, tq, points in rows:
        sweep.add_row(name, str(tq), *(f"{p.mean_s:.2f}" for p in points))
    console.print(sweep)

    claims = Table(title=f"The paper's statements ({result.paper.source})")
    for column in ("", "statement", "ours"):
        claims.add_column(column, justify="left")
    for claim in result.claims:
        claims.add_row("yes" if claim.holds else "NO", claim.statement, claim.ours)
    console.print(claims)
