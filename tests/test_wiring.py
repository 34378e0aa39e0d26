"""The wiring plan: every scope-probed client keeps its agent, host and header line across
a sweep; lines stay on the header; a spec needing more lines than a host has is refused;
`mqttbed lab wiring` prints the table; runs record it and the report shows it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mqttbed.campaigns.spec import CampaignSpec, expand_points, parse_spec
from mqttbed.campaigns.wiring import (
    DEFAULT_LINES,
    HEADER_PIN,
    format_table,
    header_picture,
    plan_wiring,
    sweep_wiring,
    table_rows,
)
from mqttbed.controller.assignments import agent_roles, agents_needed, plan_assignments
from mqttbed.controller.scope_recorder import ScopeRecorder, wire_probes
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import Assignment, Endpoint, Role
from mqttbed.core.run_record import RunRecord, run_record

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT = Endpoint(host="127.0.0.1", port=1883)
PI_B_LINES = [17, 27, 22, 5, 6, 13]   # pi-b's own lines: the probes take the first


def two_pis(sweep: dict | None = None, *, b_lines: list[int] | None = PI_B_LINES,
            channels: dict | None = None) -> dict:
    """A scope campaign on two lab hosts: pi-a (one agent, default lines) and pi-b (two
    agents, its own lines)."""
    return {
        "name": "wired",
        "agents": {"gpio": "gpiod", "hosts": [
            {"name": "pi-a", "host": "pi@10.0.0.11"},
            {"name": "pi-b", "host": "pi@10.0.0.12", "count": 2,
             **({"gpio_pins": b_lines} if b_lines is not None else {})}]},
        "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 20, "messages": 40,
                     "warmup_messages": 5},
        "measurement": {"scope": {"resource": "TCPIP0::192.168.1.50::INSTR", "channels":
                                  channels or {"publisher": 1,
                                               "subscribers": {"first": 2, "last": 3}}}},
        **({"sweep": sweep} if sweep else {}),
    }


def host_order(spec: CampaignSpec) -> list[str]:
    """Agent index -> host, as agent_sites.open_sites starts them (hosts in order)."""
    return [h.name or h.host for h in spec.agents.hosts for _ in range(h.count)]


def lines_of(spec: CampaignSpec, host: str) -> list[int]:
    entry = next(h for h in spec.agents.hosts if (h.name or h.host) == host)
    return list(entry.gpio_pins or DEFAULT_LINES)


def assign(spec: CampaignSpec) -> tuple[list[str], dict[str, Assignment]]:
    """The point's agents (as many as the engine starts) and their assignments."""
    agent_ids = [f"agent-{i}" for i in range(agents_needed(spec))]
    return agent_ids, plan_assignments(spec, "r", "c", ENDPOINT, agent_ids)


def test_every_probed_client_keeps_its_host_and_line_from_2_to_100_subscribers():
    spec = parse_spec(two_pis({"workload.subscribers": list(range(2, 101))}))
    points = expand_points(spec)
    assert len(points) == 99
    places: dict[int, set[tuple[str, str, int]]] = {}
    for point in points:
        agent_ids, assignments = assign(point.spec)
        hosts = dict(zip(agent_ids, host_order(point.spec), strict=False))
        publisher, subscribers = wire_probes(point.spec.measurement.scope, assignments)
        n = point.spec.workload.subscribers
        assert [p.client_id for p in subscribers] == ["sub-0", f"sub-{n - 1}"]
        for probe in (publisher, *subscribers):
            places.setdefault(probe.channel, set()).add(
                (probe.agent_id, hosts[probe.agent_id], probe.pin))
    # one agent, one host, one line per channel over the whole sweep; the three probes on
    # the three agents of two hosts, each host's probes on its first usable lines
    assert places == {1: {("agent-0", "pi-a", 2)}, 2: {("agent-1", "pi-b", 17)},
                      3: {("agent-2", "pi-b", 27)}}


