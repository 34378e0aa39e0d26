"""The controller's database: campaigns, runs, their transitions, agents, event chunks.

SQLite in the data dir by default, or PostgreSQL (psycopg 3) given by URL
(``MQTTBED_DATABASE_URL``, :class:`mqttbed.core.settings.Settings`). The schema is created
and upgraded by Alembic (controller/migrations), never by ``create_all``.

Both databases must behave the same, so the column types here do what one of them would
otherwise do alone: a timestamp is stored in UTC and read back timezone-aware (SQLite hands
back naive ones), and a string longer than its column is refused with the column's limit
named (PostgreSQL refuses it, SQLite would keep it).

PostgreSQL is a server that can restart under a running controller. Its engine checks a
pooled connection before lending it (``pool_pre_ping``), waits for the server to accept
connections again (up to ``reconnect_s``) when it opens one, and :func:`retry_on_disconnect`
runs a whole transaction again when the connection died under it.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from mqttbed.core.settings import DEFAULT_RECONNECT_S, normalize_database_url

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """``TIMESTAMP WITH TIME ZONE``: written in UTC, read back aware and in UTC on both
    databases (SQLite keeps no zone; PostgreSQL answers in its session's zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()}: the database stores "
                             "timezone-aware times only (use mqttbed.controller.db.utcnow)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None,
                             dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class BoundedString(TypeDecorator[str]):
    """``VARCHAR(n)`` whose limit holds on SQLite too: a longer value is refused before it
    is sent, with the limit and the value's length named (PostgreSQL would refuse it with
    a bare DataError; SQLite would keep it, and the two databases would differ)."""

    impl = String
    cache_ok = True

    def __init__(self, length: int):
        super().__init__(length)
        self.length = length

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is not None and len(value) > self.length:
            raise ValueError(f"{len(value)} characters do not fit a column of at most "
                             f"{self.length}: {value[:60]!r}...")
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: UtcDateTime()}


