"""The ``mqttbed`` command line.

Subcommands import what they need when they run, so ``mqttbed agent`` on a Pi needs only
the agent extra.
"""

from __future__ import annotations

import argparse
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqttbed.analytics.results import CampaignStats
    from mqttbed.controller.controller import Controller


# How every command that takes a campaign names it.
CAMPAIGN_REF_HELP = ("campaign id, 'latest' (the newest in the data dir) or 'latest~N' (the "
                     "N-th before it)")


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mqttbed.campaigns.library import spec_path
    from mqttbed.campaigns.spec import load_spec
    from mqttbed.controller.analysis import settings_for_one_campaign
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.documents import CampaignUpdate, Document, ResultsReady, RunUpdate
    from mqttbed.controller.states import CAMPAIGN_ENDED, TERMINAL_STATES, CampaignStatus
    from mqttbed.core.errors import MqttbedError, SpecError
    from mqttbed.core.settings import Settings

    console = Console(stderr=True)
    try:
        spec = load_spec(spec_path(args.spec))   # a file, or a built-in campaign's name
    except MqttbedError as exc:
        console.print(f"[red]invalid campaign spec {args.spec}:[/red] {exc}")
        return 2
    # the JVM that analyses this campaign alone compiles as its size suits
    settings = settings_for_one_campaign(Settings.from_env(args.data_dir, args.spark_master),
                                         spec)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console)
    task = progress.add_task(spec.name, total=None)
    results: list[ResultsReady] = []
    endings: list[CampaignUpdate] = []

    def show_run(update: RunUpdate) -> None:
        params = ", ".join(f"{k}={v}" for k, v in update.params.items()) or "-"
        progress.update(task, total=update.total,
                        description=f"{spec.name} run {update.ordinal + 1}/{update.total} "
                                    f"[{params} rep {update.repetition}] {update.state}")
        if update.state in TERMINAL_STATES:
            progress.advance(task)
        if update.reason:
            progress.console.print(f"[yellow]run {update.run_id} {update.state}:[/yellow] "
                                   f"{update.reason}")

    def show(document: Document) -> None:
        """The progress display: a listener of the controller's documents."""
        match document:
            case RunUpdate():
                show_run(document)
            case CampaignUpdate(status=CampaignStatus.ANALYSING):
                progress.stop()
                console.print(f"campaign {document.campaign_id} runs ended"
                              + (f" ({document.reason})" if document.reason else "")
                              + "; computing statistics with Spark ...")
            case CampaignUpdate(status=final) if final in CAMPAIGN_ENDED:
                endings.append(document)
            case ResultsReady():
                results.append(document)

    with create_controller(settings, listeners=[show]) as controller:
        try:   # what only the controller checks: files the spec names, lab hosts, cgroups
            campaign_id = controller.engine.create_campaign(spec)
        except SpecError as exc:
            console.print(f"[red]invalid campaign spec {args.spec}:[/red] {exc}")
            return 2
        with progress:
            status = controller.run_campaign(campaign_id)
    if not results:
        reason = endings[-1].reason if endings else None
        console.print(f"[red]campaign {campaign_id} {status} without statistics:[/red] {reason}")
        return 1
    print_points(results[-1].stats)
    print(f"dataset: {controller.layout.events / f'campaign_id={campaign_id}'}")
    print(f"stats:   {results[-1].stats_path}")
    return 0 if status == "done" else 1


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _ci(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:,.1f}–{interval[1]:,.1f}"


