"""Settings: one typed object per role, read from ``MQTTBED_*`` variables and ``.env``.

Every setting has one name in the environment: ``MQTTBED_`` and the field's name in
capitals (``spark_driver_memory`` is ``MQTTBED_SPARK_DRIVER_MEMORY``). A ``.env`` file in
the working directory is read too; the environment wins over it, and an argument given
to :meth:`Settings.load` (a command-line option) wins over both. A bad value is a
:class:`SettingsError` naming the variable and the value. No other module reads
``os.environ`` for mqttbed's own settings.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Self

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mqttbed.core.errors import MqttbedError

ENV_PREFIX = "MQTTBED_"
_CONFIG = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", env_file_encoding="utf-8",
                             extra="ignore", frozen=True)
_JVM_MEMORY = re.compile(r"^[1-9][0-9]*[kKmMgGtT]?$")
# How long the controller waits for its PostgreSQL to come back (a restart, a failover)
# before a database error ends what it was doing.
DEFAULT_RECONNECT_S = 60.0
# The databases the controller is tested on, by URL scheme: SQLite, and PostgreSQL through
# psycopg 3 (SQLAlchemy's bare ``postgresql://`` would mean psycopg2, not installed).
_DATABASE_SCHEMES = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg",
                     "postgres": "postgresql+psycopg", "postgresql+psycopg": "postgresql+psycopg"}


class SettingsError(MqttbedError):
    """A setting has a bad value; the message names its variable and the value."""


class _Loadable(BaseSettings):
    model_config = _CONFIG

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Settings from the environment and ``.env``, with the ``overrides`` that are not
        None on top; a bad value raises :class:`SettingsError`."""
        given = {name: value for name, value in overrides.items() if value is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise SettingsError(_explain(exc, given)) from None


class Settings(_Loadable):
    """The controller's settings (``mqttbed serve``, ``run``, ``analyze``, ``report`` ...)."""

    data_dir: Path = Field(Path("data"), description="where the database, events and results "
                                                     "live")
    database_url: str | None = Field(None, description=(
        "the controller's database: sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB "
        "(psycopg 3; ?host=/socket/dir for a unix socket); default: SQLite in data_dir"))
    database_reconnect_s: float = Field(DEFAULT_RECONNECT_S, gt=0, le=3600, description=(
        "how long the controller waits for a restarting PostgreSQL before a database error "
        "fails what it was doing"))
    # This machine's address on the lab network: where agents on other machines reach the
    # controller and the brokers it deploys. Loopback: only agents on this machine can.
    lab_address: str = Field("127.0.0.1", description="this machine's address on the lab "
                                                      "network")
    # The controller answers every agent's clock probe with its own clock discipline; its
    # chronyd is asked through chronyc, at chronyc's default socket unless this says where.
    chronyc_socket: str | None = Field(None, description=(
        "the command socket (chrony.conf's bindcmdaddress) of the chronyd that keeps this "
        "machine's clock, which the controller reports to agents for chrony's offset "
        "method; default: chronyc's own (/run/chrony/chronyd.sock, then UDP port 323)"))
    spark_master: str = Field("local[*]", description="Spark master URL: local[N] or "
                                                      "spark://HOST:PORT")
    spark_driver_memory: str = Field("2g", description="the Spark driver's heap (JVM size, "
                                                       "e.g. 2g)")
    spark_executor_memory: str | None = Field(None, description="each executor's heap on a "
                                                                "cluster (default: Spark's)")
    spark_shuffle_partitions: int = Field(4, ge=1, description="spark.sql.shuffle.partitions")
    spark_warm_up: bool = Field(True, description=(
        "a Spark session started for a campaign first analyses a tiny synthetic campaign, "
        "before the first run measures, so the analysis after the last run is a warm one"))
    analysis_per_run: bool = Field(True, description=(
        "each ended run's own figures are computed while the next run deploys (cancelled "
        "once it is ready to measure) and kept beside the run; the analysis after the last "
        "run then aggregates the points' pooled figures and the runs' figures not kept"))
    spark_class_archive: bool = Field(True, description=(
        "the Spark JVM maps the class archive `make install` made (python -m "
        "mqttbed.controller.class_archive), where one exists for this Java, Spark and "
        "driver memory: a cheaper start (mqttbed.analytics.class_archive)"))
    spark_quick_jit: bool | None = Field(None, description=(
        "the Spark JVMs (the driver, a cluster's executors) compile with the quick tier "
        "only (C1, -XX:TieredStopAtLevel=1): "
        "a third less CPU for a JVM that lives for a few small analyses (a session and one "
        "analysis of a few thousand events: 66 s of CPU, 44 s with it), three times the "
        "time for an analysis of millions of events (2 M deliveries: 66 s, 187 s with it). "
        "Unset: `mqttbed run` uses it for a campaign whose runs record few enough events "
        "(mqttbed.analytics.spark.quick_jit_suits), every other JVM does not"))
    spark_conf: dict[str, str] = Field(default_factory=dict, description=(
        "further Spark properties as JSON, e.g. {\"spark.hadoop.fs.s3a.endpoint\": \"...\"}"))
    auth_failures_per_minute: int = Field(10, ge=1, le=100_000, description=(
        "wrong tokens one address may present per minute before it gets 429"))
    tls_cert: str | None = Field(None, description="PEM certificate (chain) `mqttbed serve` "
                                                   "serves HTTPS with")
    tls_key: str | None = Field(None, description="its private key (PEM)")
    secrets_dir: Path | None = Field(None, description=(
        "the only directory whose files a campaign spec sent over REST may name in "
        "broker.tls and broker.auth (default: ~/.config/mqttbed/secrets, outside the data "
        "dir, which is copied and shared with its results)"))

    def broker_secrets_dir(self) -> Path:
        """Where REST campaigns' broker passwords, keys and certificates must be."""
        default = Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config") / "mqttbed/secrets"
        return (self.secrets_dir or default).expanduser().resolve()

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("database_url")
    @classmethod
    def _a_database(cls, value: str | None) -> str | None:
        return None if value is None else normalize_database_url(value)

    @field_validator("lab_address")
    @classmethod
    def _an_address(cls, value: str) -> str:
        ipaddress.ip_address(value)  # agents and brokers are reached at an IP address
        return value

    @field_validator("chronyc_socket")
    @classmethod
    def _a_socket_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("expected the absolute path of chronyd's command socket "
                             "(chronyc -h takes a name without a leading / as a host)")
        return value

    @field_validator("spark_master")
    @classmethod
    def _a_master(cls, value: str) -> str:
        if not re.match(r"^(local(\[(\*|[1-9][0-9]*)\])?|spark://[^/\s]+:[0-9]+|yarn|"
                        r"k8s://\S+)$", value):
            raise ValueError("expected local[*], local[N], spark://HOST:PORT, yarn or k8s://...")
        return value

    @field_validator("spark_driver_memory", "spark_executor_memory")
    @classmethod
    def _jvm_memory(cls, value: str | None) -> str | None:
        if value is not None and not _JVM_MEMORY.match(value):
            raise ValueError("expected a JVM memory size such as 512m or 2g")
        return value

    @classmethod
    def from_env(cls, data_dir: str | Path | None = None, spark_master: str | None = None,
                 database_url: str | None = None) -> Settings:
        """The command line's way in: its options over the environment and ``.env``."""
        return cls.load(data_dir=data_dir, spark_master=spark_master,
                        database_url=database_url)


def normalize_database_url(url: str) -> str:
    """``url`` with the driver the controller uses for its database (psycopg 3 for
    PostgreSQL); a URL of another database, or none at all, raises ValueError."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _DATABASE_SCHEMES or not rest:
        raise ValueError(f"{masked_password(url)!r} is not a database URL mqttbed supports: "
                         "expected sqlite:///PATH or "
                         "postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    return f"{_DATABASE_SCHEMES[scheme]}://{rest}"


def masked_password(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part as ``***``."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


class _ControllerClient(_Loadable):
    """What every client of a controller's HTTP(S) API needs."""

    ca_file: str | None = Field(None, description="trust only this CA (or certificate) for "
                                                  "an https controller (core.tls)")


class ClientSettings(_ControllerClient):
    """``mqttbed campaigns ...`` against a remote controller."""

    url: str = Field("http://127.0.0.1:8000", description="the controller's URL")
    token: str | None = Field(None, description="a user token (mqttbed token create)")


class AgentSettings(_ControllerClient):
    """``mqttbed agent``: the agent token (the controller passes it in the environment,
    never on the command line, where ``ps`` would show it)."""

    agent_token: str | None = Field(None, description="the agent's token (mqttbed token create "
                                                      "--role agent)")


def _explain(exc: ValidationError, given: dict[str, Any]) -> str:
    """One line per bad setting: where it came from, the value, what is wrong."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"])
        field = name.split(".")[0]
        source = f"{field} (given)" if field in given else f"{ENV_PREFIX}{field.upper()}"
        message = error["msg"].removeprefix("Value error, ")
        got = error.get("input")
        if field == "database_url" and isinstance(got, str):
            got = masked_password(got)  # a database URL may carry its password
        lines.append(f"{source}: {message} (got {got!r})")
    return "bad setting: " + "; ".join(lines)