def test_every_line_is_on_its_hosts_header_and_no_other_client_shares_a_probed_one():
    spec = parse_spec(two_pis({"workload.subscribers": [2, 3, 7, 30, 100]}))
    for point in expand_points(spec):
        agent_ids, assignments = assign(point.spec)
        hosts = dict(zip(agent_ids, host_order(point.spec), strict=False))
        publisher, subscribers = wire_probes(point.spec.measurement.scope, assignments)
        probed = {(hosts[p.agent_id], p.pin): p.client_id for p in (publisher, *subscribers)}
        clients = 0
        for agent, assignment in assignments.items():
            usable = lines_of(point.spec, hosts[agent])
            for client in assignment.clients:
                clients += 1
                assert client.gpio_pin in usable, (point.params, client.client_id)
                owner = probed.get((hosts[agent], client.gpio_pin))
                assert owner in (None, client.client_id), (point.params, client.client_id)
        assert clients == 1 + point.spec.workload.subscribers


def test_without_a_scope_a_hundred_clients_on_one_agent_stay_on_the_header():
    spec = parse_spec({"name": "many", "agents": {"count": 1},
                       "workload": {"publishers": 1, "subscribers": 100}})
    _, assignments = assign(spec)
    (assignment,) = assignments.values()
    pins = [c.gpio_pin for c in assignment.clients]
    assert len(pins) == 101 and set(pins) == set(DEFAULT_LINES)   # all 26, shared


def test_agent_roles_deals_the_clients_as_the_assignments_do():
    spec = parse_spec(two_pis({"workload.subscribers": [2, 9]}))
    for point in expand_points(spec):
        agent_ids, assignments = assign(point.spec)
        planned = agent_roles(point.spec, len(agent_ids))
        dealt = [frozenset(c.role.value for c in assignments[a].clients) for a in agent_ids]
        assert planned == dealt
        assert Role.PUBLISHER.value in planned[0]   # the probed publisher on agent 0


def test_a_host_with_fewer_lines_than_its_probes_is_refused_naming_host_and_count():
    with pytest.raises(SpecError, match=r"host pi-b: the scope probes 2 clients there, but "
                                        r"agents\.hosts\[1\]\.gpio_pins gives 1 GPIO line"):
        parse_spec(two_pis(b_lines=[17]))


def test_a_host_whose_probes_take_every_line_is_refused_once_it_runs_other_clients():
    spec = two_pis({"workload.subscribers": [2, 5]}, b_lines=[17, 27])
    # at N = 2 pi-b runs only its two probed clients; at N = 5 others too
    with pytest.raises(SpecError, match=r"sweep point \(workload\.subscribers=5\): host "
                                        r"pi-b: its 2 GPIO lines .* run 2 other clients"):
        parse_spec(spec)


@pytest.mark.parametrize("lines, says", [
    ([17, 28], r"agents\.hosts\.1\.gpio_pins: bad value \[17, 28\]: BCM 28 is not a GPIO "
               r"line of the 40-pin header"),
    ([17, -1], r"agents\.hosts\.1\.gpio_pins: bad value \[17, -1\]: BCM -1 is not"),
    ([17, 27, 17], r"agents\.hosts\.1\.gpio_pins: bad value \[17, 27, 17\]: BCM 17 is "
                   r"listed twice"),
])
def test_a_bad_header_line_names_the_field_and_the_value(lines, says):
    with pytest.raises(SpecError, match=says):
        parse_spec(two_pis(b_lines=lines))


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_lab_wiring_prints_one_table_for_the_whole_sweep(tmp_path, capsys):
    from mqttbed.controller.cli import main

    path = write(tmp_path, two_pis({"workload.subscribers": [2, 10, 100]}))
    assert main(["lab", "wiring", str(path)]) == 0
    out = capsys.readouterr().out
    assert "the same table for every point of the sweep (3 points)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("CH")]
    assert rows == [
        ["CH1", "publisher", "pub-0", "a0", "pi-a", "BCM", "2", str(HEADER_PIN[2])],
        ["CH2", "first", "subscriber", "sub-0", "a1", "pi-b", "BCM", "17",
         str(HEADER_PIN[17])],
        ["CH3", "last", "subscriber", "sub-1,", "sub-9,", "sub-99", "a2", "pi-b", "BCM",
         "27", str(HEADER_PIN[27])]]


