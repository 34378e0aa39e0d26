"""The run engine: drives each run of a campaign through the run state machine.

For each run: deploy the broker, start the agents, wait until every subscriber holds its
SUBACK, hand out one common start time, collect, tear down. Every transition is written
to the database before the work of that state starts, so a restarted controller finds
every run in a known state. Each transition, once written, goes out as a document
(:class:`RunUpdate`, and :class:`CampaignUpdate` for a campaign's status) to whoever
listens (``controller.documents``); storage of events happens in the gateway as chunks
arrive, so a failing run keeps everything that already came in.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy.orm import sessionmaker

from mqttbed.agents.deploy import AgentPool, Agents, Site, StartAgents
from mqttbed.agents.native.engine import ensure_built as ensure_native_engine_built
from mqttbed.analytics.connect_storm import write_storm_outcomes
from mqttbed.brokers.cpu_budget import CpuBudget, CpuBudgetError, cpu_budget_unavailable
from mqttbed.brokers.cpu_budget import reap_stale as reap_cpu_budgets
from mqttbed.campaigns.spec import CampaignSpec, SweepPoint, check_access_files, plan_runs
from mqttbed.campaigns.wiring import plan_wiring
from mqttbed.controller.agent_registry import AgentRegistry, RunInbox
from mqttbed.controller.agent_sites import AgentSites, open_sites
from mqttbed.controller.assignments import (
    ClientPlacement,
    agent_roles,
    agents_needed,
    check_away_shapes,
    plan_assignments,
    run_window_ns,
    subscribe_turns,
)
from mqttbed.controller.compaction import (
    compact_run,
    compaction_summary,
    leftover_runs,
)
from mqttbed.controller.db import (
    CampaignRow,
    LabHostRow,
    RunRow,
    TransitionRow,
    retry_on_disconnect,
    utcnow,
)
from mqttbed.controller.documents import CampaignUpdate, DocumentStream, RunUpdate
from mqttbed.controller.impaired_links import ImpairedLinks, has_impaired_clients
from mqttbed.controller.kept_agents import KeptAgents, KeptPool, agents_key
from mqttbed.controller.lab_hosts import lab_host_backends, resolve_named_hosts, target_of
from mqttbed.controller.run_access import conceal, run_access, secret_values
from mqttbed.controller.scope_recorder import ScopeRecorder
from mqttbed.controller.states import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    CampaignStatus,
    RunState,
    check_transition,
)
from mqttbed.controller.storage import (
    DataLayout,
    write_backend_records,
    write_broker_samples,
    write_json,
    write_sys_samples,
)
from mqttbed.core.backends import (
    BrokerBackend,
    ConfiguresAccess,
    FaultSchedule,
    LocalProcesses,
    MultiBroker,
    OwnNetwork,
    RestartsBroker,
    RunsOnLabHost,
    create_backend,
    declaration,
)
from mqttbed.core.broker_access import SecretUnavailable
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import BackendError, MissingSystemDependency, RunFailed, SpecError
from mqttbed.core.host import Host
from mqttbed.core.process_journal import reap_stale as reap_processes
from mqttbed.core.protocol import Endpoint, Shutdown, StartAt, Subscribe
from mqttbed.core.run_record import (
    BrokerDeployment,
    DeliveryCounts,
    GpioLine,
    RunRecord,
    run_record,
)
from mqttbed.core.samples import BrokerResourceSample, SysTopicsSource
from mqttbed.core.ssh import SshError, SshHost
from mqttbed.network.topology import reap_stale

log = logging.getLogger("mqttbed.engine")

COLLECT_TIMEOUT_S = 30.0
RUN_GRACE_S = 10.0
# How long a deployed run holds its measurement for the analysis (the JVM's start-up and
# warm-up, measured here at load 4-8: start 4-13 s, warm-up 25-28 s; the previous run's own
# figures); past it the run measures anyway, and says so in the log.
ANALYSIS_START_WAIT_S = 180.0
# what a held run waits for unless hold_measurements names something else
JVM_START = "the analysis JVM to start"
AGENT_REPORT_GRACE_S = 1.0  # after one agent's error, for the others' reports
BROKER_EXIT_GRACE_S = 0.5   # after the agents' errors, for the broker's exit to show


_EXIT = re.compile(r"exited with code (-?\d+)(?: \(killed by (SIG\w+)\))?")


def broker_died(health: str) -> str:
    """A run's reason from a broker's failed health check: ``broker died: SIGKILL; ...``
    when its process ended (the signal, or the exit code), else the check's own words."""
    if (exited := _EXIT.search(health)) is None:
        return health
    how = exited.group(2) or f"exit code {exited.group(1)}"
    return f"broker died: {how}; {health.removeprefix('broker died: ')}"


RESTARTED = "controller restarted during the run"


class RunInterrupted(Exception):
    """The run was stopped on purpose (cancel, Ctrl-C, the controller stopping)."""


@dataclass
class _LiveRun:
    """What one run has started so far: torn down, whatever happens, when it ends."""

    spec: CampaignSpec
    inbox: RunInbox
    record: RunRecord   # what the run recorded so far
    backend: BrokerBackend | None = None
    sites: AgentSites | None = None
    pool: Agents | None = None
    recorder: ScopeRecorder | None = None
    links: ImpairedLinks | None = None
    broker_host: SshHost | None = None   # the lab host the broker runs on, if not here
    budget: CpuBudget | None = None      # the brokers' cgroup under broker.cpu_limit
    active: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)   # masked in the run's reason
    agents_key: str | None = None   # set where the run's agents may be kept (kept_agents)
    keep_agents: bool = False       # the run is done: its agents go to the next run
    agents_from: str | None = None  # the run that started its agents (their logs are there)


@dataclass
class EngineContext:
    """Everything the engine works with: one object instead of globals."""

    sessions: sessionmaker
    layout: DataLayout
    agent_registry: AgentRegistry
    host: Host
    controller_url: str
    agent_token: str
    documents: DocumentStream = field(default_factory=DocumentStream)
    agent_env: dict[str, str] = field(default_factory=dict)  # e.g. the CA file over HTTPS
    # How a run's agents are started: processes. Tests that need no process hand in
    # threads instead (mqttbed.agents.in_process); no user-facing setting reaches this.
    start_agents: StartAgents = AgentPool


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(6)}"


