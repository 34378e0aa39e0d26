"""Programming a real FPGA board with the broker's bitstream, over SSH.

The target is a Zynq UltraScale+ MPSoC running Linux (the paper's M-KUBOS carries an
XCZU19EG), where ``fpgautil -b <bitstream>`` loads a bitstream into the programmable
logic through the FPGA manager. The steps, all through :class:`~mqttbed.core.ssh.SshHost`
(fabric), never a shell string built by hand:

1. hash the local bitstream (SHA-256);
2. copy it to ``remote_dir`` on the board (SFTP);
3. hash the copy on the board (``sha256sum``) and refuse to go on if the hashes differ;
4. run ``fpgautil -b <remote copy>``; a non-zero exit fails the deploy with its output.

Both hashes and fpgautil's argv and output go into the run's metadata.

Not validated against hardware: this path has run only against a real local sshd with a
stand-in ``fpgautil`` that records its arguments (tests/test_fpga_board.py). No board was
available where it was written.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from mqttbed.core.errors import BackendError
from mqttbed.core.host import sha256_file
from mqttbed.core.ssh import SshError, SshHost, SshTarget


class BoardOptions(SshTarget):
    """The ``board`` section of an ``fpga`` broker: where the board is and what to load."""

    bitstream: str = Field(description="local path of the broker's .bit/.bin file")
    udp_endpoint: str = Field(description="addr:port where the programmed broker listens")
    remote_dir: str = Field(default="/tmp/mqttbed", description="where the copy goes")
    fpgautil: str = Field(default="fpgautil", description="fpgautil on the board's PATH")

    @field_validator("udp_endpoint")
    @classmethod
    def _address_and_port(cls, value: str) -> str:
        parse_udp_endpoint(value)
        return value

    def endpoint(self) -> tuple[str, int]:
        """Return (address, port) of ``udp_endpoint``."""
        return parse_udp_endpoint(self.udp_endpoint)


def parse_udp_endpoint(value: str) -> tuple[str, int]:
    """Split ``"addr:port"``; raise ValueError naming the value and the expected form."""
    address, sep, port_text = value.rpartition(":")
    if not sep or not address or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"udp_endpoint {value!r} is not 'address:port' "
                         f"(e.g. '192.168.1.10:1883')")
    return address, int(port_text)


@dataclass(frozen=True)
class BoardDeployment:
    """What was loaded where: recorded in the run's metadata (FpgaDeployment.board)."""

    host: str
    bitstream: str
    bitstream_sha256: str
    remote_path: str
    remote_sha256: str
    fpgautil_argv: list[str]
    fpgautil_output: str


def program_board(options: BoardOptions) -> BoardDeployment:
    """Copy the bitstream to the board, check its SHA-256 there, and load it with fpgautil."""
    bitstream = Path(options.bitstream).expanduser()
    if not bitstream.is_file():
        raise BackendError(f"board bitstream {options.bitstream!r} is not a file; set "
                           f"broker.board.bitstream to the broker's .bit/.bin file")
    local_sha256 = sha256_file(bitstream)
    remote_path = posixpath.join(options.remote_dir, bitstream.name)
    try:
        board = SshHost(options, name=f"board {options.host}")
    except SshError as exc:
        raise BackendError(str(exc)) from exc
    try:
        board.run(["mkdir", "-p", options.remote_dir], "create the remote directory")
        board.put(bitstream, remote_path)
        hashed = board.run(["sha256sum", remote_path], "hash the copy on the board")
        remote_sha256 = hashed.split()[0] if hashed.split() else ""
        if remote_sha256 != local_sha256:
            raise BackendError(
                f"bitstream copy on {options.host} has SHA-256 {remote_sha256 or '(none)'}, "
                f"the local file {bitstream} has {local_sha256}: not programming the board; "
                f"check the board's storage and the copy in {options.remote_dir}")
        argv = [options.fpgautil, "-b", remote_path]
        output = board.run(argv, "program the bitstream")
    except (SshError, OSError) as exc:
        raise BackendError(str(exc)) from exc
    finally:
        board.close()
    return BoardDeployment(host=options.host, bitstream=str(bitstream),
                           bitstream_sha256=local_sha256, remote_path=remote_path,
                           remote_sha256=remote_sha256, fpgautil_argv=argv,
                           fpgautil_output=output)
