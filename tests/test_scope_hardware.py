"""A real oscilloscope, opt in by address: identify, configure, one acquisition.

Set ``MQTTBED_SCOPE_RESOURCE`` (e.g. ``TCPIP0::192.168.1.50::5555::SOCKET``) and
``MQTTBED_SCOPE_DIALECT`` (``rigol-ds1000z`` or ``keysight-x``). The publisher's GPIO goes
to channel 1 and a subscriber's to channel 2 (``MQTTBED_SCOPE_CHANNELS=1,2`` to change).
With ``MQTTBED_SCOPE_EXPECT_TRIGGER=1`` edges must arrive during the acquisition (e.g. a
running campaign, or a pulse generator on both inputs) and the test requires a trigger and
a delay; without it a missing trigger is allowed (no signal connected).
"""

from __future__ import annotations

import os

import pytest

from mqttbed.instruments.scope import open_scope

RESOURCE = os.environ.get("MQTTBED_SCOPE_RESOURCE")
DIALECT = os.environ.get("MQTTBED_SCOPE_DIALECT")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not (RESOURCE and DIALECT),
                       reason="no scope: set MQTTBED_SCOPE_RESOURCE and MQTTBED_SCOPE_DIALECT"),
]


def test_a_real_scope_identifies_configures_and_runs_one_acquisition():
    publisher, subscriber = (int(c) for c in
                             os.environ.get("MQTTBED_SCOPE_CHANNELS", "1,2").split(","))
    expect_trigger = os.environ.get("MQTTBED_SCOPE_EXPECT_TRIGGER") == "1"
    scope = open_scope(RESOURCE, DIALECT)
    try:
        identity = scope.identify()
        assert len(identity.split(",")) == 4, identity
        scope.configure(publisher, [subscriber], timebase_s_per_div=1e-4)
        assert scope.timebase_scale == pytest.approx(1e-4)
        assert scope.trigger_source == f"CHANnel{publisher}"
        assert scope.channel_display[subscriber] is True
        scope.arm_single()
        triggered = scope.wait_triggered(timeout_s=10.0)
        if expect_trigger:
            assert triggered
        if triggered:
            delays = scope.edge_delays_s()
            assert list(delays) == [subscriber]
            if expect_trigger:
                assert delays[subscriber] is not None
    finally:
        scope.close()
