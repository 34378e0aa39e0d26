"""What the FPGA broker model adds to the results: its PUBLISH latencies, per packet.

With ``engine: rtl`` the broker is the Verilated RTL design instead: its figures are the
design's cycles from a PUBLISH's first byte in to the last byte of each copy out, in ns at
the design clock (``rtl_*``), beside the UDP harness's measured receive-to-send time
(``emulator_*``); the modelled figures stay empty.

The model times every PUBLISH twice: the modelled hardware pipeline (:mod:`.timing`,
seed 000's 799.2 ns plus the line queueing of each further copy) and its own measured
receive-to-send time on this machine. It keeps the per-packet values (the most recent
``LATENCY_SAMPLES_KEPT`` of them) and hands them over as records, so a point's
percentiles are pooled over every packet of its runs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from mqttbed.core.sections import BackendSection, Distribution, SectionRecords

# model field in the records file -> section figure
_FIGURES = {
    "modelled_first_copy": "modelled_first_copy_ns",
    "modelled_last_copy": "modelled_last_copy_ns",
    "modelled_spread": "modelled_spread_ns",
    "measured_first_copy": "emulator_first_copy_ns",
    "measured_last_copy": "emulator_last_copy_ns",
    "measured_spread": "emulator_spread_ns",
    "copies": "copies_per_publish",
    # engine: rtl, the Verilated design's cycle counts at its clock (brokers/fpga/rtl)
    "rtl_first_copy": "rtl_first_copy_ns",
    "rtl_last_copy": "rtl_last_copy_ns",
    "rtl_spread": "rtl_spread_ns",
}


class FpgaPipelineLatency(BackendSection):
    """PUBLISH latencies the FPGA broker model reports of itself, in nanoseconds."""

    key: ClassVar[str] = "hardware_latency"
    title: ClassVar[str] = "What the FPGA broker model reports of itself"
    note: ClassVar[str] = (
        "Modelled: the FPGA pipeline of seed 000 (processing 799.2 ns at 100 MHz, then one "
        "10GbE frame time per further copy); emulator: the behavioural model's (or, with "
        "engine rtl, the Verilator harness's) own measured receive-to-send time on this "
        "machine; rtl: the RTL design's cycle count, receive to send, at 100 MHz. None was "
        "validated against a board.")

    publish_packets: int = Field(0, description="PUBLISH packets the model handled")
    copies_per_publish: float | None = Field(None, description="mean copies sent per PUBLISH")
    modelled_first_copy_ns: Distribution = Field(default_factory=Distribution)
    modelled_last_copy_ns: Distribution = Field(default_factory=Distribution)
    modelled_spread_ns: Distribution = Field(
        default_factory=Distribution, description="last minus first copy, modelled")
    emulator_first_copy_ns: Distribution = Field(default_factory=Distribution)
    emulator_last_copy_ns: Distribution = Field(default_factory=Distribution)
    emulator_spread_ns: Distribution = Field(
        default_factory=Distribution, description="last minus first copy, measured")
    rtl_first_copy_ns: Distribution = Field(
        default_factory=Distribution,
        description="engine rtl: cycles from the first byte in to the first copy's last byte "
                    "out, times the clock period")
    rtl_last_copy_ns: Distribution = Field(default_factory=Distribution)
    rtl_spread_ns: Distribution = Field(
        default_factory=Distribution, description="last minus first copy, design cycles")


def publish_records(model_records: dict[str, Any] | None) -> SectionRecords:
    """The section's records from the model's records file (nothing if it kept none)."""
    publish = (model_records or {}).get("publish")
    if not publish:
        return {}
    records: SectionRecords = {"publish_packets": [float(publish["packets"])]}
    for field, figure in _FIGURES.items():
        records[figure] = [float(v) for v in publish["values"].get(field, [])]
    return records
