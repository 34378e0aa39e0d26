"""``mqttbed campaigns ...``: the CLI against a remote controller's REST API."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from mqttbed.core.settings import ClientSettings
from mqttbed.core.tls import (
    CA_FILE_HINT,
    TlsSetupError,
    add_ca_file_option,
    client_verify,
    is_untrusted_certificate,
)

STATUS_ENDED = ("done", "failed", "cancelled")


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add the ``campaigns`` command group to the ``mqttbed`` parser."""
    group = commands.add_parser("campaigns", help="campaigns on a remote controller "
                                                  "(--url/--token or MQTTBED_URL/MQTTBED_TOKEN)")
    settings = ClientSettings.load()
    # None until the command runs: `campaigns list` with no controller named lists the
    # local data dir (controller/cli_local.py).
    group.add_argument("--url", default=None,
                       help="the controller (default: MQTTBED_URL or http://127.0.0.1:8000)")
    group.add_argument("--token", default=None,
                       help="a user token (default: MQTTBED_TOKEN)")
    add_ca_file_option(group, settings.ca_file)
    # The same options after the action (`campaigns list --url …`), overriding only if given.
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", default=argparse.SUPPRESS, help="the controller")
    connection.add_argument("--token", default=argparse.SUPPRESS, help="a user token")
    connection.add_argument("--ca-file", default=argparse.SUPPRESS,
                            help="CA or certificate to trust")
    actions = group.add_subparsers(dest="action", required=True, parser_class=_parser_with(
        connection))
    submit = actions.add_parser("submit", help="create a campaign from a spec and start it")
    submit.add_argument("spec", type=Path)
    submit.add_argument("--no-start", action="store_true", help="create it, do not start it")
    listing = actions.add_parser(
        "list", help="every campaign with its status: a controller's, or with no controller "
                     "named (--url, --token, MQTTBED_URL, MQTTBED_TOKEN) or with --data-dir, "
                     "the local data dir's (id, name, status, created, runs)")
    listing.add_argument("--data-dir", help="list this data dir's campaigns (default without a "
                                            "controller: MQTTBED_DATA_DIR or ./data)")
    for name, text in (("status", "a campaign's status, progress and runs"),
                       ("stats", "a campaign's stats.json"),
                       ("cancel", "cancel a campaign")):
        actions.add_parser(name, help=text).add_argument("id")
    export = actions.add_parser("export", help="download a campaign's dataset")
    export.add_argument("id")
    export.add_argument("--format", choices=("csv", "parquet"), default="parquet")
    export.add_argument("--out", type=Path, help="file to write (default: ID.csv / ID.zip)")
    group.set_defaults(func=run, client_settings=settings)


def _parser_with(parent: argparse.ArgumentParser) -> type[argparse.ArgumentParser]:
    """An ArgumentParser class whose instances all take ``parent``'s options."""

    class WithParent(argparse.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["parents"] = [*kwargs.get("parents", []), parent]
            super().__init__(*args, **kwargs)

    return WithParent


def _client(args: argparse.Namespace) -> httpx.Client:
    if not args.token:
        raise SystemExit("mqttbed campaigns: a user token is needed: --token or MQTTBED_TOKEN")
    try:
        verify = client_verify(args.ca_file)
    except TlsSetupError as exc:
        raise SystemExit(f"mqttbed campaigns: {exc}") from None
    return httpx.Client(base_url=args.url.rstrip("/"), timeout=60.0, verify=verify,
                        headers={"authorization": f"Bearer {args.token}"})


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise SystemExit(f"mqttbed campaigns: {response.status_code} from "
                         f"{response.request.url}: {detail}")
    return response


def run(args: argparse.Namespace) -> int:
    from mqttbed.controller.cli_local import list_local, wants_local_list

    settings: ClientSettings = args.client_settings
    if args.action == "list" and wants_local_list(
            args, controller_configured=bool({"url", "token"} & settings.model_fields_set)):
        return list_local(args)
    args.url = args.url if args.url is not None else settings.url
    args.token = args.token if args.token is not None else settings.token
    try:
        return _run(args)
    except httpx.TransportError as exc:
        hint = f"; {CA_FILE_HINT}" if is_untrusted_certificate(exc) else ""
        raise SystemExit(f"mqttbed campaigns: cannot reach the controller at {args.url}: "
                         f"{type(exc).__name__}: {exc}{hint}") from None


def _run(args: argparse.Namespace) -> int:
    with _client(args) as http:
        if args.action == "submit":
            content_type = "application/json" if args.spec.suffix == ".json" else "application/yaml"
            campaign = _check(http.post("/api/v1/campaigns", content=args.spec.read_bytes(),
                                        headers={"content-type": content_type})).json()
            if not args.no_start:
                campaign = _check(http.post(f"/api/v1/campaigns/{campaign['id']}/start")).json()
            print(campaign["id"])
            print(f"{campaign['name']}: {campaign['status']}, "
                  f"{campaign['progress']['runs_total']} runs", file=sys.stderr)
        elif args.action == "list":
            for c in _check(http.get("/api/v1/campaigns")).json():
                p = c["progress"]
                print(f"{c['id']}  {c['status']:9}  {p['runs_finished']:>4}/{p['runs_total']:<4} "
                      f"{c['name']}")
        elif args.action == "status":
            c = _check(http.get(f"/api/v1/campaigns/{args.id}")).json()
            p = c["progress"]
            print(f"{c['id']} {c['name']}: {c['status']}, {p['runs_finished']}/{p['runs_total']} "
                  f"runs ended ({p['runs_done']} done, {p['runs_failed']} failed)"
                  + (f"; {c['reason']}" if c["reason"] else ""))
            for r in c["runs"]:
                print(f"  {r['id']}  {r['state']:11} {json.dumps(r['params'])} "
                      f"rep {r['repetition']}" + (f"  {r['reason']}" if r["reason"] else ""))
        elif args.action == "stats":
            response = _check(http.get(f"/api/v1/campaigns/{args.id}/stats"))
            if response.status_code == 202:  # on their way: not statistics yet
                raise SystemExit(f"mqttbed campaigns: {response.json()['detail']}; try again "
                                 f"in {response.headers.get('retry-after', '5')} s")
            print(json.dumps(response.json(), indent=2))
        elif args.action == "cancel":
            print(_check(http.post(f"/api/v1/campaigns/{args.id}/cancel")).json()["status"])
        elif args.action == "export":
            out = args.out or Path(f"{args.id}.{'csv' if args.format == 'csv' else 'zip'}")
            with http.stream("GET", f"/api/v1/campaigns/{args.id}/dataset",
                             params={"format": args.format}) as response:
                if response.is_error:
                    response.read()
                    _check(response)
                with out.open("wb") as file:
                    for block in response.iter_bytes():
                        file.write(block)
            print(out)
    return 0
