"""Executes one assignment: connect, subscribe in turn, run at the start time, upload, report.

Barriers order a run across agents: every agent reports ``Connected``; the controller
then hands out the subscribe ranks in turn (``Subscribe``), each agent reporting every
SUBACK (``Subscribed``) before the next rank goes out, so the broker's subscription order
is the rank order; an agent whose subscribers all hold their SUBACK reports ``Ready`` and
waits for one ``StartAt``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import resource
import threading
from collections.abc import Callable

import httpx

from mqttbed.agents.clock_sync import TRACKING_PROBES, ClockTracker, estimate_offset
from mqttbed.agents.connect_storm import ConnectStormSession
from mqttbed.agents.gpio import GpioLines, toggle_cost_ns
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.uploader import ChunkUploader
from mqttbed.core.protocol import (
    AgentFailure,
    Assignment,
    ClockEstimate,
    Connected,
    Done,
    GeneratorReport,
    Ready,
    Subscribe,
    Subscribed,
)

log = logging.getLogger("mqttbed.agent")


class AssignmentRunner:
    """Runs one assignment on its own thread; commands arrive through its methods."""

    def __init__(self, http: httpx.Client, agent_id: str, assignment: Assignment,
                 gpio: GpioLines, on_finished: Callable[[], object],
                 controller_boot_id: str | None = None):
        self.assignment = assignment
        self._http = http
        self._agent_id = agent_id
        self._controller_boot_id = controller_boot_id
        self._clock = ClockEstimate(offset_ns=0, uncertainty_ns=0, method="unknown")
        self._gpio = gpio
        self._on_finished = on_finished
        self._session: MqttSession | ConnectStormSession | None = None
        self._to_subscribe: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._may_subscribe = threading.Event()  # set while ranks wait in _to_subscribe
        self._start_ns: int | None = None
        self._started = threading.Event()
        self._aborted = threading.Event()
        self.abort_reason: str | None = None
        self._thread = threading.Thread(target=self._main, name=f"run-{assignment.run_id}",
                                        daemon=True)

    def launch(self) -> None:
        self._thread.start()

    def subscribe(self, command: Subscribe) -> None:
        """Subscribe the subscribers of ``command.ranks``, in that order."""
        self._to_subscribe.put(list(command.ranks))
        self._may_subscribe.set()
        self._wake()

    def start_at(self, t_start_controller_ns: int) -> None:
        """Start at the controller's ``t_start`` (converted to this agent's clock)."""
        self._start_ns = t_start_controller_ns + self._clock.offset_ns
        self._started.set()
        self._wake()

    def abort(self, reason: str) -> None:
        self.abort_reason = reason
        self._aborted.set()
        self._may_subscribe.set()
        self._started.set()
        self._wake()

    def _wake(self) -> None:
        """Wake the run's loop if it is waiting in select() (it rechecks its events)."""
        if (session := self._session) is not None:
            session.wake()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _post(self, path: str,
              message: Connected | Subscribed | Ready | Done | AgentFailure) -> None:
        response = self._http.post(path, content=message.model_dump_json(),
                                   headers={"content-type": "application/json"})
        response.raise_for_status()

    def _main(self) -> None:
        a = self.assignment
        base = f"/agent/v1/runs/{a.run_id}"
        session = None
        uploader = None
        tracker = None
        try:
            # A kept agent's lines may hold edges recorded after its last run's final
            # upload (its clients' close): they belong to no run, least of all this one.
            if stale := self._gpio.edge_buffers().rows:
                log.info("run %s: %d GPIO edges from before it dropped", a.run_id, stale)
            self._clock = estimate_offset(self._http, self._controller_boot_id,
                                          a.force_clock_probe)
            if a.storm is not None:  # workload.mode connect: no messages, no uploads
                self._run_storm(base)
                return
            uploader = ChunkUploader(
                self._http, run_id=a.run_id, agent_id=self._agent_id,
                static_columns={"agent_id": self._agent_id,
                                **_clock_columns(self._clock)},
                chunk_events=a.chunk_events, interval_s=a.chunk_interval_s,
                edges=self._gpio.edge_buffers)
            session = self._session = MqttSession(a.broker, a.clients, self._gpio,
                                                  uploader.record, gpio_pulses=a.gpio_pulses,
                                                  mqtt_client=a.mqtt_client,
                                                  record_columns=uploader.record_columns,
                                                  record_binary=uploader.record_binary,
                                                  credentials=a.credentials,
                                                  protocol=a.protocol)
            toggle_ns = toggle_cost_ns(self._gpio, a.clients[0].gpio_pin) if a.clients else None
            uploader.start()
            session.open(timeout_s=a.connect_timeout_s)
            clients = [c.client_id for c in a.clients]
            self._post(f"{base}/connected", Connected(run_id=a.run_id, agent_id=self._agent_id,
                                                      clients=clients, clock=self._clock))
            pending = session.subscriber_ranks()
            while pending:
                session.wait_for(self._may_subscribe)
                if self._aborted.is_set():
                    return
                self._may_subscribe.clear()
                while not self._to_subscribe.empty():
                    for rank in self._to_subscribe.get():
                        session.subscribe(a.connect_timeout_s, [rank])
                        pending.remove(rank)
                        self._post(f"{base}/subscribed", Subscribed(
                            run_id=a.run_id, agent_id=self._agent_id, rank=rank))
            self._post(f"{base}/ready", Ready(
                run_id=a.run_id, agent_id=self._agent_id, clients=clients, clock=self._clock,
                gpio_backend=self._gpio.backend, gpio_toggle_ns=toggle_ns,
                gpio_driver="native" if session.native else "python",
                gpio_chip=session.gpio_chip))
            session.wait_for(self._started)
            if self._aborted.is_set():
                return
            assert self._start_ns is not None
            if self._clock.method != "same-clock" and a.clock_probe_interval_s > 0:
                # Clocks drift apart during a run: each re-estimate goes with the events
                # recorded after it (the uploader flushes the earlier ones first).
                tracker = ClockTracker(
                    lambda: estimate_offset(self._http, self._controller_boot_id,
                                            a.force_clock_probe, probes=TRACKING_PROBES),
                    a.clock_probe_interval_s,
                    lambda clock: uploader.update_constants(_clock_columns(clock)))
                tracker.start()
            session.run(self._start_ns, self._deadline_ns(self._start_ns),
                        abort=lambda: self._aborted.is_set() or uploader.error is not None,
                        # closed loop: publish for the window, then drain (open loop keeps
                        # sending late messages until the deadline: they are measured)
                        t_publish_end_ns=self._start_ns + a.window_ns
                        if any(c.closed_loop for c in a.clients) else None,
                        drain_idle=None if a.drain_idle_s is None else (
                            self._start_ns + a.window_ns, int(a.drain_idle_s * 1e9)))
            if tracker is not None:
                tracker.stop()
            if uploader.error is not None:
                raise RuntimeError(uploader.error)
            published, received = session.counts()
            connections = session.connect_phases()
            generator = session.generator_report().model_copy(
                update={"nofile_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]})
            chunks = uploader.close()
            self._post(f"{base}/done", Done(run_id=a.run_id, agent_id=self._agent_id,
                                            chunks=chunks, published=published, received=received,
                                            upload_retries=uploader.retries,
                                            generator=generator, connections=connections,
                                            reconnects=session.reconnects()))
        except Exception as exc:  # noqa: BLE001 - any failure is reported, with its reason
            # Flush first: the controller tears the run down as soon as it hears of this.
            reason = f"agent {self._agent_id}: {type(exc).__name__}: {exc}"
            if uploader is not None and (lost := _flush_for_good(uploader)):
                cause = "" if str(exc) == uploader.error else f"; {type(exc).__name__}: {exc}"
                reason = f"agent {self._agent_id}: {lost}{cause}"
            try:
                self._post(f"{base}/error", AgentFailure(run_id=a.run_id, agent_id=self._agent_id,
                                                         reason=reason))
            except httpx.HTTPError as post_error:
                log.error("run %s failed and the controller was not told (%s): %s",
                          a.run_id, post_error, reason)
        finally:
            if tracker is not None:
                tracker.stop()
            # An aborted run flushes here too (closing twice sends nothing twice); a run
            # the controller has already ended cannot hear of a loss, so the log keeps it.
            if uploader is not None and (lost := _flush_for_good(uploader)):
                log.error("run %s: %s", a.run_id, lost)
            if session is not None:
                session.close()
            self._on_finished()

    def _run_storm(self, base: str) -> None:
        """A connection storm (agents/connect_storm.py): the barriers as a run's, then the
        storm from the start time; every connect's outcome goes with ``Done.storm``."""
        a = self.assignment
        assert a.storm is not None
        storm = ConnectStormSession(a.broker, a.storm, protocol=a.protocol,
                                    credentials=a.credentials)
        self._session = storm  # woken as a run's session is (wake())
        try:
            self._post(f"{base}/connected", Connected(run_id=a.run_id, agent_id=self._agent_id,
                                                      clients=[], clock=self._clock))
            self._post(f"{base}/ready", Ready(run_id=a.run_id, agent_id=self._agent_id,
                                              clients=[], clock=self._clock,
                                              gpio_backend=self._gpio.backend,
                                              gpio_driver="native"))
            self._started.wait()
            if self._aborted.is_set() or self._start_ns is None:
                return
            storm.run(self._start_ns, self._deadline_ns(self._start_ns),
                      abort=self._aborted.is_set)
            generator = GeneratorReport(mqtt_client="native", nofile_limit=storm.nofile_limit)
            self._post(f"{base}/done", Done(run_id=a.run_id, agent_id=self._agent_id, chunks=0,
                                            published=0, received=0, generator=generator,
                                            storm=storm.outcomes()))
        finally:
            storm.close()

    def _deadline_ns(self, start_ns: int) -> int:
        """End of the run's publishing window plus the drain time for late deliveries."""
        return start_ns + self.assignment.window_ns + int(self.assignment.drain_s * 1e9)


def _clock_columns(clock: ClockEstimate) -> dict[str, int]:
    """The event columns an offset estimate sets."""
    return {"clock_offset_ns": clock.offset_ns,
            "clock_offset_uncertainty_ns": clock.uncertainty_ns}


def _flush_for_good(uploader: ChunkUploader) -> str | None:
    """Flush what the uploader still holds; None if nothing is left, else what was lost."""
    with contextlib.suppress(RuntimeError):  # what is left is counted below
        uploader.close()
    if (left := uploader.buffered) == 0:
        return None
    return (f"{left} events lost: not uploaded when the run ended "
            f"({uploader.error or 'the upload failed'})")
