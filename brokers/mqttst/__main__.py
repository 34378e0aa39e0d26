"""``python -m mqttbed.brokers.mqttst node ...`` runs one node; without ``node``, a cluster."""

import sys

if sys.argv[1:2] == ["node"]:
    from mqttbed.brokers.mqttst.run_node import main

    sys.exit(main(sys.argv[2:]))
from mqttbed.brokers.mqttst.cli import main

sys.exit(main(sys.argv[1:]))
