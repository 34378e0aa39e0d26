"""A network namespace as a :class:`~mqttbed.core.host.Host`: processes spawned inside it."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from mqttbed.core.host import LocalHost, LocalProcess
from mqttbed.network.netns import socket_in


class NamespaceHost:
    """Runs processes in namespace ``netns`` through ``ip netns exec``.

    ``address`` is the host's address on the switch network (what brokers and clients
    use); ``controller_address`` is the root-namespace address its processes reach the
    controller at, over the management link.
    """

    def __init__(self, name: str, netns: str, address: str, controller_address: str):
        self.name = name
        self.netns = netns
        self.address = address
        self.controller_address = controller_address
        self._local = LocalHost(address)

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
              log_path: Path | None = None) -> LocalProcess:
        """Start ``argv`` inside the namespace, in its own process group."""
        return self._local.spawn(["ip", "netns", "exec", self.netns, *argv], env=env,
                                 log_path=log_path)

    def free_port(self) -> int:
        """A TCP port free on ``address`` inside the namespace right now."""
        with socket_in(self.netns, socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.address, 0))
            return s.getsockname()[1]

    def make_dir(self, prefix: str) -> Path:
        """A fresh private directory (namespaces share the root file system)."""
        return Path(tempfile.mkdtemp(prefix=prefix))