class CampaignRow(Base):
    __tablename__ = "campaigns"
    id: Mapped[str] = mapped_column(BoundedString(32), primary_key=True)
    name: Mapped[str] = mapped_column(BoundedString(200))
    spec: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(BoundedString(16))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(BoundedString(48), primary_key=True)
    campaign_id: Mapped[str] = mapped_column(ForeignKey("campaigns.id"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    point_index: Mapped[int] = mapped_column(Integer)
    repetition: Mapped[int] = mapped_column(Integer)
    # 0 for the first; a run interrupted by its controller is run again as attempt 1, 2 ...
    # (a row of its own, same ordinal), the interrupted row kept (engine.RunEngine.retry).
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    params: Mapped[dict[str, Any]]
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(BoundedString(16))
    reason: Mapped[str | None] = mapped_column(Text)
    run_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]


class TransitionRow(Base):
    __tablename__ = "run_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    from_state: Mapped[str] = mapped_column(BoundedString(16))
    to_state: Mapped[str] = mapped_column(BoundedString(16))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class AgentRow(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(BoundedString(48), primary_key=True)
    name: Mapped[str] = mapped_column(BoundedString(200))
    hostname: Mapped[str] = mapped_column(BoundedString(200))
    pid: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(BoundedString(16))
    info: Mapped[dict[str, Any]]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime | None]


class ChunkRow(Base):
    """One uploaded event chunk; the unique key makes a re-sent chunk a no-op."""

    __tablename__ = "event_chunks"
    __table_args__ = (UniqueConstraint("run_id", "agent_id", "seq", name="uq_chunk"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    agent_id: Mapped[str] = mapped_column(BoundedString(48))
    seq: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class TokenRow(Base):
    """An API token; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(BoundedString(200))
    role: Mapped[str] = mapped_column(BoundedString(16))
    token_sha256: Mapped[str] = mapped_column(BoundedString(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]     # None: never
    revoked_at: Mapped[datetime | None]


class LabHostRow(Base):
    """A lab machine provisioned with ``mqttbed lab provision``; specs name it."""

    __tablename__ = "lab_hosts"
    name: Mapped[str] = mapped_column(BoundedString(64), primary_key=True)
    destination: Mapped[str] = mapped_column(BoundedString(300))   # user@address, as for ssh
    ssh_port: Mapped[int | None] = mapped_column(Integer)
    key_filename: Mapped[str | None] = mapped_column(Text)
    known_hosts: Mapped[str | None] = mapped_column(Text)
    trust_new: Mapped[bool] = mapped_column(Boolean, default=False)
    remote_dir: Mapped[str] = mapped_column(Text)           # holds venv/ and wheelhouse/
    extras: Mapped[str] = mapped_column(BoundedString(64))
    state: Mapped[str] = mapped_column(BoundedString(16))          # provisioned | failed
    version: Mapped[str | None] = mapped_column(BoundedString(64))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reason: Mapped[str | None] = mapped_column(Text)
    provisioned_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


def database_url(data_dir: Path) -> str:
    """The default database: SQLite in the data dir."""
    return f"sqlite:///{(data_dir / 'mqttbed.sqlite').resolve()}"


def shown_url(url: str) -> str:
    """``url`` with its password masked, for logs and messages."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(url: str, reconnect_s: float = DEFAULT_RECONNECT_S) -> Engine:
    """Create an engine for ``url`` (SQLite or PostgreSQL, :func:`normalize_database_url`).

    SQLite gets WAL and a busy timeout (the agent API writes from threads). PostgreSQL gets
    ``pool_pre_ping`` (a connection the server dropped, e.g. across its restart, is
    replaced before use) and, when a connection is opened, ``reconnect_s`` seconds of
    retries while the server refuses connections (restarting, starting up).
    """
    url = normalize_database_url(url)
    serialize = functools.partial(json.dumps, default=str)
    if url.startswith("sqlite"):
        engine = create_engine(url, json_serializer=serialize,
                               connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
        return engine
    engine = create_engine(url, json_serializer=serialize, pool_pre_ping=True)
    shown = shown_url(url)

    @event.listens_for(engine, "do_connect")
    def _connect_when_up(dialect: Dialect, _record: Any, cargs: Any, cparams: Any) -> Any:
        give_up_at = time.monotonic() + reconnect_s
        pause_s = 0.05
        while True:
            try:
                return dialect.loaded_dbapi.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as exc:
                left_s = give_up_at - time.monotonic()
                if left_s <= 0 or not _server_away(exc):
                    raise
                log.log(logging.WARNING if pause_s == 0.05 else logging.DEBUG,
                        "database %s refuses connections (%s); retrying for up to %.0f s",
                        shown, str(exc).strip().splitlines()[0], left_s)
                time.sleep(min(pause_s, left_s))
                pause_s = min(pause_s * 2, 1.0)
    return engine


def _server_away(exc: Exception) -> bool:
    """Whether a failed connect means the server is away (worth waiting for), not that it
    refused us (a wrong password, no such database or role: said at once).

    libpq gives a failed connect no SQLSTATE, only its text: a server that answered sends
    a FATAL message, and only "the database system is starting up / shutting down / in
    recovery mode" among them means it will take connections soon; no FATAL at all is a
    refused, unreachable or timed-out socket.
    """
    text = str(exc)
    return "FATAL" not in text or "the database system is" in text


# How many times a transaction whose connection died is run again: each new attempt opens
# a connection, which waits for the server (make_engine's reconnect_s), so one restart
# costs one attempt; three allow for a server that goes down again as it comes back.
DISCONNECT_RETRIES = 3


def retry_on_disconnect(work: Callable[_P, _T]) -> Callable[_P, _T]:
    """``work`` (one or more whole transactions), run again when the database connection
    died under it (``DBAPIError.connection_invalidated``: a PostgreSQL restart or a
    session ended by an administrator), up to :data:`DISCONNECT_RETRIES` times; any other
    error is raised at once.

    For work whose transactions either commit or leave nothing behind, which a transaction
    that died with its connection does, and for work that sees when it was applied already:
    a connection can die after the server committed and before its answer came. The
    engine's inserting writes check for that (a run's transition finds the row in its
    target state, the next attempt of a run finds its row) and write nothing twice
    (``tests/test_lost_commit.py`` loses those answers through a proxy); the others set
    values, which a second time leaves as they are. On SQLite a connection is never
    invalidated this way: the work runs as it is.
    """
    @functools.wraps(work)
    def again(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in range(DISCONNECT_RETRIES + 1):
            try:
                return work(*args, **kwargs)
            except DBAPIError as exc:
                if not exc.connection_invalidated or attempt == DISCONNECT_RETRIES:
                    raise
                log.warning("the database connection died under %s (%s); running it again",
                            work.__qualname__, str(exc.orig).strip().splitlines()[0])
        raise AssertionError("unreachable")
    return again


def upgrade_schema(url: str) -> None:
    """Bring the database at ``url`` to the newest schema with Alembic."""
    url = normalize_database_url(url)
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser syntax
    command.upgrade(config, "head")


def open_database(url: str, reconnect_s: float = DEFAULT_RECONNECT_S) -> sessionmaker:
    """Upgrade the schema and return a session factory."""
    upgrade_schema(url)
    return sessionmaker(make_engine(url, reconnect_s), expire_on_commit=False)
