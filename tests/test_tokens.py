"""API tokens: listed, revoked and expired by the CLI, refused at the next request saying
why; wrong tokens limited per address (429 with Retry-After)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from mqttbed.api.app import create_app
from mqttbed.controller.auth import AuthFailureLimit
from mqttbed.controller.cli import main
from mqttbed.controller.db import TokenRow, open_database, utcnow
from mqttbed.controller.tokens import TokenRole, create_token, list_tokens
from mqttbed.core.settings import Settings

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cli(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.fixture
def app_client(tmp_path, db_url):
    """The app on SQLite and on PostgreSQL (``db_url`` sets MQTTBED_DATABASE_URL, which
    the CLI commands of the tests read too)."""
    app = create_app(Settings(data_dir=tmp_path / "data"), "http://127.0.0.1:9",
                     run_campaigns=False)
    assert app.state.controller.settings.database_url == db_url
    with TestClient(app) as client:
        client.controller = app.state.controller
        client.data_dir = tmp_path / "data"
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_token_list_shows_every_token_with_its_state_and_never_the_token(tmp_path, capsys):
    data = str(tmp_path)
    alice = cli(capsys, "token", "create", "--name", "alice", "--data-dir", data).strip()
    cli(capsys, "token", "create", "--name", "pi-7", "--role", "agent", "--expires-in", "90d",
        "--data-dir", data)
    cli(capsys, "token", "revoke", "--name", "alice", "--data-dir", data)
    listed = cli(capsys, "token", "list", "--data-dir", data).splitlines()
    assert len(listed) == 2
    assert listed[0].split()[:4] == ["1", "alice", "user", "revoked"]
    assert listed[0].endswith("expires never")
    assert listed[1].split()[:4] == ["2", "pi-7", "agent", "active"]
    assert "expires never" not in listed[1]
    assert alice not in "\n".join(listed)


def test_revoking_what_does_not_exist_says_so(tmp_path):
    with pytest.raises(SystemExit, match=r"no unrevoked token with id 42; `mqttbed token list`"):
        main(["token", "revoke", "--id", "42", "--data-dir", str(tmp_path)])


def test_a_bad_expiry_names_the_value_and_the_form(tmp_path):
    with pytest.raises(SystemExit, match=r"expiry '3 weeks': give a number and a unit"):
        main(["token", "create", "--name", "x", "--expires-in", "3 weeks",
              "--data-dir", str(tmp_path)])


def test_a_revoked_token_is_refused_at_the_next_request_saying_so(app_client, capsys):
    token = create_token(app_client.controller.sessions, "bob", TokenRole.USER)
    assert app_client.get("/api/v1/campaigns", headers=bearer(token)).status_code == 200
    cli(capsys, "token", "revoke", "--name", "bob", "--data-dir", str(app_client.data_dir))
    refused = app_client.get("/api/v1/campaigns", headers=bearer(token))
    assert refused.status_code == 401
    assert "token 'bob' was revoked at" in refused.json()["detail"]


def test_an_expired_token_is_refused_saying_when_it_expired(app_client):
    sessions = app_client.controller.sessions
    token = create_token(sessions, "brief", TokenRole.AGENT, expires_in=timedelta(hours=1))
    assert app_client.post("/agent/v1/clock", headers=bearer(token)).status_code == 200
    with sessions() as s:
        row = s.query(TokenRow).filter_by(name="brief").one()
        row.expires_at = row.expires_at - timedelta(hours=2)
        s.commit()
    refused = app_client.post("/agent/v1/clock", headers=bearer(token))
    assert refused.status_code == 401
    assert "token 'brief' expired at" in refused.json()["detail"]
    assert [t.state(utcnow()) for t in list_tokens(sessions)] == ["expired"]


def test_wrong_tokens_from_one_address_get_429_with_retry_after_then_are_let_in_again(app_client):
    clock = FakeClock()
    app_client.controller.auth_failures = AuthFailureLimit(3, 60.0, clock=clock)
    good = create_token(app_client.controller.sessions, "carol", TokenRole.USER)
    for n in range(3):
        assert app_client.get("/api/v1/campaigns", headers=bearer(f"mqb_guess{n}")
                          ).status_code == 401
        clock.now += 10
    throttled = app_client.get("/api/v1/campaigns", headers=bearer(good))
    assert throttled.status_code == 429  # even the right token: guessing must not pay
    assert throttled.headers["retry-after"] == "30"
    assert "3 wrong tokens from testclient within 60 s" in throttled.json()["detail"]
    assert app_client.post("/agent/v1/clock", headers=bearer(good)).status_code == 429
    assert app_client.post("/login", data={"token": good}).status_code == 429
    clock.now += 30  # the first failure leaves the window
    assert app_client.get("/api/v1/campaigns", headers=bearer(good)).status_code == 200


def test_requests_without_a_token_are_not_counted_as_failures(app_client):
    app_client.controller.auth_failures = AuthFailureLimit(2, 60.0, clock=FakeClock())
    for _ in range(5):
        assert app_client.get("/api/v1/campaigns").status_code == 401
        assert app_client.get("/", follow_redirects=False).status_code == 303
    assert app_client.get("/api/v1/health").status_code == 200


def test_tokens_of_a_database_from_before_expiry_keep_working(db_url):
    from alembic import command
    from alembic.config import Config

    from mqttbed.controller import db

    url = db_url
    config = Config()
    config.set_main_option("script_location", str(db.Path(db.__file__).with_name("migrations")))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "0002")
    engine = db.make_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO tokens (name, role, token_sha256, created_at) VALUES "
            "('old', 'user', 'ab', '2024-01-01 00:00:00')")
    engine.dispose()
    sessions = open_database(url)  # upgrades to head
    (old,) = list_tokens(sessions)
    assert (old.name, old.expires_at, old.revoked_at) == ("old", None, None)
    sessions.kw["bind"].dispose()
