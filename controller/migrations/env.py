"""Alembic environment: migrations run against the URL the controller passes in."""

from alembic import context

from mqttbed.controller.db import Base, make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise ValueError("alembic's sqlalchemy.url is not set: run the migrations through "
                         "mqttbed.controller.db, which passes the database URL in")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