def _recorded(backend: BrokerBackend) -> BrokerDeployment:
    """The backend's deployment record as the run records it (its own fields kept)."""
    return BrokerDeployment.model_validate(backend.deployment().model_dump(mode="json"))


def latest_attempts(runs: Iterable[RunRow]) -> list[RunRow]:
    """The last attempt of each run (by ordinal), in ordinal order: what a campaign's
    outcome and statistics count. Earlier attempts were interrupted and retried."""
    latest: dict[int, RunRow] = {}
    for run in runs:
        if run.ordinal not in latest or run.attempt > latest[run.ordinal].attempt:
            latest[run.ordinal] = run
    return [latest[ordinal] for ordinal in sorted(latest)]


def _queued_run(campaign_id: str, ordinal: int, point: SweepPoint, repetition: int) -> RunRow:
    """The row of a run not started yet."""
    return RunRow(id=f"{campaign_id}-r{ordinal:04d}", campaign_id=campaign_id, ordinal=ordinal,
                  point_index=point.index, repetition=repetition, params=point.params,
                  spec=point.spec.model_dump(mode="json"), state=RunState.QUEUED,
                  run_metadata=RunRecord().stored())


class RunEngine:
    """Creates campaigns from specs and executes their runs one after another."""

    def __init__(self, ctx: EngineContext):
        self.ctx = ctx
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._stopping: str | None = None  # why the controller is stopping, once it is
        self._running: tuple[str, _LiveRun] | None = None   # (run id, its live run)
        self._analysis_starting: threading.Thread | None = None  # see hold_measurements
        self._held_for = JVM_START
        self._give_way: Callable[[], None] | None = None   # see hold_measurements
        self._run_ended: Callable[[str], None] | None = None     # see after_each_run
        self._kept = KeptAgents(ctx.agent_registry, self._stop_and_close)
        self._keeping = 0   # agents_kept() depth: while > 0 a done run's agents are kept

    # -- campaigns ----------------------------------------------------------------------

    def create_campaign(self, spec: CampaignSpec) -> str:
        """Store the campaign and its planned runs (state queued); return the campaign id."""
        spec = resolve_named_hosts(spec, self.ctx.sessions)   # lab hosts named in the spec
        check_access_files(spec)   # on this machine, where each run reads them again
        campaign_id = new_id("c")
        planned = plan_runs(spec)
        # a host without cgroups refuses broker.cpu_limit now, not at each run's deploy
        if (any(run.point.spec.broker.cpu_limit is not None for run in planned)
                and (why := cpu_budget_unavailable()) is not None):
            raise SpecError(why)
        for run in planned:   # sessions and restarts the backend or client cannot give
            try:
                check_away_shapes(run.point.spec)
            except ValueError as exc:
                raise SpecError(str(exc)) from None
        with self.ctx.sessions() as s:
            s.add(CampaignRow(id=campaign_id, name=spec.name, spec=spec.model_dump(mode="json"),
                              status=CampaignStatus.CREATED))
            s.flush()
            for ordinal, run in enumerate(planned):
                s.add(_queued_run(campaign_id, ordinal, run.point, run.repetition))
            s.commit()
        return campaign_id

    def add_run(self, campaign_id: str, point: SweepPoint, repetition: int) -> RunRow:
        """Queue one more run of a campaign (the next ordinal): a search's next probe."""
        with self.ctx.sessions() as s:
            ordinals = [o for (o,) in s.query(RunRow.ordinal).filter_by(campaign_id=campaign_id)]
            row = _queued_run(campaign_id, max(ordinals, default=-1) + 1, point, repetition)
            s.add(row)
            s.commit()
            s.refresh(row)
            s.expunge(row)
        return row

    def cancel(self, campaign_id: str) -> None:
        """Cancel a campaign: its running run stops cleanly (events kept), no more run.

        A campaign that is not running is cancelled at once; a running one when its
        current run has wound down.
        """
        with self._lock:
            self._cancelled.add(campaign_id)
        with self.ctx.sessions() as s:
            row = s.get(CampaignRow, campaign_id)
            # An analysing campaign's runs have ended: there is nothing left to stop, and
            # what they came to was settled before its analysis began.
            under_way = row is not None and row.status in (CampaignStatus.RUNNING,
                                                           CampaignStatus.ANALYSING)
        if not under_way:
            self._interrupt_queued_runs(campaign_id, "campaign cancelled")
            self.set_campaign_status(campaign_id, CampaignStatus.CANCELLED,
                                     "cancelled before it ran")

    def is_cancelled(self, campaign_id: str) -> bool:
        with self._lock:
            return campaign_id in self._cancelled

    def shutdown(self, reason: str) -> None:
        """The controller is stopping (SIGTERM, Ctrl-C): interrupt the running run now.

        Unlike :meth:`cancel` the campaign is not ended: the run is marked interrupted and
        retried (:meth:`retry`), no further run starts, the campaign stays ``running``
        and the next controller on the data dir requeues it. Safe from a signal handler.
        """
        self._stopping = reason

    def running_broker_sample(self) -> tuple[str, BrokerResourceSample] | None:
        """The run under way and its broker's latest resource sample, or None (no run
        under way, no broker deployed yet, no sample taken yet). Safe from any thread."""
        running = self._running
        if running is None or (backend := running[1].backend) is None:
            return None
        samples = backend.resource_samples()
        return (running[0], samples[-1]) if samples else None

    def hold_measurements(self, starting: threading.Thread | None,
                          what: str = JVM_START,
                          give_way: Callable[[], None] | None = None) -> None:
        """Have each run, once deployed, wait for ``starting`` (the thread that starts the
        analysis JVM and warms it up, or that analyses the run before) to end before it
        measures, for at most ANALYSIS_START_WAIT_S; the run records the wait
        (``analysis_start_wait_s``) and the log says it waited for ``what``.

        ``give_way``, if given, is called (again and again, cheaply) from the moment the
        run is deployed until ``starting`` has ended: it asks that work to end now (a
        warm-up or a run's own analysis whose Spark jobs it cancels, leaving them to the
        campaign's analysis), so a run waits for the analysis only as long as its own
        deployment lasted, plus what cannot be cut short (the JVM's start).

        A JVM starting beside a run takes CPU from what is measured, niced or not: on this
        2-core machine it took 0.4-1.0 of a core through the whole first run, and amqtt near
        its capacity (3,084 Hz, 1 -> 10) fell behind, p50 313 and 673 ms in the first runs of
        two campaigns against 0.3-19 ms in their other runs (issue 25). So the start-up
        overlaps the deployment (a broker's start, the agents' CONNACKs), never a
        measurement, and never waits after the last run either.
        """
        self._analysis_starting = starting
        self._held_for = what
        self._give_way = give_way

    def after_each_run(self, hook: Callable[[str], None] | None) -> None:
        """Call ``hook(run_id)`` once each run has ended and released all it held (its
        chunks compacted), unless the controller is stopping; None removes it. A hook
        that raises is logged, never the run's or the campaign's end."""
        self._run_ended = hook

    @contextmanager
    def agents_kept(self) -> Iterator[None]:
        """Within this, a done run's agents are kept for the campaign's next run
        (:mod:`mqttbed.controller.kept_agents`); on leaving the outermost, whatever was
        kept is stopped. :meth:`run_campaign` keeps them for its runs; a caller that runs
        a campaign in several calls (a search's probes) keeps them across all of them."""
        self._keeping += 1
        try:
            yield
        finally:
            self._keeping -= 1
            if self._keeping == 0:
                self._kept.release()

    @property
    def stopping(self) -> str | None:
        """Why the controller is stopping, or None while it runs campaigns."""
        return self._stopping

    def _interrupt_queued_runs(self, campaign_id: str, reason: str) -> None:
        with self.ctx.sessions() as s:
            runs = s.query(RunRow).filter_by(campaign_id=campaign_id, state=RunState.QUEUED).all()
            total = s.query(RunRow).filter_by(campaign_id=campaign_id).count()
        for run in runs:
            self._transition(run, total, RunState.INTERRUPTED, reason)

    def run_campaign(self, campaign_id: str) -> CampaignStatus:
        """Execute every queued run of the campaign; return what they came to (``outcome``).

        The campaign is ``running`` meanwhile, and stays so: its lifecycle
        (``controller.lifecycle``) sets the final status once the statistics exist.
        """
        if self.is_cancelled(campaign_id):
            return CampaignStatus.CANCELLED
        with self.ctx.sessions() as s:
            status = s.get(CampaignRow, campaign_id).status
        if status != CampaignStatus.RUNNING:   # a search comes back for each probe it adds
            self.set_campaign_status(campaign_id, CampaignStatus.RUNNING)
        with self.ctx.sessions() as s:
            runs = (s.query(RunRow).filter_by(campaign_id=campaign_id)
                    .order_by(RunRow.ordinal, RunRow.attempt).all())
        total = len({run.ordinal for run in runs})
        with self.agents_kept():
            for run in runs:
                if self._stopping is not None:
                    break  # the rest stays queued for the next controller
                if run.state != RunState.QUEUED:
                    continue
                if self.is_cancelled(campaign_id):
                    self._transition(run, total, RunState.INTERRUPTED, "campaign cancelled")
                    continue
                self._execute(run, total)
        return self.outcome(campaign_id)[0]

    @retry_on_disconnect
    def outcome(self, campaign_id: str) -> tuple[CampaignStatus, str | None]:
        """What the campaign's runs came to: cancelled, done (all done) or failed; and why.

        A run retried after an interrupted attempt counts by its last attempt."""
        with self.ctx.sessions() as s:
            states = [r.state for r in latest_attempts(
                s.query(RunRow).filter_by(campaign_id=campaign_id).all())]
        if self.is_cancelled(campaign_id):
            final = CampaignStatus.CANCELLED
        elif all(state == RunState.DONE for state in states):
            final = CampaignStatus.DONE
        else:
            final = CampaignStatus.FAILED
        failed = sum(state != RunState.DONE for state in states)
        return final, f"{failed} of {len(states)} runs did not finish" if failed else None

    def recover(self) -> int:
        """Clean up after a controller that stopped mid-campaign; return the runs interrupted.

        Whatever processes a dead controller on this data dir left running are killed
        (:mod:`mqttbed.core.process_journal`), as are network topologies whose builder
        died (a ``p4`` run killed mid-way). Runs it left active are marked interrupted
        (their events stay) and retried as a new attempt while the spec's ``retries``
        allow; its running and analysing campaigns go back to the queue, where only
        their queued runs will run before their statistics are computed.
        """
        for reaped in reap_processes(self.ctx.layout.root):
            log.log(logging.WARNING if reaped.killed else logging.INFO,
                    "controller %d (journal %s) left %d process(es) running; killed %s",
                    reaped.controller_pid, reaped.tag, len(reaped.killed),
                    list(reaped.killed))
        reap_stale()
        for path in reap_cpu_budgets():
            log.info("removed the CPU budget cgroup %s a dead controller left", path)
        with self.ctx.sessions() as s:
            stale = s.query(RunRow).filter(RunRow.state.in_(list(ACTIVE_STATES))).all()
            running = [c.id for c in s.query(CampaignRow).filter(CampaignRow.status.in_(
                [CampaignStatus.RUNNING, CampaignStatus.ANALYSING]))]
        for run in stale:
            self._transition(run, 0, RunState.INTERRUPTED, RESTARTED)
            self.retry(run)
        self._compact_left_behind(stale, running)
        for campaign_id in running:
            self.set_campaign_status(campaign_id, CampaignStatus.QUEUED,
                                     "requeued after a controller restart")
        return len(stale)

    def _compact_left_behind(self, stale: list[RunRow], requeued: list[str]) -> None:
        """Compact what a dead controller left uncompacted: runs it was compacting (their
        stage dirs), runs it left active, and the ended runs of its unfinished campaigns."""
        wanted = set(leftover_runs(self.ctx.layout))
        wanted |= {(run.campaign_id, run.id) for run in stale}
        with self.ctx.sessions() as s:
            wanted |= {(run.campaign_id, run.id) for run in s.query(RunRow).filter(
                RunRow.campaign_id.in_(requeued), RunRow.state.in_(list(TERMINAL_STATES)))}
        for campaign_id, run_id in sorted(wanted):
            self.compact(campaign_id, run_id)

    @retry_on_disconnect
    def retry(self, run: RunRow) -> str | None:
        """Queue the next attempt of ``run``, interrupted by its controller, if the spec's
        ``retries`` allow; return the new attempt's run id (None: no retry left).

        The attempt is a run row of its own (same ordinal, point and repetition, id
        ``...-rNNNN-retryK``), so the interrupted attempt keeps its state, reason and events
        on disk, flagged ``retried_as`` in its metadata; only the last attempt of a run
        counts in the campaign's outcome and statistics (:func:`latest_attempts`).
        """
        if run.attempt >= CampaignSpec.model_validate(run.spec).retries:
            return None
        attempt = run.attempt + 1
        retry_id = f"{run.campaign_id}-r{run.ordinal:04d}-retry{attempt}"
        with self.ctx.sessions() as s:
            if (done := s.get(RunRow, retry_id)) is not None:
                # a try whose COMMIT was applied but never answered: it wrote both rows
                run.run_metadata = s.get(RunRow, run.id).run_metadata
                return done.id
            s.add(RunRow(id=retry_id, campaign_id=run.campaign_id, ordinal=run.ordinal,
                         point_index=run.point_index, repetition=run.repetition,
                         attempt=attempt, params=run.params, spec=run.spec,
                         state=RunState.QUEUED,
                         run_metadata=RunRecord(retry_of=run.id).stored()))
            interrupted = s.get(RunRow, run.id)
            record = run_record(interrupted.run_metadata, run.id)
            record.retried_as = retry_id
            interrupted.run_metadata = stored = record.stored()
            s.commit()
        run.run_metadata = stored
        return retry_id

    @retry_on_disconnect
    def set_campaign_status(self, campaign_id: str, status: CampaignStatus,
                            reason: str | None = None) -> None:
        """Write the campaign's status and its reason, then tell the listeners."""
        with self.ctx.sessions() as s:
            row = s.get(CampaignRow, campaign_id)
            row.status = status
            row.reason = reason
            s.commit()
        self.ctx.documents.emit(CampaignUpdate(campaign_id, status, reason))

    # -- one run ------------------------------------------------------------------------

    # This and the engine's other writes are run again whole when a PostgreSQL restart ends
    # their connection (controller.db): a campaign outlives its database server's restart.
    @retry_on_disconnect
    def _transition(self, run: RunRow, total: int, target: RunState,
                    reason: str | None = None, record: RunRecord | None = None) -> None:
        """Write the transition to the database, with what the run recorded so far
        (``record``, validated; None: the row's record as it is), then tell the listeners."""
        current = RunState(run.state)
        check_transition(current, target)
        if record is not None:
            run.run_metadata = record.stored()
        with self.ctx.sessions() as s:
            row = s.get(RunRow, run.id)
            # The row already in ``target`` (a state this engine alone moves it out of
            # ``current`` to): a try whose COMMIT was applied but never answered wrote it.
            if row.state != target:
                row.state = target
                row.reason = reason
                if target == RunState.DEPLOYING:
                    row.started_at = utcnow()
                if target not in ACTIVE_STATES:
                    row.ended_at = utcnow()
                row.run_metadata = dict(run.run_metadata)
                s.add(TransitionRow(run_id=run.id, from_state=current, to_state=target,
                                    reason=reason))
                s.commit()
        run.state = target
        run.reason = reason
        self.ctx.documents.emit(RunUpdate(run.campaign_id, run.id, run.ordinal, total,
                                          run.params, run.repetition, target, reason))

    def _execute(self, run: RunRow, total: int) -> None:
        """Drive one run through its states; whatever happens, stop all it started."""
        live = _LiveRun(spec=CampaignSpec.model_validate(run.spec),
                        inbox=self.ctx.agent_registry.open_inbox(run.id, run.campaign_id),
                        record=run_record(run.run_metadata, run.id))  # e.g. retry_of
        self._running = (run.id, live)
        try:
            self._transition(run, total, RunState.DEPLOYING, record=live.record)
            deploying = monotonic_ns()
            self._deploy(run, live)
            live.record.deploy_s = round((monotonic_ns() - deploying) / 1e9, 3)
            if (starting := self._analysis_starting) is not None and starting.is_alive():
                began = monotonic_ns()
                give_way = self._give_way

                def ended(thread: threading.Thread = starting) -> bool:
                    if give_way is not None and thread.is_alive():
                        give_way()
                    return not thread.is_alive()

                if not self._wait(live, until=ended,
                                  timeout_s=ANALYSIS_START_WAIT_S, fail_on_timeout=False,
                                  waiting_for=self._held_for):
                    log.warning("run %s measures beside the analysis, still waiting for %s "
                                "after %.0f s", run.id, self._held_for, ANALYSIS_START_WAIT_S)
                live.record.analysis_start_wait_s = round((monotonic_ns() - began) / 1e9, 3)
                log.info("run %s waited %.1f s for %s before measuring",
                         run.id, live.record.analysis_start_wait_s, self._held_for)
            self._transition(run, total, RunState.RUNNING, record=live.record)
            self._measure(run, live)
            self._transition(run, total, RunState.COLLECTING, record=live.record)
            self._collect(run, live)
            assert live.backend is not None  # _deploy set it, or raised
            self._finish_run(run, live.backend, live.record, live.budget)
            live.backend = None
            # A scope that failed mid-run leaves the software figures whole: the run is
            # done, marked with the scope's error (its acquisitions so far are kept).
            scope_error = live.recorder.error if live.recorder is not None else None
            self._transition(run, total, RunState.DONE,
                             None if scope_error is None else f"scope error: {scope_error}",
                             record=live.record)
            live.keep_agents = (live.agents_key is not None and self._keeping > 0
                                and self._stopping is None
                                and not self.is_cancelled(run.campaign_id))
        except RunFailed as exc:
            self._end_badly(run, total, live, RunState.FAILED, exc.reason)
        except (RunInterrupted, KeyboardInterrupt) as exc:
            self._end_badly(run, total, live, RunState.INTERRUPTED,
                            str(exc) or "interrupted")
            if self._stopping is not None:
                self.retry(run)
            if isinstance(exc, KeyboardInterrupt):
                raise
        except Exception as exc:  # noqa: BLE001 - a run fails with its reason, never silently
            self._end_badly(run, total, live, RunState.FAILED,
                            f"{type(exc).__name__}: {exc}")
        finally:
            self._running = None
            if live.recorder is not None:
                live.recorder.stop()
            try:
                if live.keep_agents and live.pool is not None and live.sites is not None:
                    assert live.agents_key is not None   # keep_agents says so
                    self._kept.keep(KeptPool(live.agents_key, run.campaign_id, live.sites,
                                             live.pool, live.agents_from or run.id))
                    live.pool = live.sites = None   # the next run's now
                self._teardown(live.pool, live.sites, live.backend, live.links)
            finally:
                self._release(run, live)
        if self._stopping is None and (hook := self._run_ended) is not None:
            try:
                hook(run.id)
            except Exception:  # noqa: BLE001 - what follows a run never ends it
                log.exception("run %s: what follows its end failed", run.id)

    def _release(self, run: RunRow, live: _LiveRun) -> None:
        """After the agents and the broker: the rest a run holds, its scope rows, and its
        chunks compacted."""
        if live.budget is not None:
            try:
                live.budget.remove()
            except CpuBudgetError as exc:
                log.error("run %s: %s", run.id, exc)
        if live.broker_host is not None:
            live.broker_host.close()
        self.ctx.agent_registry.close_inbox(run.id)
        if live.recorder is not None:
            # A failed run keeps the acquisitions it made, like every other event; a
            # data dir that cannot take them must not end the campaign (the run's
            # reason already says why it ended, and _collect's write names the path).
            try:
                live.recorder.write(self.ctx.layout, run.campaign_id, run.id)
            except OSError as exc:
                log.error("run %s: the scope's rows were not stored: %s", run.id, exc)
        # Every agent is stopped and the scope's rows are written: the run's events are
        # complete, whatever state it ended in (a failed run keeps its events too).
        if self._stopping is None:   # a stopping controller leaves it to recover()
            self.compact(run.campaign_id, run.id)

    def compact(self, campaign_id: str, run_id: str) -> None:
        """Compact an ended run's chunk files (``controller.compaction``); a failure is
        logged, never the run's: its chunks stay as they were, and readable."""
        try:
            done = compact_run(self.ctx.layout, campaign_id, run_id)
        except Exception as exc:  # noqa: BLE001 - never the run's or the campaign's end
            log.error("run %s: its chunks were not compacted (%s: %s); they stay as they "
                      "are, readable, for the next compaction", run_id,
                      type(exc).__name__, exc)
            return
        if done:
            log.info("run %s compacted: %s", run_id, compaction_summary(done))

    def _deploy(self, run: RunRow, live: _LiveRun) -> None:
        """Broker up, agents registered and assigned, every subscriber holding its SUBACK."""
        spec, agent_registry = live.spec, self.ctx.agent_registry
        try:   # read now, before anything starts: a file may have gone since the spec came
            access = run_access(spec)
            credentials = access.client_credentials()
        except SecretUnavailable as exc:
            raise RunFailed(str(exc)) from None
        live.secrets = secret_values(access, credentials)
        live.backend = backend = create_backend(spec.broker.backend)
        if isinstance(backend, MultiBroker):
            backend.prepare(spec.workload)
        if (storm := spec.workload.reconnect) is not None:   # workload.reconnect
            if not isinstance(backend, RestartsBroker):
                raise RunFailed(f"workload.reconnect: backend {backend.name} cannot restart "
                                "its broker mid-run (no RestartsBroker capability)")
            backend.keep_sessions(storm.persistent)
        if isinstance(backend, ConfiguresAccess):
            backend.configure_access(access)
        elif asked := access.to_configure():
            raise RunFailed(f"{', '.join(asked)}: backend {backend.name} does not configure "
                            "its broker's access (no configure_access)")
        lab_host = self._broker_lab_host(spec, live)
        if lab_host is None:
            host: Host | SshHost = self.ctx.host
            endpoint = backend.deploy(spec.broker.options(), self.ctx.host)
            if spec.broker.cpu_limit is not None:
                live.budget = self._budget(run, backend, spec.broker.cpu_limit)
        else:
            assert isinstance(backend, RunsOnLabHost)   # checked by _broker_lab_host
            host = lab_host
            endpoint = backend.deploy_on_lab_host(spec.broker.options(), lab_host)
        live.record.broker = _recorded(backend)
        live.record.endpoint = endpoint
        live.record.host = host.name
        if live.budget is not None:
            live.record.cpu_budget = live.budget.record()
        placement = None
        live.agents_key = self._agents_key(spec, backend)
        kept = self._kept.take(live.agents_key, run.campaign_id,
                               spec.timing.heartbeat_timeout_s)
        if kept is not None:   # the last run's agents, alive and heard from
            live.sites, live.pool, live.agents_from = kept.sites, kept.pool, kept.started_by
            log.info("run %s: the agents of run %s take its assignment", run.id,
                     kept.started_by)
        elif has_impaired_clients(spec):
            live.sites, placement = self._impaired_sites(run, live, endpoint)
            controller_url = self.ctx.controller_url
        else:
            live.sites, controller_url = self._agent_sites(spec, live.backend)
        if live.pool is None:
            if spec.workload.client == "native" and any(
                    not isinstance(site.host, SshHost) for site in live.sites.sites):
                _build_native_engine()
            live.pool = self.ctx.start_agents(
                live.sites.sites, controller_url, self.ctx.agent_token, run.id,
                self.ctx.layout.run_dir(run.campaign_id, run.id) / "agents",
                gpio=spec.agents.gpio, gpio_chip=spec.agents.gpio_chip,
                env=self.ctx.agent_env)
            live.agents_from = run.id
        live.record.agent_hosts = live.pool.hosts
        agent_ids = self._await_agents(live.pool, spec, run.campaign_id)
        assignments = plan_assignments(spec, run.id, run.campaign_id, endpoint, agent_ids,
                                       backend.broker_of if isinstance(backend, MultiBroker)
                                       else None, placement, credentials=credentials)
        # An agent gives up on a controller silent as long as it gives up on an agent.
        assignments = {a: x.model_copy(update={"heartbeat_timeout_s":
                                               spec.timing.heartbeat_timeout_s})
                       for a, x in assignments.items()}
        if spec.measurement.scope is not None:
            live.recorder = ScopeRecorder(spec.measurement.scope, assignments,
                                          wiring=plan_wiring(spec))
            live.recorder.open()
            live.record.scope = live.recorder.metadata()
            live.inbox.edge_sink = live.recorder.feed
        for agent_id, assignment in assignments.items():
            agent_registry.send(agent_id, assignment)
        live.active = list(assignments)
        live.record.agents = {a: [c.client_id for c in assignments[a].clients]
                              for a in live.active}
        self._wait(live, until=lambda: len(live.inbox.connected) == len(live.active),
                   timeout_s=spec.timing.setup_timeout_s, waiting_for="agents connected")
        # One rank after the other across agents, each SUBSCRIBE after the last SUBACK: the
        # broker's subscription order is the rank order (first/last subscribed, seed 000).
        started = monotonic_ns()
        for agent_id, ranks in subscribe_turns(assignments):
            agent_registry.send(agent_id, Subscribe(run_id=run.id, ranks=ranks))
            def subscribed(last: int = ranks[-1]) -> bool:
                return last in live.inbox.subscribed

            self._wait(live, until=subscribed,
                       timeout_s=spec.timing.setup_timeout_s,
                       waiting_for=f"the SUBACK of subscriber rank {ranks[-1]}")
        self._wait(live, until=lambda: len(live.inbox.ready) == len(live.active),
                   timeout_s=spec.timing.setup_timeout_s, waiting_for="agents ready")
        ready = live.inbox.ready
        live.record.subscribe_s = (monotonic_ns() - started) / 1e9
        live.record.agent_clocks = {a: r.clock for a, r in ready.items()}
        live.record.gpio = {a: GpioLine(backend=r.gpio_backend, toggle_ns=r.gpio_toggle_ns,
                                        driver=r.gpio_driver, chip=r.gpio_chip)
                            for a, r in ready.items()}
        if live.recorder is not None:
            live.recorder.set_clocks({a: r.clock for a, r in ready.items()})

    def _budget(self, run: RunRow, backend: BrokerBackend, cores: float) -> CpuBudget:
        """The run's cgroup with each broker's processes under ``cores`` (broker.cpu_limit)."""
        brokers = backend.broker_processes() if isinstance(backend, LocalProcesses) else {}
        if not brokers:
            raise RunFailed(f"broker.cpu_limit {cores}: backend {backend.name} started no "
                            "broker process on this machine to put under a CPU budget")
        try:
            budget = CpuBudget.create(run.id, cores)
        except CpuBudgetError as exc:
            raise RunFailed(str(exc)) from None
        try:
            for name, roots in brokers.items():
                budget.add(name, roots)
        except CpuBudgetError as exc:
            budget.remove()
            raise RunFailed(str(exc)) from None
        return budget

    def _broker_lab_host(self, spec: CampaignSpec, live: _LiveRun) -> SshHost | None:
        """The lab host ``broker.host`` names, or None: the broker runs on this machine."""
        if spec.broker.host is None:
            return None
        if not isinstance(live.backend, RunsOnLabHost):
            raise RunFailed(f"broker.host {spec.broker.host!r}: backend {spec.broker.backend} "
                            f"runs on this machine only; on a lab host: "
                            f"{', '.join(lab_host_backends())}")
        with self.ctx.sessions() as s:
            row = s.get(LabHostRow, spec.broker.host)
        if row is None:
            raise RunFailed(f"broker.host: no lab host named {spec.broker.host!r}")
        try:
            live.broker_host = SshHost(target_of(row), name=row.name)
        except SshError as exc:
            raise RunFailed(f"broker.host: {exc}") from exc
        return live.broker_host

    def _agents_key(self, spec: CampaignSpec, backend: BrokerBackend) -> str | None:
        """What the run's agents must match to be the last run's (``kept_agents``); None
        where they are placed for this run alone (impaired links' namespaces, a backend's
        own hosts), which are never kept."""
        if has_impaired_clients(spec) or isinstance(backend, OwnNetwork):
            return None
        return agents_key(spec, agents_needed(spec), self.ctx.controller_url,
                          self.ctx.agent_env)

    def _agent_sites(self, spec: CampaignSpec, backend: BrokerBackend) -> tuple[AgentSites, str]:
        """Where the agents run and the controller URL they use: the backend's placement
        if it has one (``OwnNetwork``), else the campaign's hosts or this machine."""
        needed = agents_needed(spec)
        placement = (backend.agent_placement(agent_roles(spec, needed), self.ctx.controller_url)
                     if isinstance(backend, OwnNetwork) else None)
        if placement is None:
            return open_sites(spec, self.ctx.host, needed), self.ctx.controller_url
        if spec.agents.hosts:
            raise RunFailed(f"backend {backend.name} places the agents on its own hosts: "
                            "leave agents.hosts empty")
        return AgentSites([Site(host) for host in placement.hosts]), placement.controller_url

    def _impaired_sites(self, run: RunRow, live: _LiveRun, endpoint: Endpoint
                        ) -> tuple[AgentSites, ClientPlacement]:
        """Agents of impaired groups in namespaces behind their links; the rest as usual."""
        spec, backend = live.spec, live.backend
        if isinstance(backend, OwnNetwork):
            raise RunFailed(f"backend {spec.broker.backend} places the agents in its own "
                            "network: network.impairments are not supported with it")
        if isinstance(backend, MultiBroker):
            raise RunFailed(f"backend {spec.broker.backend} deploys several brokers: "
                            "network.impairments are not supported with it yet")
        if spec.agents.hosts:
            raise RunFailed("network.impairments put impaired agents in namespaces on this "
                            "machine: leave agents.hosts empty")
        live.links = ImpairedLinks(spec, endpoint, self.ctx.host, self.ctx.controller_url,
                                   self.ctx.layout.run_dir(run.campaign_id, run.id) / "network")
        sites, placement = live.links.open()
        live.record.network = live.links.metadata()
        return sites, placement

    def _measure(self, run: RunRow, live: _LiveRun) -> None:
        """Hand out one start time and wait out the window (an idle broker too)."""
        spec = live.spec
        t_start = monotonic_ns() + int(spec.timing.start_lead_s * 1e9)
        live.record.t_start_ns = t_start
        for agent_id in live.active:
            self.ctx.agent_registry.send(agent_id, StartAt(run_id=run.id, t_start_ns=t_start))
        if live.recorder is not None:
            live.recorder.start(t_start)
        if isinstance(live.backend, FaultSchedule):
            live.backend.started(t_start)  # e.g. arms a fault at a time of the run
        if (storm := spec.workload.reconnect) is not None \
                and isinstance(live.backend, RestartsBroker):
            live.backend.restart_at(t_start + int(storm.restart_at_s * 1e9), storm.down_s)
        window_ns = run_window_ns(spec)
        # closed loop: the window is what publishers are given, not a schedule to wait out
        closed_loop = spec.workload.pacing == "closed-loop"
        closed_loop |= spec.workload.mode == "connect"  # a storm's window is its longest
        self._wait(live, until=lambda: len(live.inbox.done) == len(live.active)
                   and (closed_loop or monotonic_ns() >= t_start + window_ns),
                   timeout_s=spec.timing.start_lead_s + window_ns / 1e9 + spec.timing.drain_s
                   + RUN_GRACE_S, waiting_for="agents done")
        if (recorder := live.recorder) is not None and spec.measurement.scope is not None:
            # The scope may still be catching up on edges (a virtual scope sees them only as
            # they are uploaded): the measure phase lasts until it has what was asked for,
            # bounded by the spec, or until an acquisition sees no trigger now that the
            # publishers are done (no more will come). A shortfall is flagged in the
            # results, never hidden.
            timeouts = recorder.timeouts
            self._wait(live, until=lambda: recorder.finished() or recorder.timeouts > timeouts,
                       timeout_s=spec.measurement.scope.measure_timeout_s,
                       waiting_for="scope acquisitions", fail_on_timeout=False)

    def _collect(self, run: RunRow, live: _LiveRun) -> None:
        """Wait for every chunk the agents said they sent; keep the scope's rows."""
        inbox = live.inbox
        if live.recorder is not None:
            live.recorder.stop()
        self._wait(live, until=lambda: all(len(inbox.chunks[a]) >= inbox.done[a].chunks
                                           for a in live.active),
                   timeout_s=COLLECT_TIMEOUT_S, waiting_for="event chunks")
        live.record.delivery_counts = {
            a: DeliveryCounts(published=d.published, received=d.received,
                              upload_retries=d.upload_retries) for a, d in inbox.done.items()}
        generators = {a: d.generator for a, d in inbox.done.items() if d.generator is not None}
        if generators:
            live.record.generators = generators
        if connections := {a: d.connections for a, d in inbox.done.items() if d.connections}:
            live.record.connections = connections
        if storms := {a: d.storm for a, d in inbox.done.items() if d.storm is not None}:
            write_storm_outcomes(self.ctx.layout.run_dir(run.campaign_id, run.id), storms)
        if reconnects := {a: d.reconnects for a, d in inbox.done.items() if d.reconnects}:
            live.record.reconnects = reconnects   # workload.sessions / workload.reconnect
        if live.links is not None:
            live.record.network = live.links.metadata(with_proxy_stats=True)
        if live.recorder is not None:
            live.recorder.write(self.ctx.layout, run.campaign_id, run.id)
            live.record.scope = live.recorder.metadata(with_acquisitions=True)

    def _await_agents(self, pool: Agents, spec: CampaignSpec, campaign_id: str) -> list[str]:
        """Wait for every agent to register; an agent that exits first fails the run at once."""
        deadline = monotonic_ns() + int(spec.timing.setup_timeout_s * 1e9)
        names = set(pool.names)
        while True:
            self._check_interrupted(campaign_id)
            # In slices, so an agent that died (a missing GPIO device, a missing command
            # on a lab host) is reported now rather than after the whole setup timeout.
            found = self.ctx.agent_registry.wait_for_agents(names, 0.1)
            if len(found) == len(names):
                return [found[name] for name in pool.names]
            if exited := pool.exited():
                raise RunFailed("; ".join(exited))
            if monotonic_ns() > deadline:
                missing = sorted(names - set(found))
                raise RunFailed(f"{', '.join(missing)} did not register within "
                                f"{spec.timing.setup_timeout_s:.0f} s")

    def _wait(self, live: _LiveRun, *, until: Callable[[], bool], timeout_s: float,
              waiting_for: str, fail_on_timeout: bool = True) -> bool:
        """Wait for ``until()``, failing the run at once if anything it depends on breaks.

        Past ``timeout_s`` the run fails, or with ``fail_on_timeout=False`` this returns
        False (True once ``until()`` holds).
        """
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        inbox, spec = live.inbox, live.spec
        while not until():
            self._check_interrupted(inbox.campaign_id)
            # The broker first: its death is why the agents then lose their connections,
            # and their reports can reach the controller before this loop sees it.
            if live.backend is not None and (broken := live.backend.health()) is not None:
                raise RunFailed(broker_died(broken))
            if live.links is not None and (broken := live.links.health()) is not None:
                raise RunFailed(broken)
            if inbox.errors:
                self._hear_the_others(live)
                # A dying broker's connections close before its exit can be seen (the
                # kernel closes its sockets, then makes it a zombie), so its agents' reports
                # can come first: the broker's health has the last word.
                if live.backend is not None and (
                        broken := self._broker_broken_within(live.backend,
                                                             BROKER_EXIT_GRACE_S)) is not None:
                    raise RunFailed(broker_died(broken))
                raise RunFailed("; ".join(e.reason for e in inbox.errors.values()))
            if live.pool is not None and (exited := live.pool.exited()):
                raise RunFailed("; ".join(exited))
            silent = self.ctx.agent_registry.silent_agents(live.active,
                                                           spec.timing.heartbeat_timeout_s)
            if silent:
                raise RunFailed(f"agent lost: {', '.join(silent)}: no heartbeat for "
                                f"{spec.timing.heartbeat_timeout_s:.1f} s")
            if monotonic_ns() > deadline:
                if not fail_on_timeout:
                    return False
                raise RunFailed(f"timed out after {timeout_s:.1f} s waiting for {waiting_for}")
            self.ctx.agent_registry.wait(0.05)
        return True

    @staticmethod
    def _broker_broken_within(backend: BrokerBackend, timeout_s: float) -> str | None:
        """The broker's health reason if it reports one within ``timeout_s``, else None."""
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        while (broken := backend.health()) is None and monotonic_ns() < deadline:
            time.sleep(0.02)
        return broken

    def _hear_the_others(self, live: _LiveRun) -> None:
        """Give the agents that have not reported yet a moment to: a fault that hits them
        all (a full data dir) then has each one's loss in the run's reason, not only the
        first's (an agent told to stop can no longer tell the controller)."""
        deadline = monotonic_ns() + int(AGENT_REPORT_GRACE_S * 1e9)
        inbox = live.inbox
        while monotonic_ns() < deadline and not all(
                a in inbox.errors or a in inbox.done for a in live.active):
            self.ctx.agent_registry.wait(0.05)

    def _check_interrupted(self, campaign_id: str) -> None:
        """Raise RunInterrupted if the controller is stopping or the campaign cancelled."""
        if self._stopping is not None:
            raise RunInterrupted(self._stopping)
        if self.is_cancelled(campaign_id):
            raise RunInterrupted("campaign cancelled")

    def _finish_run(self, run: RunRow, backend: BrokerBackend, record: RunRecord,
                    budget: CpuBudget | None = None) -> None:
        """Store the broker's samples and deployment record, then stop it."""
        backend.teardown()  # its sampler takes one last sample on the way down
        samples = backend.resource_samples()
        record.broker = _recorded(backend)
        if budget is not None:   # with how often the quota held each broker back
            record.cpu_budget = budget.record()
        if isinstance(backend, FaultSchedule):
            record.faults = list(backend.faults())
        run.run_metadata = record.stored()
        write_broker_samples(self.ctx.layout, run.campaign_id, run.id, samples)
        if isinstance(backend, SysTopicsSource):
            write_sys_samples(self.ctx.layout, run.campaign_id, run.id, backend.sys_samples())
        if (section := declaration(backend.name).results_section) is not None:
            write_backend_records(self.ctx.layout, run.campaign_id, run.id,
                                  section.key, backend.section_records())
        write_json(self.ctx.layout.run_dir(run.campaign_id, run.id) / "run.json",
                   {"run_id": run.id, "params": run.params, "repetition": run.repetition,
                    "metadata": run.run_metadata})

    def _end_badly(self, run: RunRow, total: int, live: _LiveRun, state: RunState,
                   reason: str) -> None:
        reason = conceal(reason, live.secrets)
        if live.backend is not None:
            try:
                self._finish_run(run, live.backend, live.record, live.budget)
            except Exception as exc:  # noqa: BLE001 - keep the first reason
                reason = conceal(f"{reason} (and saving broker data failed: {exc})",
                                 live.secrets)
        if RunState(run.state) in ACTIVE_STATES:
            self._transition(run, total, state, reason, record=live.record)

    def _teardown(self, pool: Agents | None, sites: AgentSites | None,
                  backend: BrokerBackend | None, links: ImpairedLinks | None = None) -> None:
        # A pool that fails to stop (agent threads that do not end) fails loudly, after
        # the rest is torn down: the broker never outlives the run.
        try:
            if pool is not None:
                self._stop_agents(pool)
        finally:
            if sites is not None:
                sites.close()
            if links is not None:
                links.close()
            if backend is not None:
                backend.teardown()

    def _stop_and_close(self, pool: Agents | None, sites: AgentSites | None) -> None:
        """Stop kept agents as a run's teardown would, and close their sites."""
        self._teardown(pool, sites, None)

    def _stop_agents(self, pool: Agents) -> None:
        """Tell the run's agents to shut down, stop the pool, and forget them whatever
        its stop raised."""
        agents = self.ctx.agent_registry.wait_for_agents(set(pool.names), 0).values()
        for agent_id in agents:
            self.ctx.agent_registry.send(agent_id, Shutdown())
        try:
            if self._stopping is None:
                pool.stop()
            else:
                # The controller is going: its HTTP server may no longer deliver the
                # Shutdown, and a SIGTERMed agent waits out its long poll. No grace.
                pool.stop(grace_s=0, timeout_s=0.5)
        finally:
            for agent_id in agents:
                self.ctx.agent_registry.forget(agent_id)


def _build_native_engine() -> None:
    """The agents' C engine built on this machine before its agents start: after a fresh
    install the first run's agents would each compile it before registering, 7-36 s here
    under load, past the registration's setup timeout (a lab host's is built by `mqttbed
    lab provision`). A machine that cannot build it fails the run with the reason."""
    try:
        ensure_native_engine_built()
    except (MissingSystemDependency, BackendError) as exc:
        raise RunFailed(f"the agents' native MQTT client (workload.client: native): "
                        f"{exc}") from None
