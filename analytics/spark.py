"""The one Spark session of a process: created on first use, reused, stopped on request.

pyspark is imported inside the functions, so importing mqttbed.analytics stays cheap and
a host without the ``[analytics]`` extra can still import the package.

A controller that is about to measure starts the session early, on a background thread
(:func:`start_spark_in_background`), so that the JVM's start-up is over by the time the
last run ends, and holds its first run's measurement until that thread has ended. The
start-up (and a warm-up analysis after it) therefore runs at normal priority: nothing is
measured meanwhile, and a niced start beside a busy test suite took 100-200 s in CI. Then
every thread of the JVM is niced (:data:`SPARK_NICE`), so the analyses that follow yield
the CPU to the brokers and agents measuring beside them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from mqttbed.analytics import class_archive
from mqttbed.core.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("mqttbed.spark")

# The one allowed global: the session of this process (Spark allows one per JVM anyway),
# and the lock that makes its creation happen once when two threads ask at the same time.
_session: SparkSession | None = None
_session_lock = threading.Lock()
# set by end_spark: a background start that fails after it (its JVM ended under it, as an
# interrupted command's is) is no failure to report
_ending = threading.Event()

# Nice value of a JVM started by start_spark_in_background once it is up (0 is normal, 19
# the lowest priority): well below the measuring processes, not starved when the machine
# is idle.
SPARK_NICE = 10
# The JIT's quick tier only (Settings.spark_quick_jit): C2 compiles in the background for
# tens of seconds of CPU that a JVM of a few small analyses never earns back.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The most events a campaign's runs may record for `mqttbed run`'s JVM to take the quick
# tier when the setting is unset (quick_jit_suits). Measured here (bench/analysis.py, a
# fresh process's first analysis, 5 runs of 100 subscribers; 2026-11-29, load 2): 100 k
# deliveries 28.5 s with C2, 22.2 s with C1 only; 400 k 36.8 s and 36.5 s, even; 1 M
# 78.4 s and 92.7 s; 2 M, warm, 66 s and 187 s. Half the even point: C1 only where it
# clearly saves.
QUICK_JIT_MAX_EVENTS = 200_000
# Generated classes the session keeps compiled (spark.sql.codegen.cache.maxEntries): room
# for a few analyses' worth, so that analysing again reuses them.
CODEGEN_CACHE_ENTRIES = 2000


def get_spark(settings: Settings | None = None) -> SparkSession:
    """Return this process's Spark session, creating it on the first call.

    Master, driver memory, shuffle partitions and any further properties come from
    ``settings`` (default: :meth:`Settings.load`, i.e. ``MQTTBED_SPARK_*``). Only the first
    call's settings count: later calls get the session already running.
    """
    return _session_or_new(settings)[0]


def _session_or_new(settings: Settings | None) -> tuple[SparkSession, bool]:
    """This process's session, and whether this call created it (under the lock: two
    threads asking at once get one session, and only one of them is told it created it)."""
    with _session_lock:
        if _session is not None:
            return _session, False
        return _create(settings), True


def _create(settings: Settings | None) -> SparkSession:
    global _session
    from pyspark.sql import SparkSession

    _ending.clear()
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
        # One analysis compiles ~160 generated classes; at Spark's default of 100 cached
        # the cache is swept clean each time, and every analysis compiles them all again
        # (Janino, then the JIT): ~2-3 s of compiling and more of JIT per analysis.
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        # PySpark otherwise records the Python call site of every DataFrame call for its
        # error messages: a walk of the stack, a failed `import IPython` and a round trip
        # for a setting, each time: ~470 calls per quickstart analysis, ~0.5 s of the
        # driver's CPU in a cProfile of one (the capture 0.3 s, the session look-ups 0.2).
        # A Spark error still carries Spark's own plan context.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
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
    for key, value in session_conf(settings).items():
        builder = builder.config(key, value)
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("WARN")
    return _session


def quick_jit_suits(events: int | None) -> bool:
    """Whether a JVM started to analyse one campaign of at most ``events`` events (None:
    not known before it runs) spends less with the quick tier alone: its analysis is then
    over before C2's compilations would pay for themselves."""
    return events is not None and events <= QUICK_JIT_MAX_EVENTS


def session_conf(settings: Settings) -> dict[str, str]:
    """The user's ``spark_conf`` with the JVM options mqttbed adds first in each
    ``extraJavaOptions``, the user's after: the class archive (the driver's: it is made
    for the driver's heap) and the quick JIT (the driver's and a cluster's executors')."""
    conf = dict(settings.spark_conf)
    driver, executor = [], []
    if settings.spark_class_archive and (
            archive := class_archive.use_options(settings.spark_driver_memory)) is not None:
        driver.append(archive)
    if settings.spark_quick_jit:
        driver.append(QUICK_JIT)
        executor.append(QUICK_JIT)
    for key, ours in (("spark.driver.extraJavaOptions", driver),
                      ("spark.executor.extraJavaOptions", executor)):
        if ours:
            conf[key] = " ".join([*ours, *([conf[key]] if conf.get(key) else [])])
    return conf


