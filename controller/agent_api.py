"""The HTTP routes agents talk to (``/agent/v1``), and the store behind chunk uploads.

Routes are plain ``def`` handlers: FastAPI runs them in its thread pool, so a long-poll
for commands blocks one worker thread, not the event loop. The binary chunk route reads
its raw body on the loop and decodes and stores it in that same pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import (
    APIRouter,
    Depends,
    FastAPI,
    Header,
    HTTPException,
    Query,
    Request,
    Response,
    status,
)
from pyarrow.lib import ArrowException
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool

from mqttbed.controller.agent_registry import AgentRegistry
from mqttbed.controller.auth import Caller
from mqttbed.controller.body_limit import BodyLimit
from mqttbed.controller.compaction import compact_run, is_compacted, run_lock
from mqttbed.controller.db import ChunkRow, RunRow
from mqttbed.controller.storage import DataLayout, write_edges, write_event_chunk
from mqttbed.controller.tokens import TokenRole
from mqttbed.core.binary_chunk import CONTENT_TYPE, decode_chunk, edge_arrays, event_arrays
from mqttbed.core.broker_access import reveal_secrets_context
from mqttbed.core.clock import boot_id, monotonic_ns
from mqttbed.core.clock_discipline import (
    CachedDiscipline,
    ClockDiscipline,
    read_discipline,
    realtime_minus_monotonic_ns,
)
from mqttbed.core.protocol import (
    AgentFailure,
    ClockProbe,
    Commands,
    Connected,
    Done,
    Heartbeat,
    Ready,
    Register,
    Registered,
    ResultChunk,
    Subscribed,
)

log = logging.getLogger("mqttbed.agent_api")

HTTP_507_INSUFFICIENT_STORAGE = 507
Authenticate = Callable[[str, str], Caller]   # (token, address) -> who is calling


ChunkListener = Callable[[str, ResultChunk], None]   # (campaign id, chunk newly stored)


class ChunkStore:
    """Stores uploaded chunks once: Parquet file first, then the chunk's row.

    ``on_stored`` hears of each chunk stored for the first time, after its row is
    committed (the live figures, :mod:`mqttbed.controller.live`); a retried upload of a
    chunk already stored is not passed on.
    """

    def __init__(self, sessions: sessionmaker, layout: DataLayout,
                 agent_registry: AgentRegistry, on_stored: ChunkListener | None = None):
        self._sessions = sessions
        self._layout = layout
        self._agent_registry = agent_registry
        self._on_stored = on_stored

    def store(self, chunk: ResultChunk) -> bool:
        """Store ``chunk``; return False if it had been stored before (a retry)."""
        with self._sessions() as session:
            run = session.get(RunRow, chunk.run_id)
            if run is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {chunk.run_id!r}")
            known = session.query(ChunkRow).filter_by(
                run_id=chunk.run_id, agent_id=chunk.agent_id, seq=chunk.seq).first()
            if known is not None:
                return False
            campaign_id = run.campaign_id
            try:
                # Under the run's lock: a compaction never swaps the directory away under
                # a chunk being written.
                with run_lock(self._layout, campaign_id, chunk.run_id):
                    path = write_event_chunk(self._layout, campaign_id, chunk.run_id,
                                             chunk.agent_id, chunk.seq, chunk.columns,
                                             chunk.constants)
                    if chunk.edges:
                        write_edges(self._layout, campaign_id, chunk.run_id, chunk.agent_id,
                                    chunk.seq, chunk.edges)
                    late = is_compacted(path.parent)
            except OSError as exc:
                # The data dir is full or read-only: no row is added, so the database and
                # the files agree; the agent is told it cannot help by retrying.
                raise HTTPException(HTTP_507_INSUFFICIENT_STORAGE,
                                    f"chunk {chunk.seq} of {chunk.agent_id} cannot be stored: "
                                    f"{storage_problem(exc)}") from None
            except (ArrowException, OverflowError, TypeError, ValueError) as exc:
                # Values that do not fit the event schema: the agent's fault, said as such.
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                    f"chunk {chunk.seq} of {chunk.agent_id} does not fit the "
                                    f"event schema: {type(exc).__name__}: {exc}") from None
            session.add(ChunkRow(run_id=chunk.run_id, agent_id=chunk.agent_id, seq=chunk.seq,
                                 rows=chunk.rows, path=str(path)))
            try:
                session.commit()
                stored = True
            except IntegrityError:  # the same chunk raced in on another thread
                session.rollback()
                stored = False
        if stored:
            # Folded before the agent registry counts it: a run collected has every chunk folded.
            if self._on_stored is not None:
                self._on_stored(campaign_id, chunk)
            self._agent_registry.chunk_stored(chunk)
        if late:
            # The run was compacted before this chunk came (an agent retrying its upload
            # after the run ended). Its rows are beside the compacted file, read once; fold
            # them in now so the run is one file again (a copy of a chunk the file holds
            # already, raced in, is dropped). Failing that, they stay a chunk.
            try:
                compact_run(self._layout, campaign_id, chunk.run_id)
            except Exception as exc:  # noqa: BLE001 - the chunk is stored: say so
                log.error("run %s: late chunk %d of %s not compacted (%s: %s)", chunk.run_id,
                          chunk.seq, chunk.agent_id, type(exc).__name__, exc)
        return stored


def storage_problem(exc: OSError) -> str:
    """What went wrong writing under the data dir, naming the path: ``No space left on
    device: /data/events/...``."""
    where = exc.filename or "the data dir"
    return f"{exc.strerror or type(exc).__name__}: {where}"


def agent_router(agent_registry: AgentRegistry, chunks: ChunkStore,
                 authenticate: Authenticate,
                 discipline: Callable[[], ClockDiscipline] = read_discipline) -> APIRouter:
    """Build the ``/agent/v1`` routes over ``agent_registry``; every route needs an agent
    token. ``discipline`` reads this machine's clock discipline (for the clock probes)."""

    def require_agent(request: Request,
                      authorization: Annotated[str | None, Header()] = None) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        caller = authenticate(token if scheme.lower() == "bearer" else "",
                              client_address(request))
        role = caller.role
        if role is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                                f"an agent token is required ({caller.problem})"
                                if caller.problem else "an agent token is required",
                                headers={"WWW-Authenticate": "Bearer"})
        if role != TokenRole.AGENT:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this route takes agent tokens only")

    router = APIRouter(prefix="/agent/v1", tags=["agents"], dependencies=[Depends(require_agent)])
    own_discipline = CachedDiscipline(read=discipline)   # for agents to compare theirs with

    @router.post("/register")
    def register(hello: Register) -> Registered:
        agent_id = agent_registry.register(hello)
        return Registered(agent_id=agent_id,
                          heartbeat_interval_s=agent_registry.heartbeat_interval_s,
                          controller_boot_id=boot_id())

    @router.post("/clock")
    def clock() -> ClockProbe:
        """NTP-style probe: the controller's CLOCK_MONOTONIC on arrival and on departure."""
        t_recv = monotonic_ns()
        discipline = own_discipline.get()
        rm = realtime_minus_monotonic_ns()
        return ClockProbe(t_recv_ns=t_recv, t_send_ns=monotonic_ns(),
                          realtime_minus_monotonic_ns=rm, discipline=discipline)

    @router.post("/agents/{agent_id}/heartbeat")
    def heartbeat(agent_id: str, beat: Heartbeat) -> dict[str, bool]:
        if not agent_registry.heartbeat(agent_id, beat.state):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown agent {agent_id!r}")
        return {"ok": True}

    @router.get("/agents/{agent_id}/commands", response_model=Commands)
    def commands(agent_id: str, wait_s: Annotated[float, Query(ge=0, le=30)] = 5.0
                 ) -> Response:
        """The agent's next commands (long poll): the one route a secret travels on."""
        if agent_registry.agent(agent_id) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown agent {agent_id!r}")
        return commands_response(Commands(commands=agent_registry.take_commands(agent_id,
                                                                                wait_s)))

    def deliver(message: Connected | Subscribed | Ready | Done | AgentFailure
                ) -> dict[str, bool]:
        if not agent_registry.deliver(message):
            raise HTTPException(status.HTTP_409_CONFLICT, f"run {message.run_id!r} is not active")
        return {"ok": True}

    @router.post("/runs/{run_id}/connected")
    def connected(run_id: str, message: Connected) -> dict[str, bool]:
        return deliver(message)

    @router.post("/runs/{run_id}/subscribed")
    def subscribed(run_id: str, message: Subscribed) -> dict[str, bool]:
        return deliver(message)

    @router.post("/runs/{run_id}/ready")
    def ready(run_id: str, message: Ready) -> dict[str, bool]:
        return deliver(message)

    @router.post("/runs/{run_id}/done")
    def done(run_id: str, message: Done) -> dict[str, bool]:
        return deliver(message)

    @router.post("/runs/{run_id}/error")
    def error(run_id: str, message: AgentFailure) -> dict[str, bool]:
        return deliver(message)

    @router.post("/runs/{run_id}/chunks")
    def chunk(run_id: str, message: ResultChunk) -> dict[str, bool]:
        if message.run_id != run_id:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "run id mismatch")
        return {"stored": chunks.store(message)}

    @router.post("/runs/{run_id}/binary-chunks",
                 openapi_extra={"requestBody": {"required": True, "content": {
                     CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
    async def binary_chunk(run_id: str, request: Request) -> dict[str, bool]:
        """A chunk of the native engine's column buffers (:mod:`mqttbed.core.binary_chunk`),
        stored as the JSON route stores its rows."""
        kind = request.headers.get("content-type", "")
        if kind.split(";")[0].strip() != CONTENT_TYPE:
            raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                                f"content-type {kind!r}: binary chunks are {CONTENT_TYPE}")
        body = await request.body()

        def decode_and_store() -> bool:   # off the event loop, as the plain-def routes
            message = binary_result_chunk(body)
            if message.run_id != run_id:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "run id mismatch")
            return chunks.store(message)

        return {"stored": await run_in_threadpool(decode_and_store)}

    return router


def commands_response(commands: Commands) -> Response:
    """``commands`` as the agent reads them: with the values of the assignment's secrets
    (its clients' password and key), which every other dump masks. FastAPI's own
    serialization (the route's response_model) would send the mask, so it is bypassed
    here, and here only."""
    return Response(commands.model_dump_json(context=reveal_secrets_context()),
                    media_type="application/json")


def binary_result_chunk(body: bytes) -> ResultChunk:
    """A binary chunk decoded into the chunk the store takes: its varying columns and its
    GPIO edges as Arrow arrays of the event and edge schemas' types (where a JSON chunk
    holds lists), the rest as sent. 422 naming the column or field when it is malformed."""
    try:
        decoded = decode_chunk(body)
        columns = event_arrays(decoded)
        edges = edge_arrays(decoded)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"binary chunk: {exc}") from None
    header = decoded.header
    # Built unvalidated: decode_chunk checked the envelope and every column already.
    return ResultChunk.model_construct(
        run_id=header.run_id, agent_id=header.agent_id, seq=header.seq, columns=columns,
        constants=header.constants, edges=edges, edges_until_ns=header.edges_until_ns)


def client_address(request: Request) -> str:
    """The TCP peer of a request (what the failed-token limit counts against)."""
    return request.client.host if request.client is not None else "unknown"


def agent_app(router: APIRouter) -> FastAPI:
    """A minimal app serving only the agent routes (the embedded controller of ``mqttbed run``)."""
    app = FastAPI(title="mqttbed agent API")
    app.include_router(router)
    app.add_middleware(BodyLimit)
    return app
