"""A COMMIT the server applied but whose answer was lost: the retried write is not doubled.

``controller.db.retry_on_disconnect`` runs a transaction again when its connection dies.
If the connection died after the server had committed it, the work is already there; the
engine's writes (a run's transition, the next attempt of an interrupted run) see that and
do not write it twice. The fault is real: a proxy in front of the session's PostgreSQL
(``tests/pg_commit_cut.py``) forwards a COMMIT, drops the server's answer and closes the
connection, which psycopg reports as the server having closed it.
"""

from __future__ import annotations

import logging

import psycopg
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow, TransitionRow
from mqttbed.core.settings import Settings
from tests.pg_commit_cut import CommitCutter

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture
def cut_database(postgres):
    """A fresh database on the session's cluster, reached through a commit cutter."""
    url = postgres.create_database()
    cutter = CommitCutter("127.0.0.1", postgres.port)
    yield cutter, url.replace(f":{postgres.port}/", f":{cutter.port}/"), url
    cutter.close()
    postgres.drop_database(url.rsplit("/", 1)[1])


def test_the_cutter_loses_the_answer_of_a_commit_the_server_applied(cut_database):
    cutter, proxied, direct = cut_database
    name = direct.rsplit("/", 1)[1]
    with psycopg.connect(host="127.0.0.1", port=cutter.port, user="mqttbed",
                         dbname=name) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.commit()
        cutter.arm()
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            conn.commit()
    with psycopg.connect(host="127.0.0.1", port=cutter.port, user="mqttbed",
                         dbname=name) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
    assert cutter.cuts == 1


def test_recovery_whose_commits_lose_their_answers_writes_each_row_once(cut_database,
                                                                        tmp_path, caplog):
    cutter, proxied, _ = cut_database
    with create_controller(Settings(data_dir=tmp_path / "data",
                                    database_url=proxied)) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(
            {"name": "lost", "retries": 2, "sweep": {"workload.subscribers": [1, 2]}}))
        with controller.sessions() as s:
            s.get(RunRow, f"{campaign_id}-r0000").state = "running"
            s.commit()
        # recovery commits the run's transition to interrupted, then its next attempt
        # (the campaign was still queued): both applied, neither answer reaching the engine
        cutter.arm(2)
        with caplog.at_level(logging.WARNING, logger="mqttbed.controller.db"):
            assert controller.engine.recover() == 1
        assert cutter.cuts == 2
        assert [m.split(" (")[0] for m in caplog.messages] == [
            "the database connection died under RunEngine._transition",
            "the database connection died under RunEngine.retry"]
        with controller.sessions() as s:
            rows = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(
                RunRow.ordinal, RunRow.attempt)
            assert [(r.id.removeprefix(campaign_id), r.state) for r in rows] == [
                ("-r0000", "interrupted"), ("-r0000-retry1", "queued"), ("-r0001", "queued")]
            transitions = s.query(TransitionRow).filter_by(run_id=f"{campaign_id}-r0000")
            assert [(t.from_state, t.to_state) for t in transitions] == [
                ("running", "interrupted")]
            assert s.get(RunRow, f"{campaign_id}-r0000").run_metadata == {
                "retried_as": f"{campaign_id}-r0000-retry1"}
