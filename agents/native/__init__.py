"""The agents' native load engine: every MQTT client of one agent process in C.

``src/`` is the engine (built into a shared library on first use, see :mod:`.engine`);
:mod:`mqttbed.agents.native_session` drives it with the same surface as the Python
session, which stays the fallback where the engine cannot run.
"""
