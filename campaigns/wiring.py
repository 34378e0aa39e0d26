"""The wiring plan: which agent, lab host and header line each scope-probed client has.

A scope channel is clipped onto one GPIO line of one machine, and stays there for the
whole campaign; so a probed client (the publisher a channel watches, the first-, the last-
or the k-th-subscribed subscriber) must drive the same line of the same host at every
point of a sweep, whatever the point's number of clients.

Why fixed role slots rather than a plan from the sweep's largest point: each run is
planned from its own point's spec, which no longer holds the sweep, and the "last"
subscriber is a different client at every point (``sub-1`` at N = 2, ``sub-99`` at
N = 100). What stays the same is the role. So the probed roles, in channel order (a
client two channels watch counts once), take slots 0, 1, 2 ...; slot k goes to agent
``k mod min(agents, scope channels)``. Every point runs at least that many agents (it has
at least as many clients as probed ones, and runs ``min(agents, clients)`` agents), and
agent i runs on the same host at every point (hosts are filled in the spec's order), so
the slot's agent and host never change unless the sweep changes ``agents`` itself. On
each host the slots take the host's usable lines in order (BCM 2, 3, 4 ... by default);
the other clients are dealt round robin as before and share the host's remaining lines,
each agent of the host its own part of them, so no other client ever toggles a probed line.
When first and last are the same client (one subscriber) both channels watch its line.
Impaired groups place their clients themselves (``ClientPlacement``): there the plan
gives the lines, not the agents (all of them on this machine). When an agent has more
unprobed clients than lines of its own, they share lines: fine for virtual lines, the
native engine and RPi.GPIO; libgpiod requests each line once, so a lean-client agent on
``gpiod`` with more than about 20 clients would be refused a line by the kernel.

The plan lives with the spec model, not the controller, because a spec that cannot be
wired is refused when it is loaded (``mqttbed validate``, the REST API, ``mqttbed run``)
and campaigns may not import the controller.

A host's usable lines are ``agents.hosts[].gpio_pins`` (BCM 0-27 of the 40-pin header,
default BCM 2-27: 0 and 1 are the HAT EEPROM's ID lines); agents on this machine
(no ``agents.hosts``) use the default on host ``local``. A spec whose probed lines on a
host outnumber its lines, or that leaves a host's other clients no line, is refused when
the spec is validated (:func:`plan_wiring`, called by the spec model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqttbed.core.errors import SpecError
from mqttbed.core.events import publisher_client_id, subscriber_client_id

if TYPE_CHECKING:
    from mqttbed.campaigns.spec import CampaignSpec

LOCAL_HOST = "local"  # the host name of agents on the controller's machine (core.host)
HEADER_BCM_MAX = 27   # BCM 0-27 are the GPIO lines a 40-pin Raspberry Pi header carries
DEFAULT_LINES = tuple(range(2, HEADER_BCM_MAX + 1))
# BCM line -> physical pin of the 40-pin header (pin 1 is 3V3 on the square pad; odd
# pins in one row, even in the other; `pinout` on a Pi prints its own board's)
HEADER_PIN = {0: 27, 1: 28, 2: 3, 3: 5, 4: 7, 5: 29, 6: 31, 7: 26, 8: 24, 9: 21, 10: 19,
              11: 23, 12: 32, 13: 33, 14: 8, 15: 10, 16: 36, 17: 11, 18: 12, 19: 35,
              20: 38, 21: 40, 22: 15, 23: 16, 24: 18, 25: 22, 26: 37, 27: 13}
POWER_PINS = {1: "3V3", 17: "3V3", 2: "5V", 4: "5V"}
GROUND_PINS = (6, 9, 14, 20, 25, 30, 34, 39)


def check_header_lines(pins: Sequence[int]) -> None:
    """Raise ValueError naming the line unless ``pins`` are distinct header lines 0-27
    (the spec's error names the field)."""
    for pin in pins:
        if not 0 <= pin <= HEADER_BCM_MAX:
            raise ValueError(f"BCM {pin} is not a GPIO line of the 40-pin header; "
                             f"list lines 0-{HEADER_BCM_MAX} (default "
                             f"{DEFAULT_LINES[0]}-{DEFAULT_LINES[-1]})")
    seen: set[int] = set()
    for pin in pins:
        if pin in seen:
            raise ValueError(f"BCM {pin} is listed twice; list each line once")
        seen.add(pin)


@dataclass(frozen=True)
class ProbedLine:
    """One scope channel's probe: the client it watches and the line that client drives."""

    channel: int
    role: str            # "publisher", "first subscriber", "last subscriber", "subscriber 3"
    client_id: str       # at this point (the last subscriber's changes with N)
    agent: int           # index of the run's agent (agent a{agent} of the run)
    host: str
    bcm_pin: int

    @property
    def header_pin(self) -> int:
        """The physical pin number on the 40-pin header."""
        return HEADER_PIN[self.bcm_pin]

    def place(self) -> tuple[int, str, int, str, int]:
        """What must not change across a sweep: channel, role, agent, host, line."""
        return self.channel, self.role, self.agent, self.host, self.bcm_pin


@dataclass(frozen=True)
class Wiring:
    """One point's plan: the probed lines, each agent's host, each host's usable lines."""

    lines: tuple[ProbedLine, ...]
    agent_hosts: tuple[str, ...]           # agent index -> host, for the point's agents
    header: dict[str, tuple[int, ...]]     # host -> its usable lines, in hand-out order

    def host_of(self, agent: int) -> str:
        """The host agent ``agent`` runs on (an agent the plan did not count: this machine)."""
        return self.agent_hosts[agent] if agent < len(self.agent_hosts) else LOCAL_HOST

    def deal(self, client_ids: Sequence[str], agents: int) -> list[int]:
        """The agent index of each client: a probed one its slot's, the others round robin
        by position (publishers first), as :func:`plan_assignments` always dealt them."""
        slot = {line.client_id: line.agent for line in self.lines}
        return [slot[c] % agents if c in slot else n % agents
                for n, c in enumerate(client_ids)]

    def pins(self, agent_clients: Sequence[Sequence[str]]) -> dict[str, int]:
        """Each client's BCM line, given the client ids each agent (by index) runs.

        A probed client gets its plan's line; the others share their host's other lines,
        agent by agent: with at least as many lines as the host has agents, each agent its
        own (every c-th), else agents share them too.
        """
        probed = {line.client_id: line.bcm_pin for line in self.lines}
        taken: dict[str, set[int]] = {}
        for line in self.lines:
            taken.setdefault(line.host, set()).add(line.bcm_pin)
        on_host: dict[str, list[int]] = {}
        for agent, clients in enumerate(agent_clients):
            if clients:
                on_host.setdefault(self.host_of(agent), []).append(agent)
        pins: dict[str, int] = {}
        for host, agents in on_host.items():
            spare = [p for p in self.header.get(host, DEFAULT_LINES)
                     if p not in taken.get(host, set())]
            for j, agent in enumerate(agents):
                share = (spare[j::len(agents)] if len(spare) >= len(agents)
                         else spare[j % len(spare):][:1] if spare else [])
                unprobed = 0
                for client in agent_clients[agent]:
                    if client in probed:
                        pins[client] = probed[client]
                        continue
                    if not share:
                        raise SpecError(f"host {host}: every usable line carries a scope "
                                        f"probe, none is left for client {client}; give the "
                                        "host more lines (agents.hosts[].gpio_pins)")
                    pins[client] = share[unprobed % len(share)]
                    unprobed += 1
        return pins


def _host_entries(spec: CampaignSpec) -> list[tuple[str, int, tuple[int, ...], int]]:
    """(host name, agents on it, usable lines, index in agents.hosts) per hosts entry."""
    if not spec.agents.hosts:
        return [(LOCAL_HOST, spec.agents.resolved_count(), DEFAULT_LINES, -1)]
    return [(entry.name or entry.host, entry.count,
             tuple(entry.gpio_pins) if entry.gpio_pins else DEFAULT_LINES, i)
            for i, entry in enumerate(spec.agents.hosts)]


def subscriber_role(selector: str) -> str:
    """A scope's subscriber selector ("first", "last", "3") as the role it names."""
    return f"{selector} subscriber" if selector in ("first", "last") else \
        f"subscriber {int(selector)}"


def _probed_roles(spec: CampaignSpec, publishers: int,
                  subscribers: int) -> list[tuple[int, str, str, int]]:
    """(channel, role, client id, its position among the clients dealt: publishers
    first) per scope channel, in channel order."""
    scope = spec.measurement.scope
    # A scope with nothing to watch, or a rank past the point's subscribers, is a run's
    # error (scope_recorder.wire_probes names it); such a channel is left unwired here.
    if scope is None or not publishers or not subscribers:
        return []
    roles = [(scope.channels.publisher, "publisher", publisher_client_id(0), 0)]
    for selector, channel in scope.channels.subscriber_channels().items():
        if selector in ("first", "last"):
            rank = 0 if selector == "first" else subscribers - 1
            roles.append((channel, subscriber_role(selector), subscriber_client_id(rank),
                          publishers + rank))
            continue
        rank = int(selector)
        if rank >= subscribers:
            continue
        roles.append((channel, subscriber_role(selector), subscriber_client_id(rank),
                      publishers + rank))
    return sorted(roles)


def plan_wiring(spec: CampaignSpec) -> Wiring:
    """The wiring of one point (a spec without a sweep): raises SpecError, naming the host,
    the field and the count, when a host has fewer lines than its probes need."""
    if spec.workload.mode == "connect":   # a storm's clients drive no line
        return Wiring((), (), {})
    publishers, subscribers = spec.workload.total_publishers(), spec.workload.subscribers
    clients = publishers + subscribers
    entries = _host_entries(spec)
    agents = min(spec.agents.resolved_count(), clients)
    agent_hosts = tuple(host for host, count, _, _ in entries for _ in range(count))[:agents]
    header: dict[str, tuple[int, ...]] = {}
    field_of: dict[str, str] = {}
    for host, _, usable, i in entries:   # a host listed twice keeps its first entry's lines
        header.setdefault(host, usable)
        field_of.setdefault(host, f"agents.hosts[{i}].gpio_pins" if i >= 0 else
                            "the default lines of this machine")
    roles = _probed_roles(spec, publishers, subscribers)
    slots: dict[str, int] = {}
    positions: dict[str, int] = {}
    for _, _, client, position in roles:
        slots.setdefault(client, len(slots))
        positions[client] = position
    modulus = min(agents, len(roles)) or 1
    used: dict[str, list[int]] = {}
    line_of: dict[str, tuple[int, str, int]] = {}
    for client, slot in slots.items():
        agent = slot % modulus
        host = agent_hosts[agent]
        taken = used.setdefault(host, [])
        if len(taken) < len(header[host]):
            taken.append(header[host][len(taken)])
        else:
            taken.append(-1)   # counted, refused below with the whole count
        line_of[client] = (agent, host, taken[-1])
    for host, taken in used.items():
        if len(taken) > len(header[host]):
            raise SpecError(f"host {host}: the scope probes {len(taken)} clients there, but "
                            f"{field_of[host]} gives {len(header[host])} GPIO line(s) "
                            f"({', '.join(map(str, header[host]))}); list at least "
                            f"{len(taken)}, or spread the agents over more hosts")
    _check_spare_lines(header, field_of, agent_hosts, used, clients,
                       {client: (positions[client], agent, host)
                        for client, (agent, host, _) in line_of.items()})
    lines = tuple(ProbedLine(channel, role, client, *line_of[client])
                  for channel, role, client, _ in roles)
    return Wiring(lines, agent_hosts, header)


def _check_spare_lines(header: dict[str, tuple[int, ...]], field_of: dict[str, str],
                       agent_hosts: tuple[str, ...], used: dict[str, list[int]],
                       clients: int, probed: dict[str, tuple[int, int, str]]) -> None:
    """Refuse a host whose probes take every line while it runs other clients too.

    ``probed``: client -> (position, its slot's agent, host). Counted, not dealt: a point
    may have 20,000 clients."""
    agents = len(agent_hosts)
    dealt = [len(range(a, clients, agents)) for a in range(agents)]
    for position, agent, _ in probed.values():
        dealt[position % agents] -= 1
        dealt[agent] += 1
    for host, taken in used.items():
        others = sum(n for a, n in enumerate(dealt) if agent_hosts[a] == host) - len(taken)
        if len(taken) >= len(header[host]) and others > 0:
            raise SpecError(f"host {host}: its {len(header[host])} GPIO lines "
                            f"({field_of[host]}) all carry scope probes, and its agents run "
                            f"{others} other clients, which need a line of their own: list "
                            f"at least {len(taken) + 1}")


def sweep_wiring(points: Sequence[tuple[str, CampaignSpec]]
                 ) -> list[tuple[list[str], list[Wiring]]]:
    """The points grouped by their wiring: (point labels, each one's plan) per distinct
    set of places (channel, role, agent, host, line); one group when the sweep never
    makes anyone rewire."""
    groups: dict[tuple[tuple[int, str, int, str, int], ...],
                 tuple[list[str], list[Wiring]]] = {}
    for label, spec in points:
        wiring = plan_wiring(spec)
        labels, plans = groups.setdefault(tuple(line.place() for line in wiring.lines),
                                          ([], []))
        labels.append(label)
        plans.append(wiring)
    return list(groups.values())


def table_rows(plans: Sequence[Wiring]) -> list[list[str]]:
    """The table of one wiring (the same places at every plan of ``plans``): channel,
    role, client (each point's, when they differ), agent, host, BCM line, header pin."""
    rows = []
    for n, line in enumerate(plans[0].lines):
        clients = list(dict.fromkeys(plan.lines[n].client_id for plan in plans))
        shown = (", ".join(clients) if len(clients) <= 4
                 else f"{clients[0]}, {clients[1]}, ..., {clients[-1]}")
        rows.append([f"CH{line.channel}", line.role, shown, f"a{line.agent}", line.host,
                     f"BCM {line.bcm_pin}", str(line.header_pin)])
    return rows


TABLE_HEADINGS = ["channel", "role", "client", "agent", "host", "BCM line", "header pin"]


def format_table(rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """``rows`` under :data:`TABLE_HEADINGS`: aligned text, or a Markdown table."""
    if markdown:
        return "\n".join("| " + " | ".join(row) + " |" for row in (
            TABLE_HEADINGS, ["---"] * len(TABLE_HEADINGS), *rows))
    widths = [max(len(str(r[i])) for r in (TABLE_HEADINGS, *rows))
              for i in range(len(TABLE_HEADINGS))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths,
                                                                    strict=True)).rstrip()
                     for row in (TABLE_HEADINGS, *rows))


def header_picture(wiring: Wiring, host: str) -> str:
    """The 40-pin header of ``host`` as text, its probed pins marked with their channel
    and every ground pin marked for the probes' ground clips."""
    probed = {line.header_pin: line for line in wiring.lines if line.host == host}
    bcm_at = {pin: bcm for bcm, pin in HEADER_PIN.items()}

    def label(pin: int) -> str:
        if pin in probed:
            line = probed[pin]
            return f"BCM {line.bcm_pin} <- CH{line.channel} ({line.role})"
        if pin in GROUND_PINS:
            return "GND (probe ground)"
        return POWER_PINS.get(pin) or f"BCM {bcm_at[pin]}"

    rows = [f"{host}: 40-pin header, pin 1 top left"]
    for left in range(1, 40, 2):
        rows.append(f"{label(left):>36} {left:>2} | {left + 1:<2} {label(left + 1)}")
    return "\n".join(rows)
