"""One controller, assembled in one place: ``create_controller(settings) -> Controller``.

A controller is the database, the agent registry, the chunk store, the run engine and the
campaign lifecycle over one data dir, and the stream of documents they emit. Every entry
point builds it here: ``mqttbed run`` (serving its own agent routes on a free port),
``mqttbed serve`` (through ``api.create_app``, which serves the agent routes beside the
REST API), ``mqttbed report`` (reading only) and the tests.
"""

from __future__ import annotations

import hmac
import secrets
import socket
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from types import TracebackType

from fastapi import APIRouter
from sqlalchemy.orm import sessionmaker

from mqttbed.agents.deploy import AgentPool, StartAgents
from mqttbed.controller.agent_api import ChunkStore, agent_app, agent_router
from mqttbed.controller.agent_registry import AgentRecord, AgentRegistry
from mqttbed.controller.auth import AuthFailureLimit, Caller, throttled
from mqttbed.controller.db import (
    AgentRow,
    database_url,
    open_database,
    retry_on_disconnect,
    utcnow,
)
from mqttbed.controller.documents import DocumentStream, Listener
from mqttbed.controller.embedded import BackgroundServer, bind_socket
from mqttbed.controller.engine import EngineContext, RunEngine
from mqttbed.controller.lifecycle import conduct_campaign
from mqttbed.controller.live import LiveFigures
from mqttbed.controller.prometheus import metrics_registry
from mqttbed.controller.states import CampaignStatus
from mqttbed.controller.storage import DataLayout
from mqttbed.controller.tokens import TokenRole, find_token
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.clock_discipline import read_discipline
from mqttbed.core.host import LocalHost, install_journal, installed_journal
from mqttbed.core.process_journal import ProcessJournal
from mqttbed.core.settings import Settings


