"""``python -m mqttbed.brokers.adaptive``: run the adaptive broker."""

import sys

from mqttbed.brokers.adaptive.server import main

sys.exit(main())
