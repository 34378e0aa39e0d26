"""The controller's database, on SQLite and on a real PostgreSQL (the ``db_url`` fixture):
the Alembic migrations create exactly the schema the models describe, and both databases
keep JSON, timestamps and strings alike. A PostgreSQL that restarts under an engine is
reconnected to."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError
from sqlalchemy.orm import sessionmaker

from mqttbed.controller import db
from mqttbed.controller.db import (
    DISCONNECT_RETRIES,
    Base,
    CampaignRow,
    RunRow,
    TokenRow,
    TransitionRow,
    make_engine,
    open_database,
    retry_on_disconnect,
    upgrade_schema,
)
from mqttbed.core.settings import Settings, SettingsError


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(db.__file__).with_name("migrations")))
    config.set_main_option("sqlalchemy.url", url)
    return config


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    engine.dispose()
    return current


def test_migrations_match_the_models(db_url):
    upgrade_schema(db_url)
    engine = make_engine(db_url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrading_twice_is_harmless(db_url):
    upgrade_schema(db_url)
    sessions = sessionmaker(make_engine(db_url))
    with sessions() as s:
        s.add(TokenRow(name="kept", role="user", token_sha256="0" * 64))
        s.commit()
    upgrade_schema(db_url)  # at head already: nothing to do, nothing lost
    with sessions() as s:
        assert [t.name for t in s.query(TokenRow)] == ["kept"]
    sessions.kw["bind"].dispose()
    head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
    assert current_revision(db_url) == head


def test_every_migration_goes_down_and_up_again(db_url):
    upgrade_schema(db_url)
    config = alembic_config(db_url)
    command.downgrade(config, "base")
    engine = make_engine(db_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    for revision in ("0001", "0002", "0003", "0004", "0005"):
        command.upgrade(config, revision)
        assert current_revision(db_url) == revision
    assert current_revision(db_url) == \
        ScriptDirectory.from_config(config).get_current_head()


def a_campaign(sessions: sessionmaker, **fields: object) -> str:
    row = CampaignRow(**{"id": "c0123456789ab", "name": "n", "spec": {}, "status": "created",
                         **fields})
    with sessions() as s:
        s.add(row)
        s.commit()
    return row.id


@pytest.fixture
def sessions(db_url):
    factory = open_database(db_url)
    yield factory
    factory.kw["bind"].dispose()


def test_json_comes_back_as_it_went_in(sessions):
    spec = {"name": "überall ✓", "rates": [1, 2.5, 1e-9, None], "nested": {"a": {"b": [True]}},
            "big": 2**53, "empty": {}, "quote": "it's \"quoted\"\n"}
    a_campaign(sessions, spec=spec)
    with sessions() as s:
        assert s.get(CampaignRow, "c0123456789ab").spec == spec


def test_timestamps_come_back_aware_in_utc_whatever_zone_they_were_written_in(sessions):
    at = datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=2)))  # 23:30 UTC
    a_campaign(sessions, created_at=at)
    with sessions() as s:
        stored = s.get(CampaignRow, "c0123456789ab").created_at
        assert stored == at
        assert stored.tzinfo == UTC
        assert stored.hour == 23
        earlier = s.query(CampaignRow).filter(CampaignRow.created_at < at + timedelta(1)).all()
        assert len(earlier) == 1  # compared as instants on both databases


def test_a_naive_timestamp_is_refused_saying_why(sessions):
    with pytest.raises(StatementError, match="naive datetime 2026-01-01T00:00:00"):
        a_campaign(sessions, created_at=datetime(2026, 1, 1))


def test_strings_fill_their_columns_and_no_more_on_either_database(sessions):
    name = "n" * 200  # the spec's own limit on a campaign name
    reason = "why " * 25_000  # reasons are text: any length
    campaign_id = a_campaign(sessions, name=name, reason=reason)
    longest_run_id = f"{campaign_id}-r9999-retry10"  # spec.retries is at most 10
    with sessions() as s:
        s.add(RunRow(id=longest_run_id, campaign_id=campaign_id, ordinal=9999, point_index=0,
                     repetition=0, params={}, spec={}, state="queued"))
        s.commit()
    with sessions() as s:
        kept = s.get(CampaignRow, campaign_id)
        assert (kept.name, kept.reason) == (name, reason)
        assert s.get(RunRow, longest_run_id) is not None
    with pytest.raises(StatementError, match="201 characters do not fit a column of at "
                                             "most 200"):
        a_campaign(sessions, id="c2", name="n" * 201)


def test_a_transition_row_numbers_itself(sessions):
    campaign_id = a_campaign(sessions)
    with sessions() as s:
        s.add(RunRow(id="r1", campaign_id=campaign_id, ordinal=0, point_index=0,
                     repetition=0, params={}, spec={}, state="queued"))
        s.flush()
        for target in ("deploying", "running"):
            s.add(TransitionRow(run_id="r1", from_state="queued", to_state=target))
        s.commit()
        ids = [t.id for t in s.query(TransitionRow).order_by(TransitionRow.id)]
    assert len(ids) == 2 and ids[0] < ids[1]


# -- settings -----------------------------------------------------------------------------

def test_a_postgresql_url_is_taken_through_psycopg_3(monkeypatch):
    monkeypatch.setenv("MQTTBED_DATABASE_URL", "postgresql://u:pw@db.lab:5432/mqttbed")
    assert Settings.load().database_url == "postgresql+psycopg://u:pw@db.lab:5432/mqttbed"
    monkeypatch.setenv("MQTTBED_DATABASE_URL", "postgres://u@/mqttbed?host=/run/postgresql")
    assert Settings.load().database_url == \
        "postgresql+psycopg://u@/mqttbed?host=/run/postgresql"


@pytest.mark.parametrize("url", ["mysql://u:s3cret@db/x", "db.lab:5432", "postgresql://"])
def test_a_database_url_mqttbed_cannot_use_is_refused_naming_it_but_not_its_password(
        monkeypatch, url):
    monkeypatch.setenv("MQTTBED_DATABASE_URL", url)
    with pytest.raises(SettingsError, match="MQTTBED_DATABASE_URL: .* is not a database URL "
                                            "mqttbed supports") as refused:
        Settings.load()
    assert "s3cret" not in str(refused.value)
    assert url.replace("s3cret", "***") in str(refused.value)


def test_a_bad_reconnect_wait_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("MQTTBED_DATABASE_RECONNECT_S", "0")
    with pytest.raises(SettingsError, match="MQTTBED_DATABASE_RECONNECT_S: .*greater than 0 "
                                            r"\(got '0'\)"):
        Settings.load()


# -- a PostgreSQL that goes away ----------------------------------------------------------

@pytest.fixture
def pg(postgres):
    """A fresh database on the session's cluster, its schema at head; the cluster."""
    url = postgres.create_database()
    upgrade_schema(url)
    yield postgres, url
    postgres.drop_database(url.rsplit("/", 1)[1])


