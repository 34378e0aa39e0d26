"""Settings shared by the controller, the CLI and the analytics: one object, no globals."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Where data lives and which services to use."""

    data_dir: Path
    database_url: str | None = None       # default: SQLite in data_dir
    spark_master: str | None = None       # default: MQTTBED_SPARK_MASTER or local[*]
    # This machine's address on the lab network (MQTTBED_LAB_ADDRESS): where agents on
    # other machines reach the controller and the brokers it deploys. Default: loopback,
    # which only agents on this machine can reach.
    lab_address: str = "127.0.0.1"

    @classmethod
    def from_env(cls, data_dir: str | Path | None = None, spark_master: str | None = None,
                 database_url: str | None = None) -> Settings:
        """Build settings from arguments, falling back to MQTTBED_* environment variables."""
        return cls(
            data_dir=Path(data_dir or os.environ.get("MQTTBED_DATA_DIR", "data")).resolve(),
            database_url=database_url or os.environ.get("MQTTBED_DATABASE_URL"),
            spark_master=spark_master or os.environ.get("MQTTBED_SPARK_MASTER"),
            lab_address=os.environ.get("MQTTBED_LAB_ADDRESS") or "127.0.0.1",
        )
