"""Clock disciplines: chrony read from a real chronyd, PTP's pmc output, and how an agent
chooses between them and the HTTP probe.

The chrony test runs two real chronyd (4.3 here) with ``-x`` (they never touch this
machine's clock): a server on loopback with ``local stratum 8`` and a client of it,
each with its command socket in a private directory. ``chronyc -c tracking`` is read
from the client before and after it synchronises.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from mqttbed.agents.clock_sync import combine
from mqttbed.controller.controller import create_controller
from mqttbed.controller.tokens import TokenRole, create_token
from mqttbed.core.clock_discipline import (
    ClockDiscipline,
    ClockParseError,
    parse_chronyc_tracking,
    parse_pmc_time_status,
    read_discipline,
)
from mqttbed.core.protocol import ClockEstimate, ClockProbe
from mqttbed.core.settings import Settings, SettingsError
from tests.chronyd import CHRONYD, Chronyd, free_udp_port


def require_chrony() -> None:
    """Fail (not skip) where chrony is missing: the test profile installs it."""
    if not Path(CHRONYD).exists() or shutil.which("chronyc") is None:
        pytest.fail("chrony is not installed: scripts/system-deps.sh installs it "
                    "(`make install`)")


@pytest.mark.integration
def test_chrony_tracking_of_a_real_chronyd_before_and_after_it_synchronises(tmp_path):
    require_chrony()
    port = free_udp_port()
    client = Chronyd(tmp_path / "client", [
        f"server 127.0.0.1 port {port} iburst minpoll -4 maxpoll -4", "port 0",
        "acquisitionport 0"])
    server = None
    try:
        # no server yet: not synchronised, and no bound
        unsynced = parse_chronyc_tracking(client.tracking())
        assert (unsynced.source, unsynced.synchronised, unsynced.error_bound_ns) == (
            "chrony", False, None)
        assert unsynced.detail == "chronyd is not synchronised (leap status 'Not synchronised')"

        server = Chronyd(tmp_path / "server", [
            "local stratum 8", f"port {port}", "bindaddress 127.0.0.1", "allow 127.0.0.1"])
        local = parse_chronyc_tracking(server.tracking())
        assert local.synchronised and local.reference == "7F7F0101"
        assert local.detail.startswith("chronyd's own local reference")

        deadline = time.monotonic() + 15
        while not (line := client.tracking()).startswith("7F000001,127.0.0.1,9,"):
            assert time.monotonic() < deadline, f"client never synchronised: {line}"
            time.sleep(0.1)
        fields = line.strip().split(",")
        synced = parse_chronyc_tracking(line)
        system_s, delay_s, dispersion_s = float(fields[4]), float(fields[10]), float(fields[11])
        assert synced == ClockDiscipline(
            source="chrony", synchronised=True, offset_ns=round(-system_s * 1e9),
            error_bound_ns=round((abs(system_s) + dispersion_s + delay_s / 2) * 1e9),
            reference="7F000001 (127.0.0.1)", detail="stratum 9")
        # the sign, against chronyc's own words: CSV positive is "slow" (behind). With -x
        # the offset drifts between any two reads (tens of ns per ms), so read CSV, words,
        # CSV again until both CSV reads have one sign and the words' magnitude lies
        # between theirs: then the words are of a value of that sign.
        for _ in range(100):
            before, human, after = (client.tracking(), client.tracking(csv=False),
                                    client.tracking())
            first, last = float(before.split(",")[4]), float(after.split(",")[4])
            match = re.search(r"System time\s*: ([0-9.]+) seconds (slow|fast) of NTP time",
                              human)
            assert match is not None, human
            words = float(match.group(1))
            if first * last > 0 and (min(abs(first), abs(last)) - 1e-9 <= words
                                     <= max(abs(first), abs(last)) + 1e-9):
                break
        else:
            pytest.fail("chronyd's offset changed sign, or the words fell outside both "
                        "CSV reads, in every one of 100 tries")
        assert (first > 0) == (match.group(2) == "slow")
        assert (parse_chronyc_tracking(before).offset_ns > 0) == (match.group(2) == "fast")
        # and read_discipline finds it the way an agent does
        found = read_discipline(chronyc_socket=str(client.socket), pmc="/nonexistent/pmc")
        assert (found.source, found.synchronised) == ("chrony", True)
        # microseconds on loopback once chronyd has a few samples; its first ones, taken
        # on a loaded machine, can carry a dispersion of a second (946 ms seen at load 20)
        deadline = time.monotonic() + 30
        while not 0 < found.error_bound_ns < 1_000_000:
            assert time.monotonic() < deadline, f"the bound never settled: {found}"
            time.sleep(0.2)
            found = read_discipline(chronyc_socket=str(client.socket), pmc="/nonexistent/pmc")
    finally:
        client.stop()
        if server is not None:
            server.stop()


def test_chrony_output_that_is_not_tracking_is_refused_with_what_it_was():
    with pytest.raises(ClockParseError, match=r"printed 3 fields, expected 14: '506,Cannot"):
        parse_chronyc_tracking("506,Cannot talk,daemon")
    bad = "7F000001,x,nine,1.0,0,0,0,0,0,0,0,0,0,Normal"
    with pytest.raises(ClockParseError, match="invalid literal for int"):
        parse_chronyc_tracking(bad)


# What linuxptp's pmc prints for GET TIME_STATUS_NP (its man page's layout).
PMC_SYNCED = """sending: GET TIME_STATUS_NP
\t90e2ba.fffe.20c7f8-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP
\t\tmaster_offset              -37
\t\tingress_time               1504080283942003613
\t\tcumulativeScaledRateOffset +0.000000000
\t\tscaledLastGmPhaseChange    0
\t\tgmTimeBaseIndicator        0
\t\tlastGmPhaseChange          0x0000'0000000000000000.0000
\t\tgmPresent                  true
\t\tgmIdentity                 001122.fffe.334455
"""


def test_pmc_time_status_gives_the_offset_to_the_grandmaster_as_the_bound():
    synced = parse_pmc_time_status(PMC_SYNCED)
    assert (synced.source, synced.synchronised, synced.offset_ns, synced.error_bound_ns,
            synced.reference) == ("ptp", True, -37, 37, "001122.fffe.334455")
    alone = parse_pmc_time_status(PMC_SYNCED.replace("gmPresent                  true",
                                                     "gmPresent                  false"))
    assert (alone.synchronised, alone.error_bound_ns) == (False, None)
    with pytest.raises(ClockParseError, match="pmc printed no master_offset"):
        parse_pmc_time_status("sending: GET TIME_STATUS_NP\n")


def _probe(uncertainty_ns: int) -> ClockEstimate:
    return ClockEstimate(offset_ns=5_000, uncertainty_ns=uncertainty_ns, method="ntp",
                         probe_uncertainty_ns=uncertainty_ns)


def _chrony(bound_ns: int) -> ClockDiscipline:
    return ClockDiscipline(source="chrony", synchronised=True, offset_ns=0,
                           error_bound_ns=bound_ns)


def test_two_disciplined_clocks_beat_the_probe_only_when_their_bounds_are_smaller():
    answer = ClockProbe(t_recv_ns=0, t_send_ns=0, realtime_minus_monotonic_ns=9_000_000,
                        discipline=_chrony(30_000))
    # agent = controller + offset: the controller's realtime - monotonic minus ours
    chosen = combine(_probe(800_000), answer, _chrony(20_000), 1_000_000)
    assert chosen == ClockEstimate(offset_ns=8_000_000, uncertainty_ns=50_000,
                                   method="chrony", discipline="chrony",
                                   discipline_error_ns=20_000, probe_uncertainty_ns=800_000)
    # the probe wins when it is tighter, and when either side is not disciplined
    assert combine(_probe(40_000), answer, _chrony(20_000), 1_000_000).method == "ntp"
    free = ClockDiscipline(source="none")
    kept = combine(_probe(800_000), answer, free, 1_000_000)
    assert (kept.method, kept.offset_ns, kept.uncertainty_ns, kept.discipline) == (
        "ntp", 5_000, 800_000, "none")
    silent = answer.model_copy(update={"discipline": None})
    assert combine(_probe(800_000), silent, _chrony(20_000), 1_000_000).method == "ntp"


def _chrony_of(reference: str, bound_ns: int = 20_000) -> ClockDiscipline:
    return ClockDiscipline(source="chrony", synchronised=True, offset_ns=0,
                           error_bound_ns=bound_ns, reference=reference)


def test_a_controllers_local_chrony_clock_counts_only_for_an_agent_synchronised_to_it():
    # chronyd serving its own clock (`local stratum N`) is synchronised to itself only
    local = parse_chronyc_tracking(
        "7F7F0101,,8,1764460000.0,0.000000000,0.0,0.0,0.0,0.0,0.0,0.0,0.000010,0.0,Normal")
    assert local.synchronised and local.reference == "7F7F0101"
    answer = ClockProbe(t_recv_ns=0, t_send_ns=0, realtime_minus_monotonic_ns=9_000_000,
                        discipline=local)
    to_controller = _chrony_of("0A0A0001 (10.10.0.1)")
    chosen = combine(_probe(800_000), answer, to_controller, 1_000_000, "10.10.0.1")
    assert (chosen.method, chosen.offset_ns, chosen.uncertainty_ns) == (
        "chrony", 8_000_000, 20_000 + 10_000)
    # the reference id alone (chronyc printed no name) is the IPv4 address's 32 bits
    bare = _chrony_of("0A0A0001")
    assert combine(_probe(800_000), answer, bare, 1_000_000, "10.10.0.1").method == "chrony"
    # an IPv6 source's reference id is a hash: its name must be the controller's address
    six = _chrony_of("A1B2C3D4 (fd00::1)")
    assert combine(_probe(800_000), answer, six, 1_000_000, "fd00::1").method == "chrony"
    # synchronised elsewhere (a pool, another lab server), to its own local clock, or to
    # a controller whose address the agent does not know: the probe, whatever the bounds
    for ours, address in [(_chrony_of("C0A80101 (192.168.1.1)"), "10.10.0.1"),
                          (to_controller, "10.10.0.2"), (to_controller, "controller.lab"),
                          (to_controller, None), (local, "10.10.0.1")]:
        kept = combine(_probe(800_000), answer, ours, 1_000_000, address)
        assert (kept.method, kept.offset_ns) == ("ntp", 5_000), (ours, address)
    # an agent's own local clock never counts, even against a controller synchronised to
    # a real server
    served = answer.model_copy(update={"discipline": _chrony_of("C0A80101 (192.168.1.1)")})
    assert combine(_probe(800_000), served, local, 1_000_000, "10.10.0.1").method == "ntp"
    assert combine(_probe(800_000), served, to_controller, 1_000_000,
                   "10.10.0.1").method == "chrony"


def test_the_chronyc_socket_setting_must_be_an_absolute_path(monkeypatch):
    monkeypatch.setenv("MQTTBED_CHRONYC_SOCKET", "run/chrony.sock")
    with pytest.raises(SettingsError, match=r"MQTTBED_CHRONYC_SOCKET: expected the absolute "
                                            r"path .* \(got 'run/chrony\.sock'\)"):
        Settings.load()


@pytest.mark.integration
def test_the_controller_answers_clock_probes_with_the_chronyd_its_settings_name(tmp_path):
    require_chrony()
    port = free_udp_port()
    server = Chronyd(tmp_path / "server", [
        "local stratum 8", f"port {port}", "bindaddress 127.0.0.1", "allow 127.0.0.1"])
    try:
        server.tracking()   # answering
        settings = Settings(data_dir=tmp_path / "data", chronyc_socket=str(server.socket))
        with create_controller(settings) as controller, httpx.Client(
                base_url=controller.url, timeout=10, headers={
                    "authorization": "Bearer " + create_token(
                        controller.sessions, "probe", TokenRole.AGENT)}) as http:
            response = http.post("/agent/v1/clock")
            response.raise_for_status()
            answer = ClockProbe.model_validate_json(response.content)
    finally:
        server.stop()
    assert answer.discipline is not None
    assert (answer.discipline.source, answer.discipline.synchronised,
            answer.discipline.reference) == ("chrony", True, "7F7F0101")
