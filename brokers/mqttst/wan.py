"""Geography for the ``mqtt-st`` backend: regions, WAN delays, and proxies that add them.

The paper's networked environment (seed 001, III-B, Fig. 6) puts brokers in US West, US
East and EU, publishers in N. California and subscribers in Germany. Here every process
stays on loopback, and the WAN is a user-space delay proxy
(:mod:`mqttbed.network.delay_proxy`) on each path that crosses regions:

- **client → broker**: a client in region R whose broker sits in region S ≠ R connects to
  a proxy that forwards to the broker's client port with the one-way delay R/S in each
  direction (one proxy per (R, broker), shared by the clients of R);
- **broker ↔ broker**: the node that dials a tree link to a peer in another region dials
  a proxy forwarding to the peer's link port, so the link's PINGREQ/PINGRESP round trip,
  and with it the path costs and the tree, include the WAN delay.

Same region means no proxy and no added delay. Every proxy carries ``--topology PREFIX``
and the prefix is journalled (:class:`~mqttbed.network.topology.Journal`), so
:func:`~mqttbed.network.topology.reap` removes them after the run and ``reap_stale``
after a SIGKILLed controller.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost, LocalProcess
from mqttbed.core.protocol import Role
from mqttbed.network.topology import TOPOLOGY_FLAG, Journal, new_prefix, reap

PROXY_MODULE = "mqttbed.network.delay_proxy"
READY_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 2.0
LOCALITIES = (0, 50, 100)


def pair_key(a: str, b: str) -> str:
    """The ``wan_delay_ms`` key of two regions, as a spec writes it: ``a/b``."""
    return f"{a}/{b}"


def wan_delays(table: dict[str, float]) -> dict[frozenset[str], float]:
    """``{"a/b": ms}`` as unordered pairs; raises ValueError naming a bad key or value."""
    delays: dict[frozenset[str], float] = {}
    for key, ms in table.items():
        a, slash, b = key.partition("/")
        if not slash or not a or not b or "/" in b or a == b:
            raise ValueError(f"wan_delay_ms key {key!r}: name two different regions as "
                             "'REGION/REGION', e.g. 'us-west/eu'")
        if not (0 <= ms <= 10_000):
            raise ValueError(f"wan_delay_ms[{key!r}] = {ms!r}: a one-way delay in 0..10000 ms")
        pair = frozenset((a, b))
        if pair in delays and delays[pair] != ms:
            raise ValueError(f"wan_delay_ms gives {' and '.join(sorted(pair))} two delays "
                             f"({delays[pair]} and {ms}); one-way delays are the same both "
                             "ways: give one")
        delays[pair] = ms
    return delays


def check_geography(brokers: int, regions: list[str] | None, wan_delay_ms: dict[str, float],
                    locality_percent: int, **placed: str | None) -> None:
    """Raise ValueError naming the field and value of a geography that cannot be built.

    ``placed``: publisher_region, subscriber_region, cloud_region (None: not given).
    """
    if locality_percent not in LOCALITIES:
        raise ValueError(f"locality_percent {locality_percent}: the paper's setups are 0, 50 "
                         "and 100")
    if regions is None:
        given = [name for name, value in placed.items() if value is not None]
        if given or wan_delay_ms:
            raise ValueError(f"{(given or ['wan_delay_ms'])[0]} needs regions (one per "
                             "broker, e.g. regions: [us-west, us-east, eu])")
        return
    if len(regions) < brokers:
        raise ValueError(f"regions {regions} names {len(regions)} regions for {brokers} "
                         "brokers: give one per broker")
    if not all(name and "/" not in name for name in regions):
        raise ValueError(f"regions {regions}: names must be non-empty, without '/'")
    for name in ("publisher_region", "subscriber_region"):
        if placed.get(name) is None:
            raise ValueError(f"regions need {name} (where those clients sit)")
    broker_regions = set(regions[:brokers])
    cloud = placed.get("cloud_region")
    if cloud is not None and cloud not in broker_regions:
        raise ValueError(f"cloud_region {cloud!r} is not a broker's region "
                         f"{sorted(broker_regions)}")
    delays = wan_delays(wan_delay_ms)
    clients = {region for region in (placed["publisher_region"], placed["subscriber_region"])
               if region is not None}  # neither is, as checked above
    for a in sorted(broker_regions | clients):
        for b in sorted(broker_regions):
            if a != b and frozenset((a, b)) not in delays:
                raise ValueError(f"wan_delay_ms has no delay between {a} and {b}: add "
                                 f"'{pair_key(a, b)}: MS'")


@dataclass(frozen=True)
class Geography:
    """Where the brokers and clients of a run sit, and the one-way delays between regions."""

    broker_regions: tuple[str, ...]          # per broker index
    delays: dict[frozenset[str], float]
    publisher_region: str                    # the paper's N. California
    subscriber_region: str                   # the paper's Germany
    locality_percent: int

    def delay_ms(self, a: str, b: str) -> float:
        """One-way delay between regions ``a`` and ``b`` (0 within a region)."""
        return 0.0 if a == b else self.delays[frozenset((a, b))]

    def client_region(self, role: Role, index: int) -> str:
        """Where client ``index`` of ``role`` sits, as the paper splits them.

        0 %: publishers in the publisher region, subscribers in the subscriber region;
        50 %: every other client of each role in either (even indexes in the publisher
        region); 100 %: everyone in the publisher region.
        """
        home, away = self.publisher_region, self.subscriber_region
        if self.locality_percent == 100:
            return home
        if self.locality_percent == 50:
            return home if index % 2 == 0 else away
        return home if role == Role.PUBLISHER else away

    def nearest_of(self, region: str, candidates: dict[int, str]) -> list[int]:
        """Of ``candidates`` (broker index -> its region), those with the least delay from
        ``region``, in index order."""
        delay = {i: self.delay_ms(region, where) for i, where in candidates.items()}
        best = min(delay.values())
        return sorted(i for i, ms in delay.items() if ms == best)


class DelayProxyRecord(BaseModel):
    """One delay proxy of a run: the paths through it, its delay, and what it did."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    paths: list[str] = Field(description="e.g. 'client us-west -> broker 1 (eu)'")
    delay_ms: float = Field(description="added each way")
    port: int
    upstream: str = Field(description="host:port it forwards to")
    # The proxy's own statistics file, written at exit (network.delay_proxy, a
    # subprocess): open-ended, so kept as it came; None before it stopped.
    stats: dict[str, Any] | None