def create_controller(settings: Settings, *, controller_url: str | None = None,
                      listeners: Iterable[Listener] = (),
                      start_agents: StartAgents = AgentPool) -> Controller:
    """Build a controller over ``settings``' data dir; ``start()`` it to take agents.

    ``controller_url`` is where the agents it starts reach it. Give it when something
    else serves ``agent_router()`` there (``mqttbed serve``'s app), or ``""`` for a
    controller that starts no agent (``mqttbed report``). Without it the controller
    serves its agent routes itself, from ``start()`` to ``stop()``, on a free port of the
    lab address (``mqttbed run``, the tests). ``listeners`` receive every document.
    ``start_agents`` starts a run's agents: processes (:class:`AgentPool`), or in tests
    threads (``mqttbed.agents.in_process``); no entry point but the tests sets it.
    """
    layout = DataLayout(settings.data_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    agent_socket = None
    if controller_url is None:
        # Bound before the controller exists, so that it knows its own URL.
        agent_socket = bind_socket(settings.lab_address, 0)
        host, port = agent_socket.getsockname()
        controller_url = f"http://{host}:{port}"
    try:
        return Controller(settings, layout, DocumentStream(listeners), controller_url,
                          agent_socket, start_agents=start_agents)
    except BaseException:
        if agent_socket is not None:
            agent_socket.close()
        raise


class Controller:
    """Everything a controller keeps, reachable by agents at ``url``.

    A context manager: ``with create_controller(settings) as controller:`` starts it and
    stops it (then closes its database).
    """

    def __init__(self, settings: Settings, layout: DataLayout, documents: DocumentStream,
                 url: str, agent_socket: socket.socket | None = None, *,
                 start_agents: StartAgents = AgentPool):
        self.settings = settings
        self.layout = layout
        self.documents = documents
        self.url = url
        self.sessions: sessionmaker = open_database(settings.database_url
                                                    or database_url(layout.root),
                                                    settings.database_reconnect_s)
        self.agent_registry = AgentRegistry(on_agent_change=self._record_agent)
        # The live figures (GET /metrics) follow the chunks and the documents.
        self.live = LiveFigures(layout)
        documents.subscribe(self.live.on_document)
        self.chunks = ChunkStore(self.sessions, layout, self.agent_registry,
                                 on_stored=self.live.chunk_stored)
        # The agents this controller spawns itself get a token that lives as long as it does.
        self._local_agent_token = secrets.token_urlsafe(32)
        self.auth_failures = AuthFailureLimit(settings.auth_failures_per_minute, 60.0)
        self.engine = RunEngine(EngineContext(
            sessions=self.sessions, layout=layout, agent_registry=self.agent_registry,
            host=LocalHost(settings.lab_address), controller_url=url,
            agent_token=self._local_agent_token, documents=documents,
            agent_env=_agent_env(settings, url), start_agents=start_agents))
        self.live.running_broker = self.engine.running_broker_sample
        self.metrics = metrics_registry(self.sessions, self.live, self.agent_registry)
        self._agent_socket = agent_socket
        self._agent_server = (BackgroundServer(agent_app(self.agent_router()), agent_socket)
                              if agent_socket is not None else None)
        self._serving = False
        self._journal: ProcessJournal | None = None

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> Controller:
        """Serve the agent routes (if it serves them itself), then recover what a previous
        controller left mid-campaign (``RunEngine.recover``: its processes reaped, its
        active runs interrupted and retried). From here on every process this controller
        starts is journalled under the data dir (:mod:`mqttbed.core.process_journal`)."""
        if self._agent_server is not None:
            self._agent_server.start()
            self._serving = True
        try:
            self.engine.recover()
            self._journal = ProcessJournal(self.layout.root).open()
            install_journal(self._journal)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving the agent routes, then close the database and the journal."""
        if self._journal is not None:
            if installed_journal() is self._journal:
                install_journal(None)
            self._journal.close()
            self._journal = None
        if self._serving and self._agent_server is not None:
            self._agent_server.stop()  # closes its socket
            self._serving = False
        elif self._agent_socket is not None:
            self._agent_socket.close()
        self.close()

    def close(self) -> None:
        """Close the database (all a controller that was never started needs)."""
        self.sessions.kw["bind"].dispose()

    def __enter__(self) -> Controller:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- campaigns ------------------------------------------------------------------------

    def run_campaign(self, campaign_id: str) -> CampaignStatus:
        """Take the campaign through its lifecycle (runs, analysing, final status); return
        the final status. Blocks until the statistics are written or have failed."""
        return conduct_campaign(self.engine, self.layout, campaign_id, self.settings)

    # -- agents ---------------------------------------------------------------------------

    def authenticate(self, token: str, address: str) -> Caller:
        """Check the token ``address`` presented: a stored token's role, AGENT for local
        agents, else None and why. Wrong tokens count against the address; one over its
        limit gets 429 whatever it presents (:mod:`mqttbed.controller.auth`)."""
        retry_after = self.auth_failures.retry_after_s(address)
        if retry_after is not None:
            raise throttled(address, retry_after, self.auth_failures)
        if not token:
            return Caller(None)
        if hmac.compare_digest(token.encode("utf-8", errors="surrogatepass"),
                               self._local_agent_token.encode()):
            return Caller(TokenRole.AGENT)
        record = find_token(self.sessions, token)
        problem = "unknown token" if record is None else record.problem(utcnow())
        if problem is None and record is not None:
            return Caller(record.role)
        self.auth_failures.record_failure(address)
        return Caller(None, problem)

    def agent_router(self) -> APIRouter:
        """The ``/agent/v1`` routes, open to agent tokens only."""
        socket = self.settings.chronyc_socket
        return agent_router(self.agent_registry, self.chunks, self.authenticate,
                            discipline=lambda: read_discipline(chronyc_socket=socket))

    @retry_on_disconnect
    def _record_agent(self, record: AgentRecord) -> None:
        """Keep the agents table in step with registrations, losses and departures."""
        with self.sessions() as s:
            row = s.get(AgentRow, record.agent_id)
            if row is None:
                hello = record.hello
                row = AgentRow(id=record.agent_id, name=hello.name, hostname=hello.hostname,
                               pid=hello.pid, info=hello.model_dump(mode="json"))
                s.add(row)
            row.state = record.state
            row.last_heartbeat = utcnow() - timedelta(
                seconds=(monotonic_ns() - record.last_seen_ns) / 1e9)
            s.commit()


def _agent_env(settings: Settings, url: str) -> dict[str, str]:
    """What every agent the controller starts gets in its environment besides its token:
    over HTTPS, the controller's certificate to trust (core.tls); an agent on a lab host
    takes its host entry's ``ca_file`` instead (agents.deploy)."""
    if url.startswith("https:") and settings.tls_cert:
        return {"MQTTBED_CA_FILE": str(Path(settings.tls_cert).expanduser().resolve())}
    return {}