def test_lab_wiring_says_when_the_sweep_makes_it_rewire(tmp_path, capsys):
    from mqttbed.controller.cli import main

    spec = two_pis({"agents.count": [1, 3]})
    spec["agents"].pop("hosts")
    assert main(["lab", "wiring", str(write(tmp_path, spec))]) == 0
    out = capsys.readouterr().out
    assert "the wiring changes within the sweep (2 tables)" in out
    assert "points: agents.count=1" in out and "points: agents.count=3" in out


def test_lab_wiring_names_a_refused_spec(tmp_path):
    from mqttbed.controller.cli import main

    with pytest.raises(SystemExit, match=r"mqttbed lab wiring: invalid campaign spec .*host "
                                         r"pi-b: the scope probes 2 clients"):
        main(["lab", "wiring", str(write(tmp_path, two_pis(b_lines=[17])))])


def recorded_scope(spec: CampaignSpec) -> dict:
    """A run's stored record with the scope as the recorder records it (before acquiring)."""
    _, assignments = assign(spec)
    recorder = ScopeRecorder(spec.measurement.scope, assignments, wiring=plan_wiring(spec))
    record = RunRecord()
    record.scope = recorder.metadata()
    return record.stored()


def test_a_run_records_each_channels_client_host_and_line():
    spec = parse_spec(two_pis({"workload.subscribers": [4]}))
    (point,) = expand_points(spec)
    scope = run_record(recorded_scope(point.spec)).scope
    assert scope is not None
    assert {c: (w.client, w.role, w.host, w.bcm_pin, w.header_pin)
            for c, w in scope.wiring.items()} == {
        "1": ("pub-0", "publisher", "pi-a", 2, 3),
        "2": ("sub-0", "first subscriber", "pi-b", 17, 11),
        "3": ("sub-3", "last subscriber", "pi-b", 27, 13)}
    assert scope.channels == {c: w.client for c, w in scope.wiring.items()}


def test_a_record_from_before_the_wiring_was_kept_still_loads():
    old = json.loads((ROOT / "tests" / "recorded" /
                      "run_metadata_quickstart_scoped.json").read_text())
    assert "wiring" not in old["scope"]
    scope = run_record(old).scope
    assert scope is not None and scope.channels and scope.wiring == {}


def test_the_report_shows_the_wiring_the_runs_recorded(tmp_path):
    from mqttbed.api.report import render_report
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.db import RunRow
    from mqttbed.core.settings import Settings

    spec = parse_spec(two_pis({"workload.subscribers": [2, 50]}))
    ctl = create_controller(Settings(data_dir=tmp_path / "data"), controller_url="")
    try:
        campaign_id = ctl.engine.create_campaign(spec)
        with ctl.sessions() as s:
            for run in s.query(RunRow).filter_by(campaign_id=campaign_id):
                run.run_metadata = recorded_scope(CampaignSpec.model_validate(run.spec))
            s.commit()
        html = render_report(ctl, campaign_id, standalone=True)
    finally:
        ctl.close()
    table = html[html.index('<table id="scope-wiring">'):]
    table = table[:table.index("</table>")]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in table.split("<tr>")[2:]]
    assert cells == [["CH1", "publisher", "pub-0", "pi-a", "2", "3", "2"],
                     ["CH2", "first subscriber", "sub-0", "pi-b", "17", "11", "2"],
                     ["CH3", "last subscriber", "sub-1, sub-49", "pi-b", "27", "13", "2"]]


def test_the_tutorials_wiring_picture_is_what_the_plan_draws():
    page = (ROOT / "docs" / "tutorials" / "oscilloscope.md").read_text()
    spec_text = re.search(r"cat > bench\.yaml <<'SPEC'\n(.*?)\nSPEC\n", page, re.DOTALL)
    assert spec_text is not None
    spec = parse_spec(yaml.safe_load(spec_text[1]))
    (_, plans), = sweep_wiring([(str(p.params), p.spec) for p in expand_points(spec)])
    assert format_table(table_rows(plans), markdown=True) in page
    for host in ("pi-01", "pi-02"):
        assert header_picture(plans[0], host) in page
