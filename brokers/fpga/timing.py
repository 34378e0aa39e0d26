"""The modelled hardware latency of the FPGA broker's pipeline (seed 000, sections 5-6).

What the paper gives:

- parser, lookup engine, message queue and packet generator all run at 100 MHz and accept
  one PUBLISH or SUBSCRIBE per cycle (6.2);
- the lookup engine has three stages (topic, subscriber, execute): 3 cycles, 30 ns; the
  message queue needs at least 2 cycles and runs beside the lookup, so the lookup is on
  the critical path (6.3);
- receive to send inside the broker took 799.2 ns (6.3, Fig. 10), the only end-to-end
  figure; its split over parser and packet generator (Fig. 10) is not in the text;
- the rewriter issues one lookup request per rewritten name, one per cycle (5.3);
- the UDP/IP stack and the 10GbE subsystem carry 64 bits at 156.25 MHz: 10 Gbit/s (6.2).

The model built from those, for a packet of ``L`` MQTT bytes sent as copies ``i = 0..n-1``
(in send order), copy ``i`` found under rewritten name ``j_i``:

    read_i  = max(j_i, read_{i-1} + 1)                   Subscriber Table reads, 1/cycle
    ready_i = T_proc + read_i * T_clk                    T_proc = 799.2 ns, T_clk = 10 ns
    send_i  = max(ready_i, send_{i-1} + T_wire(L))       one frame at a time on the line
    T_wire(L) = (max(14 + 20 + 8 + L + 4, 64) + 8 + 12) bytes * 8 / 10 Gbit/s

(Ethernet, IPv4 and UDP headers, FCS, 64-byte minimum frame, preamble and inter-frame
gap). ``send_0`` is the first copy's receive-to-send time: 799.2 ns when the topic itself
has subscribers. A reply to CONNECT, SUBSCRIBE, UNSUBSCRIBE or PINGREQ is one copy:
799.2 ns (the paper: "in the case of SUBSCRIBE, this delay time is used to add new
subscriber destination information").

The first copy's time is the paper's measured constant, not derived; what the model adds
is how the copies after it queue behind the line, which is what makes the modelled
arrival spread grow with the number of subscribers. A 76-byte PUBLISH (64-byte payload on
``sync/pmu``) takes 113.6 ns on the wire, so 100 subscribers of one topic are served
from 799.2 ns to 799.2 + 99 * 113.6 = 12,045.6 ns after the PUBLISH arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict

ETHERNET_IP_UDP_HEADER_BYTES = 14 + 20 + 8
FCS_BYTES = 4
MIN_FRAME_BYTES = 64
PREAMBLE_AND_GAP_BYTES = 8 + 12


class TimingDescription(BaseModel):
    """A :class:`PipelineTiming`'s constants and formula, as a run records them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    clock_mhz: float
    broker_processing_ns: float
    lookup_stages: int
    message_queue_min_cycles: int
    line_rate_gbps: float
    cycle_ns: float
    lookup_ns: float
    formula: str = ("send_i = max(T_proc + read_i*T_clk, send_(i-1) + T_wire(L)); "
                    "read_i = max(j_i, read_(i-1)+1); "
                    "T_wire(L) = (max(46+L, 64) + 20) bytes * 8 / line rate")
    source: str = ("seed 000 sections 5.3, 5.4, 6.2, 6.3; T_proc is the paper's measured "
                   "799.2 ns, the rest is derived, not measured on hardware")


@dataclass(frozen=True)
class PipelineTiming:
    """Constants of the modelled pipeline; defaults are the paper's."""

    clock_mhz: float = 100.0
    broker_processing_ns: float = 799.2
    lookup_stages: int = 3
    message_queue_min_cycles: int = 2
    line_rate_gbps: float = 10.0

    @property
    def cycle_ns(self) -> float:
        return 1_000.0 / self.clock_mhz

    @property
    def lookup_ns(self) -> float:
        """Lookup engine latency: one cycle per stage (30 ns in the paper)."""
        return self.lookup_stages * self.cycle_ns

    def wire_ns(self, mqtt_bytes: int) -> float:
        """Time one copy of ``mqtt_bytes`` occupies the 10GbE line, gaps included."""
        frame = max(ETHERNET_IP_UDP_HEADER_BYTES + mqtt_bytes + FCS_BYTES, MIN_FRAME_BYTES)
        return (frame + PREAMBLE_AND_GAP_BYTES) * 8 / self.line_rate_gbps

    def reply_ns(self) -> float:
        """Receive-to-send time of a single reply (CONNACK, SUBACK, UNSUBACK, PINGRESP)."""
        return self.broker_processing_ns

    def copy_send_ns(self, name_indices: Sequence[int], mqtt_bytes: int) -> list[float]:
        """Return each copy's receive-to-send time, for copies found under ``name_indices``."""
        cycle, wire, base = self.cycle_ns, self.wire_ns(mqtt_bytes), self.broker_processing_ns
        sends: list[float] = []
        read = -1
        send = float("-inf")
        for name_index in name_indices:
            read = max(name_index, read + 1)
            send = max(base + read * cycle, send + wire)
            sends.append(send)
        return sends

    def describe(self) -> TimingDescription:
        """Return the constants and the formula, for a run's metadata."""
        return TimingDescription(**asdict(self), cycle_ns=self.cycle_ns,
                                 lookup_ns=self.lookup_ns)
