"""mqttbed: testbed orchestration and measurement for MQTT-family brokers.

The code lives in the top-level folders (core/, campaigns/, controller/, ...), each
mapped into this namespace by setuptools ``package-dir``.
"""

__version__ = "0.1.0"
