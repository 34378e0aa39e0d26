"""A broker process on a lab host over SSH: its directory there, its samples taken there.

The remote counterpart of :class:`~mqttbed.brokers.processes.BrokerProcess`, with the same
methods, so a backend deploys to a Pi or a server the way it deploys here. Config files
are written here and copied (SFTP); the broker's stdout streams into the local run
directory; its own log stays there and is fetched for the tail. Resource sampling runs on
the host, over the broker's process group (:mod:`mqttbed.brokers.remote_sampling`: plain
Python over /proc, streamed back over SSH, moved onto this machine's CLOCK_MONOTONIC).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from mqttbed.brokers.processes import tail_of
from mqttbed.brokers.remote_sampling import RemoteSampler
from mqttbed.core.host import ProcessHandle, describe_exit
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.ssh import SshError, SshHost


class RemoteBrokerProcess:
    """One deploy of a broker on an SSH host (see the module docstring)."""

    def __init__(self, name: str, host: SshHost, dir_prefix: str, log_names: tuple[str, ...]):
        self.name = name
        self.host = host
        self.remote_dir: PurePosixPath = host.make_dir(dir_prefix)
        self.dir = Path(tempfile.mkdtemp(prefix=dir_prefix))   # here: stdout, samples
        # stdout streams here; whatever the broker writes itself stays there
        self._local_logs = [self.dir / "stdout.log"]
        self._remote_logs = [self.remote_dir / n for n in log_names if n != "stdout.log"]
        self.handle: ProcessHandle | None = None
        self._sampler = RemoteSampler(host, self.dir / "samples.jsonl")
        self.exit_code: int | None = None
        self._log_tail: str | None = None
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return None if self.handle is None else self.handle.pid

    def put_text(self, name: str, text: str) -> PurePosixPath:
        """Write ``text`` to ``name`` in the remote directory (copied from a local file)."""
        local = self.dir / name
        local.write_text(text)
        remote = self.remote_dir / name
        self.host.put(local, str(remote))
        return remote

    def watch(self, handle: ProcessHandle, interval_s: float) -> None:
        """Take ``handle`` as the broker; sample its process group there every interval."""
        self.handle = handle
        self._sampler.start_group(handle.pid, interval_s)

    def samples(self) -> list[BrokerResourceSample]:
        """The samples streamed back so far, on this machine's clock, CPU % per interval."""
        return self._sampler.samples()

    def log_tail(self) -> str:
        """The broker's last log lines: its stdout here, its own log fetched from there."""
        if self._log_tail is not None:
            return self._log_tail
        parts = [tail_of(self._local_logs)]
        for remote in self._remote_logs:
            try:
                parts.append(self.host.run(["tail", "-n", "20", str(remote)],
                                           "read the broker's log"))
            except SshError:
                continue
        return "\n".join(p for p in parts if p)

    def exit_reason(self) -> str | None:
        if self.handle is None or (code := self.handle.poll()) is None:
            return None
        return (f"broker {self.name} (pid {self.handle.pid} on {self.host.name}) exited with "
                f"code {describe_exit(code)}; last log lines:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker's process group there, then its sampler (after a last sample)."""
        if self.stopped:
            return
        self.stopped = True
        if self.handle is not None:
            self.exit_code = self.handle.poll()
            stopped = self.handle.stop(timeout_s=timeout_s)
            if self.exit_code is None:
                self.exit_code = stopped
        self._sampler.stop()

    def remove(self) -> None:
        """Keep the log tail, then delete both directories."""
        if self._log_tail is None:
            self._log_tail = self.log_tail()
            # (a host that went away keeps the directory: nothing to do about it from here)
            with contextlib.suppress(SshError):
                self.host.run(["rm", "-rf", "--", str(self.remote_dir)],
                              "remove the broker's directory")
            shutil.rmtree(self.dir, ignore_errors=True)
