"""Any running broker, by URL: the ``external`` backend.

``broker: {backend: external, url: "mqtt://HOST:PORT"}``. mqttbed checks the broker
answers before the run and while it measures, optionally samples its process (on this
machine, or over SSH on the lab host ``broker.host`` names) and its ``$SYS`` topics, and
never starts, stops or signals it.

- :mod:`.options`: the ``broker:`` section and the URL forms it takes.
- :mod:`.process`: finding the broker's process to sample, here or on a lab host.
- :mod:`.backend`: the backend; :mod:`.declaration`: what mqttbed knows of it.
"""
