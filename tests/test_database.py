"""The Alembic migrations create exactly the schema the models describe."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.orm import sessionmaker

from mqttbed.controller import db
from mqttbed.controller.db import Base, TokenRow, make_engine, upgrade_schema


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(db.__file__).with_name("migrations")))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_migrations_match_the_models(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_schema(url)
    engine = make_engine(url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrading_twice_is_harmless(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_schema(url)
    sessions = sessionmaker(make_engine(url))
    with sessions() as s:
        s.add(TokenRow(name="kept", role="user", token_sha256="0" * 64))
        s.commit()
    upgrade_schema(url)  # at head already: nothing to do, nothing lost
    with sessions() as s:
        assert [t.name for t in s.query(TokenRow)] == ["kept"]
    engine = make_engine(url)
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    engine.dispose()
    sessions.kw["bind"].dispose()
    assert current == ScriptDirectory.from_config(alembic_config(url)).get_current_head()