def print_points(stats: CampaignStats) -> None:
    """Print one table row per sweep point to stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{stats.campaign.name} ({stats.campaign.id})")
    for column in ("point", "backend", "runs", "latency p50 µs", "p50 95% CI",
                   "latency p99 µs", "spread p50 µs", "spread p99 µs", "received", "lost",
                   "broker CPU %"):
        table.add_column(column, justify="left" if column in ("point", "backend") else "right")
    for point in stats.points:
        params = ", ".join(f"{k}={v}" for k, v in point.params.items()) or "(no sweep)"
        latency, spread = point.latency_us, point.sync_spread_us
        runs = f"{point.runs}" + (f" (+{point.runs_failed} failed)" if point.runs_failed
                                  else "")
        table.add_row(params, point.backend, runs, _us(latency.p50), _ci(latency.p50_ci),
                      _us(latency.p99), _us(spread.p50), _us(spread.p99),
                      f"{point.deliveries_received}/{point.deliveries_expected}",
                      str(point.lost), _us(point.broker.cpu_percent_mean))
    Console(width=170).print(table)
    if any(point.streams for point in stats.points):
        _print_streams(stats)


def _print_streams(stats: CampaignStats) -> None:
    """Print one row per stream of each sweep point's message mix."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="per stream")
    for column in ("point", "stream", "payload B", "sent", "received", "lost", "dup",
                   "latency p50 µs", "p50 95% CI", "latency p99 µs", "latency max µs"):
        table.add_column(column, justify="left" if column in ("point", "stream") else "right")
    for point in stats.points:
        params = ", ".join(f"{k}={v}" for k, v in point.params.items()) or "(no sweep)"
        for name, stream in point.streams.items():
            latency = stream.latency_us
            table.add_row(params, name, f"{stream.payload_bytes:,}", str(stream.messages_sent),
                          f"{stream.deliveries_received}/{stream.deliveries_expected}",
                          str(stream.lost), str(stream.duplicates), _us(latency.p50),
                          _ci(latency.p50_ci), _us(latency.p99), _us(latency.max))
    Console(width=170).print(table)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mqttbed.api.app import create_app  # the CLI is the one place controller meets api
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.embedded import bind_socket
    from mqttbed.core.settings import Settings
    from mqttbed.core.tls import check_server_files

    settings = Settings.load(data_dir=args.data_dir, spark_master=args.spark_master,
                             tls_cert=args.tls_cert, tls_key=args.tls_key)
    check_server_files(settings.tls_cert, settings.tls_key)
    scheme = "https" if settings.tls_cert else "http"
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()
    # Agents reach a wildcard listener at the lab address (loopback unless one is set).
    reachable = settings.lab_address if host in ("0.0.0.0", "") else host
    app = create_app(create_controller(settings,
                                       controller_url=f"{scheme}://{reachable}:{port}"))
    print(f"mqttbed controller on {scheme}://{host}:{port} (API docs at /docs)",
          file=sys.stderr)
    worker = app.state.worker

    class ControllerServer(uvicorn.Server):
        """uvicorn, but SIGTERM / Ctrl-C first interrupts the running run.

        Waiting for uvicorn's graceful shutdown first would leave the run going while the
        agents can no longer reach the controller (they would be reported lost). The
        signal is not raised again after the shutdown: a stop asked for is a clean exit.
        """

        def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
            worker.interrupt(f"controller stopped by {signal.Signals(sig).name}")
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C
            self.should_exit = True

    # The bound on a stop: long polls still open after 2 s are cut (agents retry them).
    ControllerServer(uvicorn.Config(app, log_level="info", ssl_certfile=settings.tls_cert,
                                    ssl_keyfile=settings.tls_key,
                                    timeout_graceful_shutdown=2)).run(sockets=[sock])
    return 0


