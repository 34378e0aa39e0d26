"""The FPGA MQTT broker of seed 000: a behavioural model over UDP, and deployment to a board.

- :mod:`.tables`: Topic Table and Subscriber Table, bounded hash tables, ``#`` rewriting.
- :mod:`.timing`: the modelled hardware latency of the broker's pipeline.
- :mod:`.model`: what the broker answers to each datagram.
- :mod:`.server`: the model as a UDP server (``mqttbed broker run fpga-model``).
- :mod:`.backend`: the ``fpga`` broker backend (the model, or a board over SSH).
- :mod:`.board`: programming a Zynq UltraScale+ board with ``fpgautil`` over SSH.
- :mod:`.rtl`: the broker as synthesizable Verilog, its Verilator UDP harness and builds
  (``engine: rtl``).
"""

from mqttbed.brokers.fpga.declaration import DECLARATION

__all__ = ["DECLARATION"]