def stop_spark() -> None:
    """Stop this process's Spark session (and its JVM's context), if one is running."""
    global _session
    with _session_lock:
        if _session is not None:
            _session.stop()
            _session = None


def end_spark(wait_s: float = 30.0) -> None:
    """Stop this process's Spark session and end its JVM before the process exits.

    Left to itself, the JVM ends only once it reads the end of its standard input, i.e.
    after the Python process has exited, and then stops the context in its shutdown hooks:
    a command that was interrupted exits while the JVM lives on, holding the terminal or the
    pipes the command's caller reads to their end. A session that another thread is still
    creating is waited for (up to ``wait_s``); a JVM that has not ended ``wait_s`` after its
    input closed is killed.
    """
    global _session
    _ending.set()
    if not _session_lock.acquire(timeout=wait_s):
        log.warning("Spark is still starting after %.0f s; its JVM is ended unstopped", wait_s)
    else:
        try:
            if _session is not None:
                with contextlib.suppress(Exception):  # a broken gateway: the JVM ends below
                    _session.stop()
                _session = None
        finally:
            _session_lock.release()
    pyspark = sys.modules.get("pyspark")
    if pyspark is None:
        return  # this process started no JVM
    gateway = pyspark.SparkContext._gateway
    process = getattr(gateway, "proc", None) if gateway is not None else None
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(OSError):
        process.stdin.close()  # the gateway exits on the end of its input
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        log.warning("the Spark JVM (pid %d) did not end in %.0f s; killed", process.pid, wait_s)
        process.kill()
        process.wait()


@contextlib.contextmanager
def tagged_jobs(spark: SparkSession, tag: str) -> Iterator[None]:
    """The Spark jobs this thread starts within carry ``tag``, so that
    :func:`cancel_tagged` can stop them (their tasks interrupted)."""
    context = spark.sparkContext
    context.addJobTag(tag)
    context.setInterruptOnCancel(True)
    try:
        yield
    finally:
        context.removeJobTag(tag)


def cancel_tagged(tag: str) -> None:
    """Cancel this process's running Spark jobs tagged ``tag``; nothing if no session is
    up (it never starts one). The thread that started them sees its call raise."""
    session = _session
    if session is not None:
        with contextlib.suppress(Exception):   # a session stopping meanwhile: nothing runs
            session.sparkContext.cancelJobsWithTag(tag)


def start_spark_in_background(settings: Settings | None = None,
                              nice: int = SPARK_NICE,
                              then: Callable[[SparkSession], object] | None = None
                              ) -> threading.Thread:
    """Start this process's Spark session on a daemon thread; return the thread.

    ``then`` runs on the same thread once a session this call created is up (a warm-up
    analysis, say); after it, or after its failure, every thread of the JVM is niced by
    ``nice`` (:func:`renice_threads`), so the JVM and whatever it starts later yield the CPU
    while the process's own threads do not. A session already running gets neither. A
    failure is logged, not raised: the analysis that needs the session reports it when it
    asks.
    """
    def start() -> None:
        try:
            spark, created = _session_or_new(settings)
            if not created:
                return
            try:
                if then is not None:
                    then(spark)
            finally:
                renice_threads(spark_jvm_pid(spark), nice)
        except Exception:  # noqa: BLE001 - the analysis asks again and reports it
            if _ending.is_set():   # ended under it (ci8: a traceback after "interrupted")
                log.debug("Spark was ended while it started in the background",
                          exc_info=True)
            else:
                log.exception("starting Spark in the background failed")

    thread = threading.Thread(target=start, name="spark-warm-up", daemon=True)
    thread.start()
    return thread


def renice_threads(pid: int, by: int) -> None:
    """Set every thread of process ``pid`` to the nice value of its main thread plus ``by``
    (at most 19), or leave it where it is already lower in priority.

    Linux keeps a nice value per thread and a new thread takes its creator's: threads that
    appear while this runs are caught by going over the list again until none is left.
    """
    try:
        target = min(19, os.getpriority(os.PRIO_PROCESS, pid) + by)
    except ProcessLookupError:
        return  # the process is gone
    done: set[int] = set()
    while True:
        try:
            threads = {int(tid) for tid in os.listdir(f"/proc/{pid}/task")} - done
        except FileNotFoundError:
            return  # the process is gone
        if not threads:
            return
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                if os.getpriority(os.PRIO_PROCESS, tid) < target:
                    os.setpriority(os.PRIO_PROCESS, tid, target)
            done.add(tid)


def spark_jvm_pid(spark: SparkSession) -> int:
    """The process id of the JVM behind ``spark`` (on this machine)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a live session's context has its gateway's JVM view
    return int(jvm.java.lang.ProcessHandle.current().pid())
