"""``mqttbed campaigns list`` on this machine's data dir, with no controller running.

``campaigns ...`` speaks to a controller's REST API when one is named (``--url`` or
``--token``, ``MQTTBED_URL`` or ``MQTTBED_TOKEN``); ``campaigns list`` without one, or with
``--data-dir``, reads the data dir's database instead, as ``report`` and ``analyze`` do.
"""

from __future__ import annotations

import argparse


def wants_local_list(args: argparse.Namespace, controller_configured: bool) -> bool:
    """Whether ``campaigns list`` reads the local data dir rather than a controller."""
    if getattr(args, "data_dir", None) is not None:
        return True
    named = getattr(args, "url", None) is not None or getattr(args, "token", None) is not None
    return not named and not controller_configured


def list_local(args: argparse.Namespace) -> int:
    """Print the data dir's campaigns, newest first: id, name, status, created, runs."""
    from mqttbed.results import NoCampaign, Results

    with Results(args.data_dir) as results:
        try:
            campaigns = results.campaigns()
        except NoCampaign as exc:
            raise SystemExit(f"mqttbed campaigns list: {exc}") from None
        where = results.data_dir
    if not campaigns:
        print(f"no campaigns in {where} (mqttbed run NAME runs one)")
        return 0
    width = max(len(c.name) for c in campaigns)
    print(f"{'id':13}  {'name':{width}}  {'status':9}  {'created (UTC)':16}  runs")
    for back, c in enumerate(campaigns):
        runs = f"{c.runs_done}/{c.runs_total} done" + (
            f", {c.runs_failed} failed" if c.runs_failed else "")
        ref = "latest" if back == 0 else f"latest~{back}"
        print(f"{c.id:13}  {c.name:{width}}  {c.status:9}  {c.created_at:%Y-%m-%d %H:%M}  "
              f"{runs:20} {ref}")
    print(f"({len(campaigns)} in {where}; `campaigns list --url URL` lists a controller's)")
    return 0