def _token(args: argparse.Namespace) -> int:
    """``token create|list|revoke``: on the controller's own database, not over the API."""
    from mqttbed.controller.db import database_url, open_database, utcnow
    from mqttbed.controller.tokens import (
        TokenError,
        TokenRole,
        create_token,
        list_tokens,
        parse_duration,
        revoke_tokens,
    )
    from mqttbed.core.settings import Settings

    settings = Settings.from_env(args.data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    sessions = open_database(settings.database_url or database_url(settings.data_dir),
                             settings.database_reconnect_s)
    try:
        if args.action == "create":
            token = create_token(sessions, args.name, TokenRole(args.role),
                                 parse_duration(args.expires_in))
            print(token)  # alone on stdout, so scripts can capture it; it is not shown again
        elif args.action == "list":
            now = utcnow()
            for record in list_tokens(sessions):
                expires = f"{record.expires_at:%Y-%m-%d %H:%M}" if record.expires_at else "never"
                print(f"{record.id:>4}  {record.name:20} {record.role:6} "
                      f"{record.state(now):8} created {record.created_at:%Y-%m-%d %H:%M}  "
                      f"expires {expires}")
        else:
            for record in revoke_tokens(sessions, token_id=args.id, name=args.name):
                print(f"revoked {record.id} {record.name} ({record.role})")
    except TokenError as exc:
        raise SystemExit(f"mqttbed token {args.action}: {exc}") from None
    finally:
        sessions.kw["bind"].dispose()
    return 0


def _report(args: argparse.Namespace) -> int:
    from mqttbed.api.report import render_report
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    # Reads results only: never started, so it starts no agent and needs no address.
    controller = create_controller(Settings.from_env(args.data_dir), controller_url="")
    try:
        campaign_id = _campaign_id(controller, args.id, "report")
        try:
            html = render_report(controller, campaign_id, standalone=True)
        except KeyError:
            raise SystemExit(f"mqttbed report: no campaign {campaign_id!r} in "
                             f"{controller.layout.root}") from None
    finally:
        controller.close()
    out = args.out or Path(f"{campaign_id}-report.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    print(out.resolve())
    return 0


def _campaign_id(controller: Controller, wanted: str, command: str) -> str:
    """The id ``wanted`` names (an id, ``latest``, ``latest~N``); exits if there is none."""
    from mqttbed.results import NoCampaign, resolve_campaign

    try:
        return resolve_campaign(controller.sessions, wanted, str(controller.layout.root))
    except NoCampaign as exc:
        raise SystemExit(f"mqttbed {command}: {exc}") from None


def _analyze(args: argparse.Namespace) -> int:
    """Recompute a campaign's results from its stored events, as at the end of its runs."""
    from mqttbed.controller.analysis import analyze_campaign, reanalysis_status
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    settings = Settings.from_env(args.data_dir, args.spark_master)
    controller = create_controller(settings, controller_url="")  # starts nothing
    try:
        campaign_id = _campaign_id(controller, args.id, "analyze")
        status = reanalysis_status(controller.engine, campaign_id)
        stats, json_path, _ = analyze_campaign(controller.sessions, controller.layout,
                                               campaign_id, settings)
        if status is not None:  # its earlier analysis had failed: now it has results
            controller.engine.set_campaign_status(campaign_id, *status)
    finally:
        controller.close()
    print_points(stats)
    print(f"stats:   {json_path}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Two campaigns side by side per matching sweep point (table, and HTML with --out)."""
    from rich.console import Console
    from rich.table import Table

    from mqttbed.api.compare_page import NotComparable, comparison_of, render_comparison
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    controller = create_controller(Settings.from_env(args.data_dir), controller_url="")
    try:   # latest, latest~N: ids from the database; the comparison reads stats.json
        first, second = (_campaign_id(controller, ref, "compare")
                         for ref in (args.first, args.second))
    finally:
        controller.close()
    try:
        comparison = comparison_of(controller.layout, first, second)
    except NotComparable as exc:
        raise SystemExit(f"mqttbed compare: {exc}") from None
    table = Table(title=f"{comparison.first.id} vs {comparison.second.id} "
                        "(difference = second − first)")
    for column in ("point", "figure", "first", "first 95% CI", "second", "second 95% CI",
                   "difference", "intervals"):
        table.add_column(column, justify="left" if column in ("point", "figure", "intervals")
                         else "right")
    for point in comparison.points:
        label = ", ".join(f"{k}={v}" for k, v in point.params.items()) or "(no sweep)"
        for figure in point.figures:
            overlap = figure.intervals_overlap
            table.add_row(label, figure.figure, _us(figure.first), _ci(figure.first_ci),
                          _us(figure.second), _ci(figure.second_ci), _us(figure.difference),
                          "-" if overlap is None else "overlap" if overlap else "disjoint")
            label = ""
    Console(width=170).print(table)
    for side, unmatched in (("first", comparison.only_in_first),
                            ("second", comparison.only_in_second)):
        if unmatched:
            print(f"only in the {side}: {unmatched}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_comparison(comparison, standalone=True))
        print(args.out.resolve())
    return 0


def _schema(args: argparse.Namespace) -> int:
    """Print the JSON schema of a document mqttbed publishes."""
    import json

    from mqttbed.controller.analysis import results_type

    print(json.dumps(results_type().model_json_schema(), indent=2))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from mqttbed.agents.main import run

    return run(args)


def _broker_run(args: argparse.Namespace) -> int:
    """Run a backend's standalone server in the foreground; its own options follow its name."""
    from mqttbed.core.backends import declaration
    from mqttbed.core.errors import SpecError

    try:
        server = declaration(args.model).standalone
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if server is None:
        raise SpecError(f"backend {args.model!r} has no standalone server; those that do: "
                        f"{', '.join(standalone_backends())}")
    return server.serve(list(args.model_options))


def standalone_backends() -> list[str]:
    """The backends ``mqttbed broker run`` can start (they declare a standalone server)."""
    from mqttbed.core.backends import backend_names, declaration

    return [name for name in backend_names() if declaration(name).standalone is not None]


def build_parser() -> argparse.ArgumentParser:
    from mqttbed import __version__

    parser = argparse.ArgumentParser(prog="mqttbed", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mqttbed {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a campaign with an embedded controller")
    run.add_argument("spec", help="campaign spec (YAML or JSON), or a built-in campaign's "
                                  "name (mqttbed validate NAME shows what it runs)")
    run.add_argument("--data-dir", help="where the database, dataset and stats go "
                                        "(default: MQTTBED_DATA_DIR or ./data)")
    run.add_argument("--spark-master", help="Spark master URL (default: MQTTBED_SPARK_MASTER "
                                            "or local[*])")
    run.set_defaults(func=_run)

    analyze = commands.add_parser(
        "analyze", help="recompute a campaign's results (stats.json, stats.parquet) from its "
                        "stored events, as at the end of its runs")
    analyze.add_argument("id", help=CAMPAIGN_REF_HELP)
    analyze.add_argument("--data-dir", help="default: MQTTBED_DATA_DIR or ./data")
    analyze.add_argument("--spark-master", help="e.g. spark://HOST:7077 (default: "
                                                "MQTTBED_SPARK_MASTER or local[*])")
    analyze.set_defaults(func=_analyze)

    serve = commands.add_parser("serve", help="run the controller: REST API, web reports, "
                                              "agent API, campaign queue")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--data-dir")
    serve.add_argument("--spark-master")
    serve.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain); "
                                          "agents it starts trust it (MQTTBED_TLS_CERT)")
    serve.add_argument("--tls-key", help="the certificate's PEM private key (MQTTBED_TLS_KEY)")
    serve.set_defaults(func=_serve)

    token = commands.add_parser("token", help="API tokens (on this controller's database)")
    token_actions = token.add_subparsers(dest="action", required=True)
    create = token_actions.add_parser("create", help="create a token and print it once")
    create.add_argument("--name", required=True, help="who or what the token is for")
    create.add_argument("--role", choices=("user", "agent"), default="user")
    create.add_argument("--expires-in", default="never", metavar="DURATION",
                        help="e.g. 90d, 12h, 30m (default: never)")
    listing = token_actions.add_parser("list", help="every token: id, name, role, state "
                                                    "(active, expired, revoked), expiry")
    revoke = token_actions.add_parser("revoke", help="revoke a token: refused from the next "
                                                     "request on")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=int, help="the token's id (token list)")
    which.add_argument("--name", help="every unrevoked token of that name")
    for action in (create, listing, revoke):
        action.add_argument("--data-dir")
        action.set_defaults(func=_token)

    report = commands.add_parser("report", help="write a campaign's report as one "
                                                "self-contained HTML file")
    report.add_argument("id", help=CAMPAIGN_REF_HELP)
    report.add_argument("--out", type=Path, help="default: ID-report.html")
    report.add_argument("--data-dir")
    report.set_defaults(func=_report)

    compare = commands.add_parser("compare", help="two campaigns side by side per matching "
                                                  "sweep point, with 95 %% intervals")
    compare.add_argument("first", help=CAMPAIGN_REF_HELP)
    compare.add_argument("second", help="the campaign compared against the first (an id, "
                                        "latest or latest~N)")
    compare.add_argument("--out", type=Path, help="also write the comparison as an HTML page")
    compare.add_argument("--data-dir")
    compare.set_defaults(func=_compare)

    schema = commands.add_parser("schema", help="print the JSON schema of a document "
                                                "(stats: a campaign's results, stats.json)")
    schema.add_argument("document", choices=["stats"])
    schema.set_defaults(func=_schema)

    from mqttbed.controller.cli_compact import add_commands as add_compact
    from mqttbed.controller.cli_lab import add_commands as add_lab
    from mqttbed.controller.cli_remote import add_commands
    from mqttbed.controller.cli_simulate import add_commands as add_simulations
    from mqttbed.controller.cli_validate import add_commands as add_validate

    add_commands(commands)
    add_validate(commands)
    add_simulations(commands)
    add_lab(commands)
    add_compact(commands)

    agent = commands.add_parser("agent", help="run an agent that obeys a controller")
    from mqttbed.agents.options import build_parser as agent_options

    agent_options(agent)
    agent.set_defaults(func=_agent)

    broker = commands.add_parser("broker", help="broker models run by hand")
    broker_commands = broker.add_subparsers(dest="broker_command", required=True)
    broker_run = broker_commands.add_parser(
        "run", help="run a broker model in the foreground until Ctrl-C or SIGTERM",
        description="e.g. `mqttbed broker run fpga --port 1883`, `mqttbed broker run "
                    "mqtt-sn --port 1884`, `mqttbed broker run mqtt-st --brokers 3 --port "
                    "1883`, `mqttbed broker run adaptive --port 1883 --policy historic`; "
                    "`mqttbed broker run NAME --help` lists its options")
    # (no choices: listing them imports every backend, and an agent-only install has none)
    broker_run.add_argument("model", metavar="NAME",
                            help="the backend whose server to run (e.g. fpga, mqtt-sn, mqtt-st, "
                                 "adaptive)")
    broker_run.add_argument("model_options", nargs=argparse.REMAINDER,
                            help="the model's own options (--port N, ...)")
    broker_run.set_defaults(func=_broker_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from mqttbed.core.errors import MqttbedError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MqttbedError as exc:  # bad settings, a campaign in the wrong state ...
        raise SystemExit(f"mqttbed {args.command}: {exc}") from None
    except KeyboardInterrupt:  # what was recorded stays (a run's state says "interrupted")
        print(f"mqttbed {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def entry() -> int:
    """The ``mqttbed`` command: :func:`main` in a process of its own, which it ends cleanly.

    A command that started Spark (it analysed, or a run was interrupted) ends its JVM
    before it exits: left to itself the JVM ends only once it reads the end of its input,
    after the process has gone, and holds the terminal or the caller's pipes meanwhile
    (60-180 s in CI). (:func:`main` called in a process that keeps its Spark session, a
    test's, leaves the session alone.)
    """
    try:
        return main()
    finally:
        if "pyspark" in sys.modules:
            from mqttbed.analytics.spark import end_spark
            end_spark()


if __name__ == "__main__":
    sys.exit(entry())
