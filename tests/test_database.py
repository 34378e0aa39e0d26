"""The Alembic migrations create exactly the schema the models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from mqttbed.controller.db import Base, make_engine, upgrade_schema


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
    upgrade_schema(url)