class DelayProxies:
    """Delay proxies on loopback, one per (upstream, delay), reaped with the run's prefix."""

    def __init__(self, work_dir: Path, address: str = "127.0.0.1"):
        self.prefix = new_prefix()
        self.work_dir = work_dir
        self.address = address
        self._proxies: dict[tuple[tuple[str, int], float], _Proxy] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._final: list[DelayProxyRecord] | None = None
        work_dir.mkdir(parents=True, exist_ok=True)
        # The journal lets the next controller's recover reap proxies of a SIGKILLed run;
        # without it (/run not writable: not root) they are reaped after the run only.
        try:
            Journal(self.prefix).record("processes", f"{TOPOLOGY_FLAG} {self.prefix}")
            self.journalled = True
        except OSError:
            self.journalled = False

    def route(self, upstream: tuple[str, int], delay_ms: float, path: str) -> tuple[str, int]:
        """Where to connect to reach ``upstream`` with ``delay_ms`` each way (``path``
        describes it in the metadata, e.g. ``client us-west -> broker 2 (eu)``)."""
        if delay_ms <= 0:
            return upstream
        with self._lock:
            if self._closed:
                raise BackendError("the run's delay proxies were closed already")
            key = (upstream, delay_ms)
            if (proxy := self._proxies.get(key)) is None:
                proxy = _Proxy(self, len(self._proxies), upstream, delay_ms, path)
                self._proxies[key] = proxy
            elif path not in proxy.paths:
                proxy.paths.append(path)
            return self.address, proxy.port

    def health(self) -> str | None:
        """None while every proxy runs, else which one exited."""
        for proxy in self._proxies.values():
            if (code := proxy.process.poll()) is not None:
                return (f"delay proxy {proxy.paths[0]} exited with code {code}; see "
                        f"{proxy.log}")
        return None

    def close(self) -> list[DelayProxyRecord]:
        """Stop every proxy (SIGTERM: each writes its statistics), reap the prefix, and
        return what each did; safe to call twice."""
        with self._lock:
            if self._final is None:
                self._closed = True
                for proxy in self._proxies.values():
                    if proxy.process.poll() is None:
                        proxy.process.stop(timeout_s=STATS_TIMEOUT_S)
                reap(self.prefix)
                self._final = [proxy.describe() for proxy in self._proxies.values()]
            return self._final

    def describe(self) -> list[DelayProxyRecord]:
        """Each proxy's path, delay and (once closed) its statistics."""
        return self._final if self._final is not None else [
            proxy.describe() for proxy in self._proxies.values()]


class _Proxy:
    """One delay proxy process, started at once and ready when constructed."""

    def __init__(self, owner: DelayProxies, number: int, upstream: tuple[str, int],
                 delay_ms: float, path: str):
        self.upstream, self.delay_ms, self.paths = upstream, delay_ms, [path]
        base = owner.work_dir / f"proxy-{number}"
        self.log, self.stats_file = base.with_suffix(".log"), base.with_suffix(".stats.json")
        ready = base.with_suffix(".ready.json")
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", PROXY_MODULE, TOPOLOGY_FLAG, owner.prefix,
                "--listen", f"{owner.address}:0", "--upstream", "{}:{}".format(*upstream),
                "--transport", "tcp", "--delay-ms", repr(delay_ms),
                "--ready-file", str(ready), "--stats-file", str(self.stats_file)]
        self.process: LocalProcess = LocalHost().spawn(argv, log_path=self.log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if (code := self.process.poll()) is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGKILL)
                raise BackendError(f"the delay proxy for {path} did not bind (exit code "
                                   f"{code}); see {self.log}")
            time.sleep(0.01)
        self.port: int = json.loads(ready.read_text())["port"]

    def describe(self) -> DelayProxyRecord:
        try:
            stats = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            stats = None
        return DelayProxyRecord(paths=list(self.paths), delay_ms=self.delay_ms, port=self.port,
                                upstream="{}:{}".format(*self.upstream), stats=stats)
