"""A campaign's agents, started once and kept from one run to the next.

Starting a run's agents is an interpreter start, the agent's imports and a native-engine
load per agent (1-2 s each here, several more on a Raspberry Pi over SSH): a sweep of a
few hundred points spent more time starting agents than measuring. So the engine keeps a
run's agents once the run is done and hands them the next run's assignment, as long as
the next run wants the same agents (the same ``agents`` section, count and controller
address) and every one of them is still alive and heard from. The broker is still fresh
for every run, and every run still has its own assignment, inbox, chunks and record: an
agent keeps nothing of one run for the next but its process, its GPIO line and its loaded
native engine (:mod:`mqttbed.agents.main` runs each assignment on a runner of its own).

A run that did not end ``done`` (a failure, a cancel, a stopping controller) stops its
agents as before, so a run after a fault starts from fresh processes. Agents placed per
run (in the namespaces of impaired links, on a backend's own hosts) are never kept: their
hosts go with the run. What was kept is stopped when the campaign's runs are over
(:meth:`~mqttbed.controller.engine.RunEngine.agents_kept`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from mqttbed.agents.deploy import Agents
from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.controller.agent_registry import AgentRegistry
from mqttbed.controller.agent_sites import AgentSites

log = logging.getLogger("mqttbed.engine")


def agents_key(spec: CampaignSpec, needed: int, controller_url: str,
               env: dict[str, str]) -> str:
    """What makes two runs' agents interchangeable: the spec's ``agents`` section (hosts,
    GPIO, count), how many the run needs, and how they reach the controller."""
    return json.dumps({"agents": spec.agents.model_dump(mode="json"), "needed": needed,
                       "controller_url": controller_url, "env": env}, sort_keys=True)


@dataclass
class KeptPool:
    """One run's agents, kept for the next run that wants the same ones."""

    key: str
    campaign_id: str
    sites: AgentSites
    pool: Agents
    started_by: str   # the run that started them (their names and logs say so)


class KeptAgents:
    """At most one kept pool: the one the last done run left."""

    def __init__(self, registry: AgentRegistry,
                 stop: Callable[[Agents | None, AgentSites | None], None]):
        """``stop(pool, sites)`` stops agents as a run's teardown does (Shutdown, then the
        pool's stop, then the sites' SSH connections closed)."""
        self._registry = registry
        self._stop = stop
        self._kept: KeptPool | None = None

    def keep(self, kept: KeptPool) -> None:
        """Keep a done run's agents (stopping any kept before, which should be none)."""
        self.release()
        self._kept = kept

    def take(self, key: str | None, campaign_id: str, heartbeat_timeout_s: float
             ) -> KeptPool | None:
        """The kept agents if they are the ones ``key`` asks for and all alive and heard
        from within ``heartbeat_timeout_s``; else None, with whatever was kept stopped
        (a None key: the run places its agents for itself alone)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        why = self._unusable(kept, key, campaign_id, heartbeat_timeout_s)
        if why is None:
            return kept
        log.info("agents of run %s not kept for campaign %s: %s", kept.started_by,
                 campaign_id, why)
        self._stop(kept.pool, kept.sites)
        return None

    def release(self) -> None:
        """Stop the kept agents, if any."""
        kept, self._kept = self._kept, None
        if kept is not None:
            self._stop(kept.pool, kept.sites)

    def _unusable(self, kept: KeptPool, key: str | None, campaign_id: str,
                  heartbeat_timeout_s: float) -> str | None:
        if key is None:
            return "this run places its agents for itself"
        if kept.campaign_id != campaign_id:
            return "another campaign"
        if kept.key != key:
            return "this run wants other agents"
        if exited := kept.pool.exited():
            return "; ".join(exited)
        ids = list(self._registry.wait_for_agents(set(kept.pool.names), 0).values())
        if len(ids) != len(kept.pool.names):
            return "not every agent is registered any more"
        if silent := self._registry.silent_agents(ids, heartbeat_timeout_s):
            return f"no heartbeat from {', '.join(silent)} for {heartbeat_timeout_s:.1f} s"
        return None
