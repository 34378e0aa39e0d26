"""``mqttbed lab provision|status|upgrade|remove``: lab machines, on this controller's database;
``mqttbed lab wiring``: where a campaign's scope probes go."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _lab(args: argparse.Namespace) -> int:
    from mqttbed.controller.db import database_url, open_database
    from mqttbed.controller.lab_hosts import (
        Access,
        HostArg,
        LabError,
        LabHosts,
        Wheels,
        native_engine_text,
        parse_extras,
    )
    from mqttbed.core.settings import Settings

    settings = Settings.from_env(args.data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    sessions = open_database(settings.database_url or database_url(settings.data_dir),
                             settings.database_reconnect_s)
    # MQTTBED_LAB_WHEELS: where built wheels are cached (default: the data dir's lab/)
    cache = Path(os.environ.get("MQTTBED_LAB_WHEELS") or settings.data_dir / "lab")
    lab = LabHosts(sessions, Wheels(cache, wheel=getattr(args, "wheel", None)))
    try:
        if args.action == "provision":
            hosts = [HostArg.parse(text) for text in args.hosts]
            access = Access(key_filename=args.key, known_hosts=args.known_hosts,
                            trust_new=args.trust_new)
            extras = [] if args.no_agent else parse_extras(args.extras)
            for row in lab.provision(hosts, access, extras, args.remote_dir):
                print(f"{row.name}: provisioned "
                      f"({f'mqttbed {row.version}' if row.version else 'no agent'})")
        elif args.action == "upgrade":
            for row in lab.upgrade(args.names):
                print(f"{row.name}: upgraded "
                      f"({f'mqttbed {row.version}' if row.version else 'no agent'})")
        elif args.action == "status":
            entries = lab.status(args.names)
            if args.json:
                print(json.dumps(entries, indent=2, default=str))
            for entry in [] if args.json else entries:
                facts, clock = entry["facts"] or {}, (entry["facts"] or {}).get("clock") or {}
                print(f"{entry['name']:16} {entry['destination']:28} {entry['state']:12} "
                      f"{entry['answers']}" + (f" ({entry['build']})" if entry["build"] else ""))
                if facts:
                    print(f"{'':16} {facts.get('model') or facts.get('machine')}, kernel "
                          f"{facts.get('kernel')}, Python {facts.get('python')}, GPIO "
                          f"{'/'.join(facts.get('gpio_backends', []))}, clock "
                          f"{clock.get('source')} ({clock.get('detail')})")
                    if (engine := native_engine_text(facts)) is not None:
                        print(f"{'':16} {engine}")
                if entry["reason"]:
                    print(f"{'':16} last failure: {entry['reason']}")
            if not entries:
                print("no lab hosts (mqttbed lab provision adds them)")
        else:
            for name in lab.remove(args.names, forget_only=args.forget):
                print(f"{name}: removed")
    except LabError as exc:
        raise SystemExit(f"mqttbed lab {args.action}: {exc}") from None
    finally:
        sessions.kw["bind"].dispose()
    return 0


def _wiring(args: argparse.Namespace) -> int:
    """Print the scope probes' wiring of every sweep point (one table when it never changes)."""
    from mqttbed.campaigns.library import spec_path
    from mqttbed.campaigns.spec import expand_points, load_spec
    from mqttbed.campaigns.wiring import (
        GROUND_PINS,
        format_table,
        header_picture,
        sweep_wiring,
        table_rows,
    )
    from mqttbed.core.errors import MqttbedError

    try:
        spec = load_spec(spec_path(args.spec))
        points = [(", ".join(f"{k}={v}" for k, v in p.params.items()) or "the only point",
                   p.spec) for p in expand_points(spec)]
        groups = sweep_wiring(points)
    except MqttbedError as exc:
        raise SystemExit(f"mqttbed lab wiring: invalid campaign spec {args.spec}: "
                         f"{exc}") from None
    if spec.measurement.scope is None:
        print(f"{spec.name}: no measurement.scope, so no probe to wire")
        return 0
    print(f"{spec.name}: scope probes ({spec.measurement.scope.resource}, "
          f"{spec.measurement.scope.dialect}) on the agents' GPIO lines")
    if len(groups) == 1:
        print(f"the same table for every point of the sweep ({len(points)} point"
              f"{'s' if len(points) != 1 else ''}): wire once for the whole campaign")
    else:
        print(f"the wiring changes within the sweep ({len(groups)} tables): rewire between "
              "the points of each table (the sweep changes agents, hosts or channels)")
    for labels, plans in groups:
        if len(groups) > 1:
            print(f"\npoints: {'; '.join(labels)}")
        print(format_table(table_rows(plans), markdown=args.markdown))
        if args.picture:
            for host in dict.fromkeys(line.host for line in plans[0].lines):
                print(f"\n{header_picture(plans[0], host)}")
    print(f"each probe's ground clip: a GND pin of the same header "
          f"({', '.join(map(str, GROUND_PINS))})")
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add the ``lab`` command group to the ``mqttbed`` parser."""
    group = commands.add_parser("lab", help="lab machines (Raspberry Pis) that run agents: "
                                            "provision over SSH, status, upgrade, remove")
    actions = group.add_subparsers(dest="action", required=True)
    provision = actions.add_parser(
        "provision", help="install mqttbed's agent in a venv on each host over SSH and "
                          "record the host's facts")
    provision.add_argument("hosts", nargs="+", metavar="HOST",
                           help="[name=]user@address[:port], e.g. pi-07=pi@192.168.1.57")
    provision.add_argument("--key", help="SSH private key (default: the SSH agent's, ~/.ssh)")
    provision.add_argument("--known-hosts", help="known_hosts file holding the hosts' keys "
                                                 "(default ~/.ssh/known_hosts)")
    provision.add_argument("--trust-new", action="store_true",
                           help="pin a host's key on first connect (a changed key is always "
                                "refused)")
    provision.add_argument("--extras", default="agent",
                           help="agent, plus pi (RPi.GPIO, Pi 1-4) or pi5 (rpi-lgpio)")
    provision.add_argument("--no-agent", action="store_true",
                           help="install nothing: a broker machine (broker.host) needs only "
                                "SSH, python3 and the broker")
    provision.add_argument("--remote-dir", help="where the venv goes there (default "
                                                "~/.mqttbed)")
    provision.add_argument("--wheel", type=Path, help="an mqttbed wheel to install instead "
                                                      "of building one from this checkout")
    upgrade = actions.add_parser("upgrade", help="install this mqttbed on provisioned hosts")
    upgrade.add_argument("--wheel", type=Path, help="an mqttbed wheel to install")
    status = actions.add_parser("status", help="each host: state, facts, whether its agent "
                                               "answers")
    status.add_argument("--json", action="store_true")
    remove = actions.add_parser("remove", help="delete a host's venv there and its record")
    remove.add_argument("--forget", action="store_true",
                        help="drop the record only (the host is gone)")
    for action in (upgrade, status, remove):
        action.add_argument("names", nargs="*" if action is not remove else "+",
                            metavar="NAME", help="lab host names (default: all)")
    for action in (provision, upgrade, status, remove):
        action.add_argument("--data-dir", help="default: MQTTBED_DATA_DIR or ./data")
        action.set_defaults(func=_lab)
    wiring = actions.add_parser(
        "wiring", help="print where each scope channel's probe goes (channel, client, agent, "
                       "host, BCM line, header pin): the same at every sweep point")
    wiring.add_argument("spec", help="a spec file (YAML or JSON) or a built-in campaign's "
                                     "name (e.g. scope-sync-spread)")
    wiring.add_argument("--markdown", action="store_true", help="the table in Markdown")
    wiring.add_argument("--picture", action="store_true",
                        help="also draw each host's 40-pin header with the probed pins")
    wiring.set_defaults(func=_wiring)
