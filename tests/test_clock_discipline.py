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
import socket
import subprocess
import time
from pathlib import Path

import pytest

from mqttbed.agents.clock_sync import combine
from mqttbed.core.clock_discipline import (
    ClockDiscipline,
    ClockParseError,
    parse_chronyc_tracking,
    parse_pmc_time_status,
    read_discipline,
)
from mqttbed.core.protocol import ClockEstimate, ClockProbe

CHRONYD = "/usr/sbin/chronyd"


class Chronyd:
    """One chronyd in the foreground, its files in ``root`` (0700, as chronyd demands)."""

    def __init__(self, root: Path, lines: list[str]):
        root.mkdir(mode=0o700)
        self.socket = root / "chronyd.sock"
        (root / "chrony.conf").write_text("\n".join([
            *lines, f"bindcmdaddress {self.socket}", "cmdport 0",
            f"pidfile {root / 'chronyd.pid'}", ""]))
        self.log = root / "chronyd.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([CHRONYD, "-x", "-d", "-u", "root", "-f",
                                          str(root / "chrony.conf")], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def tracking(self, csv: bool = True) -> str:
        """``chronyc [-c] tracking`` against this daemon, once it answers."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = subprocess.run(["chronyc", "-h", str(self.socket),
                                   *(["-c"] if csv else []), "tracking"],
                                  capture_output=True, text=True, timeout=5, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"chronyd did not answer: {self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


@pytest.mark.integration
def test_chrony_tracking_of_a_real_chronyd_before_and_after_it_synchronises(tmp_path):
    if not Path(CHRONYD).exists() or shutil.which("chronyc") is None:
        pytest.fail("chrony is not installed: scripts/system-deps.sh installs it "
                    "(`make install`)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
