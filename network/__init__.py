"""The network a run builds: namespaces as hosts, veth links and a bridge as the switch.

Everything a :class:`~mqttbed.network.topology.Topology` creates carries one run-unique
name prefix, so :func:`~mqttbed.network.topology.reap` finds and removes all of it after
the run, or after the process that built it died.
"""
