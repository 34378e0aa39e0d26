"""``python -m mqttbed.brokers.mqttsn``: run the MQTT-SN gateway."""

import sys

from mqttbed.brokers.mqttsn.server import main

sys.exit(main())
