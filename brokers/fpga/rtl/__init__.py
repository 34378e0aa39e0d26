"""The FPGA broker as RTL: Verilog sources, the Verilator UDP harness, and their builds."""
