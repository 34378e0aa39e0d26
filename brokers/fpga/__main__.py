"""``python -m mqttbed.brokers.fpga``: run the FPGA broker model."""

import sys

from mqttbed.brokers.fpga.server import main

sys.exit(main())
