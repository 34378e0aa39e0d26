"""The ``mqttbed`` CLI: tokens, the remote campaign commands, the standalone report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).with_name("mqttbed"))


def mqttbed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_token_create_prints_the_token_alone_and_stores_only_its_hash(tmp_path):
    done = mqttbed("token", "create", "--name", "alice", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqb_") and len(lines[0]) > 40
    database = (tmp_path / "mqttbed.sqlite").read_bytes()
    assert lines[0].encode() not in database
    again = mqttbed("token", "create", "--name", "alice", "--data-dir", str(tmp_path))
    assert again.stdout.strip() != lines[0]


@pytest.mark.integration
def test_remote_commands_list_status_stats_and_export(served, tmp_path):
    env = {"MQTTBED_URL": served.url, "MQTTBED_TOKEN": served.user_token}
    campaign_id = served.finished["id"]

    listed = mqttbed("campaigns", "list", env=env)
    assert listed.returncode == 0 and campaign_id in listed.stdout and "done" in listed.stdout
    status = mqttbed("campaigns", "status", campaign_id, env=env)
    assert "api-e2e: done, 2/2 runs ended (2 done, 0 failed)" in status.stdout
    stats = json.loads(mqttbed("campaigns", "stats", campaign_id, env=env).stdout)
    assert stats["campaign"]["id"] == campaign_id

    csv_path = tmp_path / "d.csv"
    exported = mqttbed("campaigns", "export", campaign_id, "--format", "csv", "--out",
                       str(csv_path), env=env)
    assert exported.returncode == 0, exported.stderr
    header, *rows = csv_path.read_text().splitlines()
    assert "t_pub_ns" in header and len(rows) == 100 * (2 + 4)
    zip_path = tmp_path / "d.zip"
    mqttbed("campaigns", "export", campaign_id, "--out", str(zip_path), env=env)
    assert "manifest.json" in zipfile.ZipFile(zip_path).namelist()


@pytest.mark.integration
def test_remote_commands_report_errors_clearly(served, tmp_path):
    env = {"MQTTBED_URL": served.url, "MQTTBED_TOKEN": "mqb_wrong"}
    denied = mqttbed("campaigns", "list", env=env)
    assert denied.returncode != 0 and "401" in denied.stderr
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nworkload: {rate_hz: 0}\n")
    rejected = mqttbed("campaigns", "submit", str(spec),
                       env={**env, "MQTTBED_TOKEN": served.user_token})
    assert rejected.returncode != 0 and "workload.rate_hz: bad value 0" in rejected.stderr


@pytest.mark.integration
def test_url_and_token_flags_work_before_and_after_the_action(served):
    env = {"MQTTBED_URL": "http://127.0.0.1:9", "MQTTBED_TOKEN": "mqb_wrong"}
    campaign_id = served.finished["id"]
    after = mqttbed("campaigns", "list", "--url", served.url, "--token", served.user_token,
                    env=env)
    assert after.returncode == 0 and campaign_id in after.stdout, after.stderr
    before = mqttbed("campaigns", "--url", served.url, "--token", served.user_token, "status",
                     campaign_id, env=env)
    assert before.returncode == 0 and "api-e2e: done" in before.stdout, before.stderr
    # flags after the action win over the ones before it
    mixed = mqttbed("campaigns", "--token", "mqb_wrong", "list", "--url", served.url,
                    "--token", served.user_token, env=env)
    assert mixed.returncode == 0, mixed.stderr


def test_an_unreachable_controller_is_named_without_a_traceback():
    done = mqttbed("campaigns", "list", "--url", "http://127.0.0.1:9", "--token", "mqb_x")
    assert done.returncode == 1
    assert done.stderr.strip().startswith(
        "mqttbed campaigns: cannot reach the controller at http://127.0.0.1:9: ConnectError")
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_report_writes_one_self_contained_html_file(served, tmp_path):
    out = tmp_path / "report.html"
    done = mqttbed("report", served.finished["id"], "--out", str(out), "--data-dir",
                   str(served.controller.layout.root))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert done.stdout.strip() == str(out.resolve())
    assert "Plotly.newPlot" in html and "plotly.js" in html[:5_000_000]
    assert 'src="http' not in html and "/static/" not in html  # nothing fetched
    assert "plot-latency-cdf" in html


def test_the_url_serve_prints_takes_connections_before_its_server_loop_runs():
    """`mqttbed serve` prints its URL once the socket is bound, before uvicorn runs: the
    socket listens already, so a client that connects at once waits in the backlog
    instead of being refused (CI saw "Connection refused" right after the line)."""
    import socket

    from mqttbed.controller.embedded import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=2) as client:
            client.sendall(b"GET / HTTP/1.1\r\n\r\n")
            accepted, _ = sock.accept()   # what the server's loop does once it runs
            with accepted:
                assert accepted.recv(100).startswith(b"GET / HTTP/1.1")
    finally:
        sock.close()
