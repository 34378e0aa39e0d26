"""The controller's database: campaigns, runs, their transitions, agents, event chunks.

SQLite in the data dir by default, any SQLAlchemy URL otherwise. The schema is created
and upgraded by Alembic (controller/migrations), never by ``create_all``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class CampaignRow(Base):
    __tablename__ = "campaigns"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    campaign_id: Mapped[str] = mapped_column(ForeignKey("campaigns.id"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    point_index: Mapped[int] = mapped_column(Integer)
    repetition: Mapped[int] = mapped_column(Integer)
    # 0 for the first; a run interrupted by its controller is run again as attempt 1, 2 ...
    # (a row of its own, same ordinal), the interrupted row kept (engine.RunEngine.retry).
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    params: Mapped[dict[str, Any]]
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    run_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]


class TransitionRow(Base):
    __tablename__ = "run_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class AgentRow(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    info: Mapped[dict[str, Any]]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime | None]


class ChunkRow(Base):
    """One uploaded event chunk; the unique key makes a re-sent chunk a no-op."""

    __tablename__ = "event_chunks"
    __table_args__ = (UniqueConstraint("run_id", "agent_id", "seq", name="uq_chunk"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    agent_id: Mapped[str] = mapped_column(String(48))
    seq: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class TokenRow(Base):
    """An API token; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]     # None: never
    revoked_at: Mapped[datetime | None]


class LabHostRow(Base):
    """A lab machine provisioned with ``mqttbed lab provision``; specs name it."""

    __tablename__ = "lab_hosts"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    destination: Mapped[str] = mapped_column(String(300))   # user@address, as for ssh
    ssh_port: Mapped[int | None] = mapped_column(Integer)
    key_filename: Mapped[str | None] = mapped_column(Text)
    known_hosts: Mapped[str | None] = mapped_column(Text)
    trust_new: Mapped[bool] = mapped_column(Boolean, default=False)
    remote_dir: Mapped[str] = mapped_column(Text)           # holds venv/ and wheelhouse/
    extras: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))          # provisioned | failed
    version: Mapped[str | None] = mapped_column(String(64))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reason: Mapped[str | None] = mapped_column(Text)
    provisioned_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


def database_url(data_dir: Path) -> str:
    """The default database: SQLite in the data dir."""
    return f"sqlite:///{(data_dir / 'mqttbed.sqlite').resolve()}"


def make_engine(url: str) -> Engine:
    """Create an engine; SQLite gets WAL and a busy timeout (the agent API writes from threads)."""
    engine = create_engine(url, json_serializer=lambda o: json.dumps(o, default=str),
                           connect_args={"check_same_thread": False, "timeout": 30}
                           if url.startswith("sqlite") else {})
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    return engine


def upgrade_schema(url: str) -> None:
    """Bring the database at ``url`` to the newest schema with Alembic."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")


def open_database(url: str) -> sessionmaker:
    """Upgrade the schema and return a session factory."""
    upgrade_schema(url)
    return sessionmaker(make_engine(url), expire_on_commit=False)
