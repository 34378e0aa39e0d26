"""Which broker backends can be deployed on this machine, and what is missing if not."""

from __future__ import annotations

import pytest

from mqttbed.brokers.forkpipe import backend as forkpipe
from mqttbed.brokers.mosquitto import backend as mosquitto
from mqttbed.core.backends import backend_names, unavailable_reason


@pytest.mark.integration  # Mosquitto, a C compiler, clang and bpftool installed
def test_every_backend_here_is_available_after_make_install():
    # make install puts mosquitto and a C toolchain on this machine
    assert {name: unavailable_reason(name) for name in backend_names()} == {
        "adaptive": None, "fpga": None, "forkpipe": None, "mosquitto": None, "mqtt-sn": None,
        "mqtt-st": None, "p4": None,
        # the generic ones need nothing installed: each spec names its broker
        "external": None, "command": None,
        # make install installs rabbitmq-server and nats-server, the brokers extra amqtt
        "rabbitmq": None, "nats": None, "amqtt": None,
        # and activemq with libmqtt-client-java, and ejabberd
        "activemq": None, "ejabberd": None}


def test_a_missing_third_party_broker_is_named_with_how_to_install_it(monkeypatch):
    from mqttbed.brokers.command import named

    monkeypatch.setattr(named.shutil, "which", lambda *_a, **_k: None)
    assert "nats-server is not installed; apt-get install nats-server" in \
        unavailable_reason("nats")


def test_a_missing_mosquitto_is_named_with_how_to_install_it(monkeypatch):
    monkeypatch.setattr(mosquitto.shutil, "which", lambda _name: None)
    monkeypatch.setattr(mosquitto, "FALLBACK_BINARIES", ("/nonexistent/mosquitto",))
    assert "apt-get install mosquitto" in unavailable_reason("mosquitto")


def test_forkpipe_without_a_build_and_without_a_compiler_says_which_tool(monkeypatch, tmp_path):
    monkeypatch.setattr(forkpipe, "build_dir", lambda: tmp_path)  # nothing built there
    monkeypatch.setenv("CC", "no-such-cc")
    assert "needs `no-such-cc`" in unavailable_reason("forkpipe")


def test_an_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="unknown broker backend 'nope'"):
        unavailable_reason("nope")