def count_tokens(sessions: sessionmaker) -> int:
    with sessions() as s:
        return s.query(TokenRow).count()


@pytest.mark.integration
def test_pooled_connections_outlive_a_postgresql_restart(pg):
    cluster, url = pg
    sessions = sessionmaker(make_engine(url))
    assert count_tokens(sessions) == 0  # a connection now waits in the pool
    cluster.restart()  # ... and the server has closed it
    assert count_tokens(sessions) == 0  # pool_pre_ping replaced it
    sessions.kw["bind"].dispose()


@pytest.mark.integration
def test_a_connection_opened_while_postgresql_is_down_waits_for_it(pg):
    cluster, url = pg
    engine = make_engine(url, reconnect_s=30)
    cluster.stop()
    down_s = 1.5
    starter = threading.Timer(down_s, cluster.start)
    started_at = time.monotonic()
    starter.start()
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar() == 1
    finally:
        starter.join()
        engine.dispose()
    assert time.monotonic() - started_at >= down_s


@pytest.mark.integration
def test_a_connection_gives_up_after_reconnect_s_naming_the_cause(pg):
    cluster, url = pg
    engine = make_engine(url, reconnect_s=0.5)
    cluster.stop()
    try:
        started_at = time.monotonic()
        with pytest.raises(OperationalError, match="connection"), engine.connect():
            pass
        assert 0.4 < time.monotonic() - started_at < 5
    finally:
        cluster.start()
        engine.dispose()


@pytest.mark.integration
def test_a_database_that_does_not_exist_is_said_at_once_not_waited_for(pg):
    cluster, _ = pg
    engine = make_engine(cluster.url("no_such_db"), reconnect_s=30)
    started_at = time.monotonic()
    with pytest.raises(OperationalError, match='database "no_such_db" does not exist'), \
            engine.connect():
        pass
    assert time.monotonic() - started_at < 5
    engine.dispose()


@pytest.mark.integration
def test_a_transaction_whose_connection_died_is_run_again_whole(pg):
    cluster, url = pg
    sessions = sessionmaker(make_engine(url))
    attempts = []

    def add_token() -> None:
        with sessions() as s:
            s.add(TokenRow(name=f"t{len(attempts)}", role="user",
                           token_sha256=f"{len(attempts):064d}"))
            s.flush()  # the row is written, not committed, when the server ends the session
            attempts.append(s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar())
            if len(attempts) == 1:
                cluster.terminate_backend(attempts[0])
            s.commit()

    retry_on_disconnect(add_token)()
    assert len(attempts) == 2
    with sessions() as s:
        assert [t.name for t in s.query(TokenRow)] == ["t1"]  # the first left nothing
    sessions.kw["bind"].dispose()


@pytest.mark.integration
def test_a_connection_that_keeps_dying_is_given_up_after_the_last_retry(pg):
    cluster, url = pg
    sessions = sessionmaker(make_engine(url))
    attempts = []

    def doomed() -> None:
        with sessions() as s:
            attempts.append(s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar())
            cluster.terminate_backend(attempts[-1])
            s.execute(text("SELECT 1"))

    with pytest.raises(DBAPIError) as died:
        retry_on_disconnect(doomed)()
    assert died.value.connection_invalidated
    assert len(attempts) == DISCONNECT_RETRIES + 1
    sessions.kw["bind"].dispose()


@pytest.mark.integration
def test_other_database_errors_are_not_retried(pg):
    _, url = pg
    sessions = sessionmaker(make_engine(url))
    calls = []

    def bad_sql() -> None:
        calls.append(1)
        with sessions() as s:
            s.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(DBAPIError, match="no_such_table"):
        retry_on_disconnect(bad_sql)()
    assert calls == [1]
    sessions.kw["bind"].dispose()


@pytest.mark.integration
@pytest.mark.postgres
def test_a_cluster_a_killed_test_session_left_running_is_reaped_by_the_next():
    from tests.postgres_cluster import PostgresCluster, reap_stale_clusters

    code = ("import os; from tests.postgres_cluster import temporary_cluster; "
            "print(temporary_cluster().root, flush=True); os._exit(0)")  # no clean-up
    left = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=60, check=True)
    root = Path(left.stdout.strip())
    postmaster = PostgresCluster(root, port=0).postmaster_pid()
    assert postmaster is not None
    assert root in reap_stale_clusters()
    assert not root.exists()
    assert not Path(f"/proc/{postmaster}").exists() or \
        Path(f"/proc/{postmaster}/stat").read_text().split(") ")[1][0] in "ZX"
