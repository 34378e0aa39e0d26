"""mqttbed: testbed orchestration and measurement for MQTT-family brokers.

The code lives in the top-level folders (core/, campaigns/, controller/, ...), each
mapped into this namespace by setuptools ``package-dir``.
"""

from importlib.metadata import PackageNotFoundError, version

# The one version is pyproject.toml's, as the installed package's metadata carries it.
try:
    __version__ = version("mqttbed")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"
