"""Oscilloscopes over SCPI: drivers per dialect, declarative controls, the virtual scope.

- :mod:`.controls`: the declarative :class:`~.controls.Control` / ``Command`` / ``Query``.
- :mod:`.base`: the :class:`~.base.Oscilloscope` protocol every driver implements.
- :mod:`.rigol`, :mod:`.keysight`: ``rigol-ds1000z`` and ``keysight-x``.
- :mod:`.drivers`: :func:`~.drivers.open_scope` (resource + dialect -> driver).
- :mod:`.virtual`: a SCPI server speaking the Rigol dialect, fed with GPIO edges.

Nothing here imports pyvisa at import time.
"""

from mqttbed.instruments.scope.base import Oscilloscope, ScopeReplyError
from mqttbed.instruments.scope.drivers import DRIVERS, open_scope
from mqttbed.instruments.scope.keysight import KeysightInfiniiVisionX
from mqttbed.instruments.scope.rigol import RigolDS1000Z

__all__ = ["DRIVERS", "KeysightInfiniiVisionX", "Oscilloscope", "RigolDS1000Z",
           "ScopeReplyError", "open_scope"]
