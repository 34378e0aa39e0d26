"""The process-tree sampler, on real processes and a real Mosquitto with real clients."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
import pytest

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.core.host import LocalHost, LocalProcess
from mqttbed.core.samples import BrokerStatsSample
from mqttbed.instruments.resources import ProcessTreeSampler, summarize

pytestmark = pytest.mark.timeout(30)


def spawn_python(code: str, tmp_path: Path) -> LocalProcess:
    """Start ``code`` in its own process group, so stop() also ends what it forks."""
    return LocalHost().spawn([sys.executable, "-c", textwrap.dedent(code)],
                             log_path=tmp_path / "child.log")


def wait_for_children(pid: int, count: int, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(psutil.Process(pid).children(recursive=True)) >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not fork {count} children in {timeout_s} s")


def test_sampler_counts_children_cpu(tmp_path):
    # The parent only sleeps; all CPU is burnt in a forked child, which a sampler of the
    # parent alone would miss.
    parent = spawn_python("""
        import os, time
        if os.fork() == 0:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                pass
            os._exit(0)
        time.sleep(8)
        """, tmp_path)
    try:
        wait_for_children(parent.pid, 1, timeout_s=10.0)
        child = psutil.Process(parent.pid).children()[0]
        used_before, started = sum(child.cpu_times()[:2]), time.monotonic()
        sampler = ProcessTreeSampler(parent.pid, interval_s=0.1)
        sampler.start()
        time.sleep(1.0)
        samples = sampler.stop()
        # what the child really used over the window, by the kernel's own accounting: on
        # a quiet machine ~100 %, on a loaded one less, so the check is relative to it
        used_percent = ((sum(child.cpu_times()[:2]) - used_before)
                        / (time.monotonic() - started) * 100)
    finally:
        parent.stop(timeout_s=1.0)

    assert max(s.processes for s in samples) == 2
    busy = [s.cpu_percent for s in samples if s.processes == 2]
    assert len(busy) >= 5
    assert used_percent > 5, used_percent
    mean = sum(busy) / len(busy)
    assert abs(mean - used_percent) < 0.5 * used_percent, (mean, used_percent)


def test_sampler_keeps_bytes_of_children_that_exit(tmp_path):
    # A fork-per-client broker's children come and go; their traffic must stay counted.
    parent = spawn_python("""
        import os, time
        time.sleep(0.3)
        for _ in range(4):
            child = os.fork()
            if child == 0:
                with open(os.devnull, "wb", buffering=0) as sink:
                    sink.write(b"x" * 1_000_000)
                time.sleep(0.25)
                os._exit(0)
            os.waitpid(child, 0)
        time.sleep(5)
        """, tmp_path)
    try:
        sampler = ProcessTreeSampler(parent.pid, interval_s=0.05)
        sampler.start()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            if psutil.Process(parent.pid).children() == [] and len(sampler.samples) > 30:
                break
            time.sleep(0.05)
        samples = sampler.stop()
    finally:
        parent.stop(timeout_s=1.0)

    assert max(s.processes for s in samples) == 2
    assert samples[-1].processes == 1
    sent = [s.bytes_sent for s in samples]
    assert sent == sorted(sent), "cumulative bytes went backwards when a child exited"
    assert sent[-1] - sent[0] >= 4_000_000


def test_sampler_stops_promptly_and_takes_a_last_sample(tmp_path):
    sleeper = spawn_python("import time; time.sleep(10)", tmp_path)
    try:
        sampler = ProcessTreeSampler(sleeper.pid, interval_s=30)
        sampler.start()
        started = time.monotonic()
        samples = sampler.stop()
        elapsed = time.monotonic() - started
    finally:
        sleeper.stop(timeout_s=1.0)
    assert elapsed < 1.0
    assert len(samples) == 1 and samples[0].processes == 1
    assert not sampler.running


def test_sampler_ends_by_itself_when_the_process_exits(tmp_path):
    short = spawn_python("import time; time.sleep(0.4)", tmp_path)
    try:
        sampler = ProcessTreeSampler(short.pid, interval_s=0.05)
        sampler.start()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and short.poll() is None:
            time.sleep(0.02)
        # the process is reaped; the thread must notice within a sample or two
        time.sleep(0.2)
        assert not sampler.running
        assert sampler.error is None
        assert len(sampler.stop()) >= 3
    finally:
        short.stop(timeout_s=1.0)


def test_sampler_of_a_missing_process_fails_at_start():
    gone = psutil.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(psutil.NoSuchProcess):
        ProcessTreeSampler(gone.pid).start()


@pytest.mark.integration  # Mosquitto
def test_sampler_bytes_grow_with_traffic():
    messages, payload = 2000, b"p" * 100
    backend = MosquittoBackend()
    subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bytes-sub")
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bytes-pub")
    received = threading.Semaphore(0)
    subscribed = threading.Event()
    subscriber.on_message = lambda *_: received.release()
    subscriber.on_subscribe = lambda *_: subscribed.set()
    try:
        endpoint = backend.deploy(Options(stats_interval_s=0.05), LocalHost())
        for client in (subscriber, publisher):
            client.connect(endpoint.host, endpoint.port)
            client.loop_start()
        subscriber.subscribe("bed/bytes", 0)
        assert subscribed.wait(3)
        deadline = time.monotonic() + 2
        while not backend.stats() and time.monotonic() < deadline:
            time.sleep(0.02)
        before = backend.stats()[-1]

        for _ in range(messages):
            publisher.publish("bed/bytes", payload, qos=0)
        delivered = sum(received.acquire(timeout=5) for _ in range(messages))
        assert delivered == messages

        backend.teardown()
        after = backend.stats()[-1]
    finally:
        for client in (subscriber, publisher):
            client.loop_stop()
        backend.teardown()

    payload_bytes = messages * len(payload)
    assert after.bytes_recv - before.bytes_recv >= payload_bytes
    assert after.bytes_sent - before.bytes_sent >= payload_bytes
    summary = summarize(backend.stats())
    assert summary["bytes_recv"] >= payload_bytes
    assert summary["net_sent_kb_per_s"] > 0


def sample(t_s: float, cpu: float, rss: int, recv: int, sent: int) -> BrokerStatsSample:
    return BrokerStatsSample(t_ns=int(t_s * 1e9), cpu_percent=cpu, rss_bytes=rss,
                             bytes_recv=recv, bytes_sent=sent, processes=1)


def test_summarize_gives_means_maxima_and_rates_over_the_window():
    summary = summarize([
        sample(10.0, cpu=20.0, rss=1000, recv=5_000, sent=1_000),
        sample(11.0, cpu=60.0, rss=3000, recv=7_000, sent=5_000),
        sample(12.0, cpu=10.0, rss=2000, recv=9_000, sent=9_000),
    ])
    assert summary["samples"] == 3
    assert summary["cpu_percent_mean"] == pytest.approx(30.0)
    assert summary["cpu_percent_max"] == 60.0
    assert summary["rss_bytes_mean"] == pytest.approx(2000)
    assert summary["rss_bytes_max"] == 3000
    assert summary["bytes_recv"] == 4_000
    assert summary["bytes_sent"] == 8_000
    assert summary["net_recv_kb_per_s"] == pytest.approx(2.0)
    assert summary["net_sent_kb_per_s"] == pytest.approx(4.0)


def test_summarize_reports_unmeasured_figures_as_none_not_zero():
    assert summarize([])["cpu_percent_mean"] is None
    one = summarize([sample(1.0, cpu=5.0, rss=10, recv=1, sent=1)])
    assert one["cpu_percent_max"] == 5.0
    assert one["bytes_recv"] is None and one["net_recv_kb_per_s"] is None
