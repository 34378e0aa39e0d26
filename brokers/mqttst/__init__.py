"""MQTT-ST (seed 001, Longo et al.): a spanning tree of Mosquitto brokers, the tree logic ours.

Broker i is a real Mosquitto plus a tree node beside it; the nodes elect a root, build
a spanning tree over their links and forward every publication along it, once.

- :mod:`.tree`: root election and link roles, pure; :mod:`.bpdu`: the BPDU on PINGREQ.
- :mod:`.mqtt5`: the MQTT 5 packets a node speaks; :mod:`.session`: one connection's
  framing and QoS flows; :mod:`.local`: the node as a client of its Mosquitto;
  :mod:`.links`: a link between two nodes.
- :mod:`.forwarding`: origin marks and duplicate suppression; :mod:`.capability`: C.
- :mod:`.node`: one node; :mod:`.run_node`: its command line and stats file.
- :mod:`.cluster`: K brokers on one host, the API the ``mqtt-st`` backend uses;
  :mod:`.topology`: cluster shapes and the converged-tree check, pure;
  :mod:`.cli`: ``mqttbed broker run mqtt-st``; :mod:`.signalling`: PINGREQ sizes.
"""

from mqttbed.brokers.mqttst.declaration import DECLARATION

__all__ = ["DECLARATION"]
