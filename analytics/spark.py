"""The one Spark session of a process: created on first use, reused, stopped on request.

pyspark is imported inside the functions, so importing mqttbed.analytics stays cheap and
a host without the ``[analytics]`` extra can still import the package.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from mqttbed.core.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The one allowed global: the session of this process (Spark allows one per JVM anyway).
_session: SparkSession | None = None


def get_spark(settings: Settings | None = None) -> SparkSession:
    """Return this process's Spark session, creating it on the first call.

    Master, driver memory, shuffle partitions and any further properties come from
    ``settings`` (default: :meth:`Settings.load`, i.e. ``MQTTBED_SPARK_*``). Only the first
    call's settings count: later calls get the session already running.
    """
    global _session
    if _session is not None:
        return _session
    from pyspark.sql import SparkSession

    settings = settings or Settings.load()
    # Spark's Python workers otherwise start whatever `python3` is first on PATH; a
    # cluster's workers must have the same Python at the same path (a venv in the same
    # place on every host).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = settings.spark_master
    builder = (
        SparkSession.builder.master(master)
        .appName("mqttbed-analytics")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        # run ids such as "0001" must stay strings, not become integers.
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", settings.spark_driver_memory)
    )
    if settings.spark_executor_memory:
        builder = builder.config("spark.executor.memory", settings.spark_executor_memory)
    if master.startswith("local"):
        # Loopback only; a cluster's executors must reach the driver on a real address.
        # SPARK_LOCAL_IP also keeps the JVM from resolving the host name to an outside
        # interface at start-up.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1"))
    else:
        # Executors connect back to the driver at the lab address (a cluster on this
        # machine alone reaches it on loopback).
        builder = builder.config("spark.driver.host", settings.lab_address)
    for key, value in settings.spark_conf.items():
        builder = builder.config(key, value)
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("WARN")
    return _session


def stop_spark() -> None:
    """Stop this process's Spark session (and its JVM's context), if one is running."""
    global _session
    if _session is not None:
        _session.stop()
        _session = None
