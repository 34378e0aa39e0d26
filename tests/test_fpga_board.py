"""Programming a board over SSH: a real local sshd, a stand-in ``fpgautil`` that records its argv.

No FPGA board is here. The sshd is real (openssh-server, started on a free loopback port
with its own host key and an authorized key for root), so fabric, SFTP, the remote
``sha256sum`` and the quoting of commands are exercised for real; only ``fpgautil`` is a
stand-in script on the session's PATH, and the board's UDP side is the behavioural model.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest

from mqttbed.brokers.fpga.backend import FpgaBackend
from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.brokers.fpga.server import FpgaModelServer
from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost
from tests.sshd import LocalSshd

# integration: a real sshd
pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STAND_IN_FPGAUTIL = """#!/bin/sh
# Stand-in for Xilinx fpgautil: records its arguments, one per line.
if [ -e "{dir}/fpgautil-fails" ]; then
    echo "fpgautil: FPGA manager busy" >&2
    exit 1
fi
printf '%s\\n' "$@" > "{dir}/fpgautil-argv"
echo "BIN FILE loaded through FPGA manager successfully"
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = LocalSshd(tmp_path_factory.mktemp("sshd"))
    fpgautil = server.bin / "fpgautil"
    fpgautil.write_text(STAND_IN_FPGAUTIL.format(dir=server.root))
    fpgautil.chmod(0o755)
    yield server
    server.stop()


@pytest.fixture
def board_udp():
    """The board's UDP side: the behavioural model, in this process."""
    server = FpgaModelServer(BrokerModel())
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set, 0.02), daemon=True)
    thread.start()
    yield f"{server.address[0]}:{server.address[1]}"
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def bitstream(tmp_path) -> Path:
    path = tmp_path / "mqtt broker.bit"            # a space, to prove argv is quoted
    path.write_bytes(os.urandom(4096))
    return path


def board_spec(sshd: LocalSshd, bitstream: Path, udp_endpoint: str, **extra) -> dict:
    return {"backend": "fpga", "board": {
        "host": "root@127.0.0.1", "ssh_port": sshd.port,
        "key_filename": str(sshd.root / "client_key"), "known_hosts": str(sshd.known_hosts),
        "bitstream": str(bitstream), "udp_endpoint": udp_endpoint,
        "remote_dir": str(sshd.root / "remote"), **extra}}


def test_board_deploy_copies_checks_sha256_and_programs_with_fpgautil_b(sshd, bitstream,
                                                                        board_udp):
    backend = FpgaBackend()
    endpoint = backend.deploy(board_spec(sshd, bitstream, board_udp), LocalHost())
    try:
        assert f"{endpoint.host}:{endpoint.port}" == board_udp
        assert endpoint.transport == "mqtt-udp"
        remote = sshd.root / "remote" / bitstream.name
        assert (sshd.root / "fpgautil-argv").read_text().splitlines() == ["-b", str(remote)]
        assert remote.read_bytes() == bitstream.read_bytes()
        record = backend.deployment()
        local_sha = hashlib.sha256(bitstream.read_bytes()).hexdigest()
        assert record.target == "board" and record.bitstream_sha256 == local_sha
        assert record.board is not None and record.board.remote_sha256 == local_sha
        assert record.board.fpgautil_argv == ["fpgautil", "-b", str(remote)]
        assert "successfully" in record.board.fpgautil_output
        assert record.validated_on_hardware is False
        assert record.engine is None and record.pid is None
        assert backend.health() is None and backend.resource_samples() == []
    finally:
        backend.teardown()
        (sshd.root / "fpgautil-argv").unlink(missing_ok=True)


def test_a_copy_whose_hash_differs_on_the_board_is_never_programmed(sshd, bitstream,
                                                                    board_udp):
    fake = sshd.bin / "sha256sum"
    fake.write_text("#!/bin/sh\necho 0000000000000000000000000000000000000000000000000000000000"
                    "000000  \"$1\"\n")
    fake.chmod(0o755)
    try:
        with pytest.raises(BackendError, match="has SHA-256 0{64}.*not programming the board"):
            FpgaBackend().deploy(board_spec(sshd, bitstream, board_udp), LocalHost())
    finally:
        fake.unlink()
    assert not (sshd.root / "fpgautil-argv").exists()


def test_a_failing_fpgautil_fails_the_deploy_with_its_message(sshd, bitstream, board_udp):
    flag = sshd.root / "fpgautil-fails"
    flag.touch()
    try:
        with pytest.raises(BackendError, match="exited with 1: fpgautil: FPGA manager busy"):
            FpgaBackend().deploy(board_spec(sshd, bitstream, board_udp), LocalHost())
    finally:
        flag.unlink()


def test_an_unknown_board_host_key_is_refused_when_known_hosts_is_given(sshd, bitstream,
                                                                        board_udp, tmp_path):
    other = (sshd.root / "other_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    spec = board_spec(sshd, bitstream, board_udp)
    spec["board"]["known_hosts"] = str(wrong)
    with pytest.raises(BackendError, match="SSH to board root@127.0.0.1 failed"):
        FpgaBackend().deploy(spec, LocalHost())
    assert not (sshd.root / "fpgautil-argv").exists()


def test_a_programmed_board_that_does_not_answer_pingreq_fails_the_deploy(sshd, bitstream):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        silent = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(BackendError, match=f"no MQTT broker answers PINGREQ on udp://"
                                               f"{silent}"):
            FpgaBackend().deploy(board_spec(sshd, bitstream, silent, connect_timeout_s=5)
                                 | {"probe_timeout_s": 0.3}, LocalHost())
    (sshd.root / "fpgautil-argv").unlink(missing_ok=True)
