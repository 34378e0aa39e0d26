"""The ``fpga`` backend deploying the model: backend registry, options, UDP endpoint, metadata,
teardown.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from pydantic import ValidationError

from mqttbed.brokers.fpga.backend import FpgaBackend, ModelLatency, Options
from mqttbed.core.backends import BrokerBackend, backend_names, create_backend, options_model
from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost
from mqttbed.core.mqtt_codec import SubAck, Subscribe, decode, encode, encode_publish
from mqttbed.core.protocol import Transport
from tests.conftest import child_processes, wait_until
from tests.test_fpga_model_udp import udp_client

pytestmark = pytest.mark.timeout(30)


def test_the_backend_registry_knows_fpga_and_validates_its_options():
    assert "fpga" in backend_names()
    assert isinstance(create_backend("fpga"), BrokerBackend)
    model = options_model("fpga")
    assert model.model_validate({"backend": "fpga"}).board is None
    with pytest.raises(ValidationError, match="udp_endpoint 'board' is not 'address:port'"):
        model.model_validate({"backend": "fpga", "board": {
            "host": "root@board", "bitstream": "b.bit", "udp_endpoint": "board"}})
    with pytest.raises(ValidationError, match="probe_window 9 exceeds the table depth 8"):
        model.model_validate({"backend": "fpga", "subscriber_table_depth": 8, "probe_window": 9})
    with pytest.raises(ValidationError, match="extra"):
        model.model_validate({"backend": "fpga", "qos": 1})


def test_deployed_model_relays_over_udp_and_teardown_records_what_it_did():
    backend = FpgaBackend()
    endpoint = backend.deploy(Options(stats_interval_s=0.05), LocalHost())
    assert endpoint.transport is Transport.MQTT_UDP and endpoint.host == "127.0.0.1"
    assert backend.health() is None
    subscriber, publisher = udp_client(endpoint.port), udp_client(endpoint.port)
    try:
        subscribe = encode(Subscribe(1, (("line/#", 0),)))
        subscriber.send(subscribe)
        assert decode(subscriber.recv(64)) == SubAck(1, (0,))
        for n in range(10):
            publisher.send(encode_publish(f"line/{n}", bytes(40)))
            assert subscriber.recv(256) == encode_publish(f"line/{n}", bytes(40))
        # the last sample counts all this traffic (and there is a second one to compare)
        publishes = sum(len(encode_publish(f"line/{n}", bytes(40))) for n in range(10))
        traffic_in = len(subscribe) + publishes
        traffic_out = len(encode(SubAck(1, (0,)))) + publishes

        def counted() -> bool:
            samples = backend.resource_samples()
            return (len(samples) >= 2 and samples[-1].bytes_recv >= traffic_in
                    and samples[-1].bytes_sent >= traffic_out)

        wait_until(counted, 10, f"a resource sample counting {traffic_in} B in and "
                   f"{traffic_out} B out")
    finally:
        subscriber.close()
        publisher.close()
    pid = backend.deployment().pid
    backend.teardown()
    backend.teardown()                                  # idempotent
    record = backend.deployment()
    assert record.backend == "fpga" and record.target == "model" and record.engine == "model"
    assert record.exit_code == 0 and not os.path.exists(f"/proc/{pid}")
    assert record.model_stats is not None
    assert record.model_stats["counters"]["publish_copies"] == 10
    assert record.model_stats["counters"]["pingreq"] == 1          # the deploy's probe
    latency = record.hardware_latency_ns
    assert isinstance(latency, ModelLatency) and latency.publish_packets == 10
    # found under the rewritten name line/# (lookup index 1): one rewriter cycle later
    assert latency.modelled.first_copy["mean"] == pytest.approx(799.2 + 10)
    assert (latency.emulator_measured.first_copy["mean"] or 0) > 0
    assert record.source_sha256 is not None and len(record.source_sha256) == 64
    samples = backend.resource_samples()
    assert len(samples) >= 2 and all(s.rss_bytes > 0 for s in samples)
    # the samples' bytes are the model's own UDP counts (a sampler cannot see recvfrom)
    counters, last = record.model_stats["counters"], samples[-1]
    publish_bytes = 10 * len(encode_publish("line/0", bytes(40)))
    assert last.bytes_recv == counters["bytes_in"] > publish_bytes
    assert last.bytes_sent == counters["bytes_out"] > publish_bytes
    assert [s.bytes_recv for s in samples] == sorted(s.bytes_recv for s in samples)
    assert child_processes("mqttbed.brokers.fpga") == []


def test_a_model_that_dies_is_reported_by_health_with_its_exit():
    backend = FpgaBackend()
    backend.deploy(Options(), LocalHost())
    try:
        pid = backend.deployment().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while backend.health() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "exited with code -9" in (backend.health() or "")
    finally:
        backend.teardown()
    assert backend.deployment().model_stats is None      # killed: no stats written


def test_a_backend_is_deployed_once():
    backend = FpgaBackend()
    backend.deploy(Options(), LocalHost())
    try:
        with pytest.raises(BackendError, match="already deployed"):
            backend.deploy(Options(), LocalHost())
    finally:
        backend.teardown()


def test_a_board_whose_bitstream_is_missing_fails_before_any_ssh(tmp_path):
    backend = FpgaBackend()
    missing = tmp_path / "nope.bit"
    with pytest.raises(BackendError, match=f"bitstream '{missing}' is not a file"):
        backend.deploy({"backend": "fpga", "board": {
            "host": "root@192.0.2.1", "bitstream": str(missing),
            "udp_endpoint": "192.0.2.1:1883"}}, LocalHost())
