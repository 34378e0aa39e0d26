"""Simulation speed of the FPGA broker's RTL: packets per second through the Verilated
design, against the behavioural model's ``BrokerModel.handle`` on the same packets.

One subscriber of ``sync/pmu``, N PUBLISHes of 76 bytes (64-byte payload), no sockets on
either side: the RTL harness's ``--bench`` mode drives the design one beat (W bytes) per
cycle and clocks it until idle after each packet; the model is called in this process. Prints
packets/s of each, the RTL's cycles per packet and simulated cycles per second, and the
ratio RTL / model, measured in this one script. Then the design's own rate: ``--bench-stream``
drives PUBLISHes of a one-level topic (`pmu`) back to back without waiting for idle, the
paper's one-PUBLISH-per-cycle case.

    .venv/bin/python bench/fpga_rtl_speed.py [--packets 50000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.brokers.fpga.rtl.build import ensure_sim
from mqttbed.core.mqtt_codec import Subscribe, encode, encode_publish


def model_packets_per_s(packets: int) -> float:
    model = BrokerModel()
    model.handle(encode(Subscribe(1, (("sync/pmu", 0),))), ("127.0.0.1", 40000))
    publish = encode_publish("sync/pmu", bytes(64))
    start = time.monotonic()
    for _ in range(packets):
        model.handle(publish, ("127.0.0.1", 40001))
    return packets / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=50_000)
    args = parser.parse_args()
    binary = ensure_sim()

    def rtl(mode: str) -> dict:
        result = json.loads(subprocess.run([str(binary), mode, str(args.packets)],
                                           capture_output=True, text=True, check=True).stdout)
        cycles_per_s = result["packets_per_s"] * result["cycles_per_packet"]
        print(f"{'RTL (Verilator) ' + mode:30} {result['packets_per_s']:12,.0f} packets/s  "
              f"({result['cycles_per_packet']:.2f} cycles/packet, "
              f"{cycles_per_s / 1e6:.2f} M cycles/s)")
        return result

    one = rtl("--bench")
    model = model_packets_per_s(args.packets)
    print(f"{'model (Python)':30} {model:12,.0f} packets/s")
    print(f"{'RTL --bench / model':30} {one['packets_per_s'] / model:12.3f}")
    rtl("--bench-stream")


if __name__ == "__main__":
    main()
