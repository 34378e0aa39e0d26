"""The fused Spark pass: every grouped figure of a campaign from one aggregation.

Each family of figures (counts, distributions, items, scope, time sync, backend
sections, series) describes its input as *figure rows* in one long format:

    family, level, key, sub, figure, value, full

``level``/``key`` is the level the row counts in (a run, a sweep point, a run's time
bin); ``sub`` what the family splits a level by (a stream of a message mix, a receiver,
a section, a time bin; null for the level's own rows); ``value`` a double (null for rows
that are only counted); ``full`` whether the group needs its whole quantile sketch
(:data:`mqttbed.analytics.figures.SKETCH_LEVELS`) or only :data:`PERCENTILE_LEVELS`.
The union of all families is grouped once by (family, level, key, sub, figure) and
collected: one Spark action instead of one per figure, and every statistic a family
reads comes from the same aggregate row.

Percentiles are Spark's exact ``percentile`` (linear interpolation between the closest
ranks at (n - 1) q), as before; a percentile does not depend on which other levels are
asked with it, so p50 read from a full sketch equals p50 read from the short list. The
full sketch is computed from the group's sorted values (:func:`sketch`), to the bit what
``percentile`` gives, at a twelfth of its cost for 1,001 levels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

PERCENTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
# Each run's values of a sketched figure are summarised by these quantiles (0, 0.1 %, ...
# 100 %) for the bootstrap; the series' CDFs (0, 1 %, ... 100 %) are every tenth.
SKETCH_LEVELS = [i / 1000 for i in range(1001)]
PERCENTILE_LEVELS = list(PERCENTILES.values())
FIGURE_ROW_COLUMNS = ("family", "level", "key", "sub", "figure", "value", "full")


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """The rows of every frame (of the same columns, by name) as one frame, in at most as
    many partitions as the session's shuffles have.

    A union has a partition per partition of each of its branches (the fused pass's: 39
    for a quickstart, most of them a few rows), and Spark runs a task for each, every task
    deserialising the stage's whole plan. Coalesced, as many tasks as the shuffles have
    partitions do the same work: a tiny campaign's fused pass took 39 tasks and 1.7 s of
    task time, 2 tasks and 0.5 s coalesced (``analysis_conf`` sets the partitions).
    """
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    if len(frames) == 1:
        return union
    return union.coalesce(int(union.sparkSession.conf.get(SHUFFLE_PARTITIONS) or 1))


def figure_rows(frame: DataFrame, family: str, *, level: Column | str = "level",
                key: Column | str = "key", sub: Column | str | None = None,
                figure: Column | str = "figure", value: Column | str | None = "value",
                full: Column | bool = False) -> DataFrame:
    """``frame`` as figure rows of ``family`` (columns or literals for each field)."""
    from pyspark.sql import functions as F

    def column(given: Column | str | None, kind: str) -> Column:
        if given is None:
            return F.lit(None).cast(kind)
        return (F.col(given) if isinstance(given, str) else given).cast(kind)

    return frame.select(
        F.lit(family).alias("family"), column(level, "string").alias("level"),
        column(key, "string").alias("key"), column(sub, "string").alias("sub"),
        column(figure, "string").alias("figure"),
        column(value, "double").alias("value"),
        (F.lit(full) if isinstance(full, bool) else full).alias("full"))


@dataclass(frozen=True)
class Aggregate:
    """One group's statistics, as plain Python numbers (None when empty or not finite)."""

    rows: int
    count: int
    mean: float | None
    std: float | None
    max: float | None
    min: float | None
    sum: float | None
    max_abs: float | None
    # the sketch (SKETCH_LEVELS) of a full group, else None
    quantiles: list[float] | None
    # PERCENTILES by name, from the sketch or the short list
    percentiles: dict[str, float | None]

    def distribution(self) -> dict[str, float | None]:
        """count, mean, std, the PERCENTILES and max: a distribution's figures."""
        return {"count": self.count, "mean": self.mean, "std": self.std,
                **self.percentiles, "max": self.max}


# family, level, key, sub, figure: every figure row names its level and key (a point or
# a run), only ``sub`` (a stream, receiver, section or time bin) may be null
GroupKey = tuple[str, str, str, str | None, str]
GROUP_COLUMNS = ("family", "level", "key", "sub", "figure")


def aggregate_figures(frames: Sequence[DataFrame], *, ranked: bool = False
                      ) -> dict[GroupKey, Aggregate]:
    """Group the union of ``frames`` (figure rows) once; return every group's statistics.

    ``ranked`` takes the quantiles by rank (:func:`ranked_values`) instead of gathering
    each group's values into one aggregation buffer: for campaigns whose groups hold
    millions of values, which the buffers of ``collect_list`` and ``percentile`` (not
    spillable, one per group, all of a task's groups at once) cannot hold in the heap.
    The figures are the same to the bit either way."""
    from pyspark.sql import functions as F

    union = union_all(frames)
    value, full = F.col("value"), F.col("full")
    group = list(GROUP_COLUMNS)
    moments = [F.count("*").alias("rows"), F.count(value).alias("count"),
               F.avg(value).alias("mean"), F.stddev_samp(value).alias("std"),
               F.max(value).alias("max"), F.min(value).alias("min"),
               F.sum(value).alias("sum"), F.max(F.abs(value)).alias("max_abs")]
    columns = [*group, "rows", "count", "mean", "std", "max", "min", "sum", "max_abs"]
    if ranked:
        rows = (union.groupBy(*group).agg(*moments, F.max(full).alias("full"))
                .withColumn("group_id", group_id()).collect())
        # two groups of one id would share their ranks: then the window sorts by the names
        by_id = len({r["group_id"] for r in rows}) == len(rows)
        values = ranked_values(union, by_id=by_id)
        return {_group_key(r): _aggregate(r, _ranked_quantiles(r, values.get(
            r["group_id"] if by_id else _group_key(r), {}))) for r in rows}
    grouped = (union.groupBy(*group)
               .agg(*moments,
                    F.array_sort(F.collect_list(F.when(full, value))).alias("sorted"),
                    F.percentile(F.when(~full, value), PERCENTILE_LEVELS)
                    .alias("percentiles")))
    rows = grouped.select(*columns, sketch("sorted").alias("quantiles"),
                          "percentiles").collect()
    return {_group_key(r): _aggregate(r, _collected_quantiles(r)) for r in rows}


def group_id() -> Column:
    """A 64-bit hash of a row's group columns: what the rank pass sorts and shuffles by
    instead of five strings (its caller checks that no two groups share one)."""
    from pyspark.sql import functions as F

    return F.xxhash64(*GROUP_COLUMNS)


def ranked_values(union: DataFrame, *, by_id: bool = True
                  ) -> dict[Any, dict[int, float]]:
    """The values each group's quantiles are read from, by rank (0 = the smallest), keyed
    by :func:`group_id` (``by_id``) or else by the group's :data:`GroupKey`.

    One Spark action: every group's values sorted by a window (a shuffle and a sort, which
    spill to disk), each ranked and counted, and only the ranks within one of a position
    (n - 1) q kept: of :data:`SKETCH_LEVELS` for a full group (at most ~3,000 rows
    whatever its size), of :data:`PERCENTILE_LEVELS` for the others (at most 12). The
    levels are thousandths, so whether a rank is within one of a position is decided in
    exact integer arithmetic: some level k / 1000 has |(n - 1) k - 1000 rank| <= 1000.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = ["group_id"] if by_id else list(GROUP_COLUMNS)
    ordered = Window.partitionBy(*keys).orderBy("value")
    whole_group = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    named = union.where(F.col("value").isNotNull())
    if by_id:
        named = named.select(group_id().alias("group_id"), "full", "value")
    ranked = named.select(
        *keys, "full", "value",
        (F.row_number().over(ordered) - 1).cast("long").alias("rank"),
        F.count(F.lit(1)).over(whole_group).cast("long").alias("n"))
    short = " OR ".join(f"abs((n - 1) * {k} - 1000 * rank) <= 1000" for k in _PERCENTILE_MILLS)
    # full: some k in 0..1000 with 1000 (rank - 1) <= (n - 1) k <= 1000 (rank + 1), i.e.
    # ceil(1000 (rank - 1) / (n - 1)) <= floor(1000 (rank + 1) / (n - 1)); a group no
    # larger than the levels' ranks keeps everything
    whole = ("rank = 0 OR (1000 * (rank - 1) + n - 2) div (n - 1)"
             " <= (1000 * (rank + 1)) div (n - 1)")
    kept = ranked.where(F.expr(f"CASE WHEN NOT full THEN {short}"
                               f" WHEN n <= {2 * len(SKETCH_LEVELS)} THEN true"
                               f" ELSE {whole} END"))
    found: dict[Any, dict[int, float]] = {}
    for r in kept.select(*keys, "rank", "value").collect():
        key = r["group_id"] if by_id else _group_key(r)
        found.setdefault(key, {})[int(r["rank"])] = float(r["value"])
    return found


def quantile_at(by_rank: Mapping[int, float], n: int, q: float) -> float:
    """The quantile ``q`` of ``n`` values given by rank: at position (n - 1) q, the value of
    rank ``floor`` plus (position - floor) times the step to rank ``ceil``; the same
    floating-point operations in the same order as :func:`sketch` (and ``percentile``)."""
    position = float(n - 1) * q
    lower, upper = math.floor(position), math.ceil(position)
    low = by_rank[lower]
    if lower == upper:
        return low
    return low + (position - float(lower)) * (by_rank[upper] - low)


def sketch(ascending: str) -> Column:
    """The :data:`SKETCH_LEVELS` quantiles of the sorted array of doubles in column
    ``ascending`` (null if empty).

    Exactly what Spark's ``percentile`` gives for those levels: at position (n - 1) q, the
    value of rank ``floor`` plus (position - floor) times the step to rank ``ceil``, the
    same floating-point operations in the same order (checked value by value against
    ``percentile`` in ``tests/test_analytics_passes.py``). ``percentile`` itself rebuilds
    an array of all of a group's distinct values for every level it is asked: 1,001 levels
    over the values of a run cost it about 12 times this sort and look-up.

    Written in SQL, not with Python lambdas: PySpark names a Python lambda's variable
    afresh on every call (``x_14``, then ``x_19``), the generated code carries the name,
    and every analysis compiled its classes again (4 a call, 0.2-0.45 s); SQL's names are
    the ones written.
    """
    from pyspark.sql import functions as F

    array, size = f"`{ascending}`", f"size(`{ascending}`)"
    position = f"CAST({size} - 1 AS DOUBLE) * q"
    lower, upper = f"CAST(floor({position}) AS INT)", f"CAST(ceil({position}) AS INT)"
    low, high = f"element_at({array}, {lower} + 1)", f"element_at({array}, {upper} + 1)"
    at = (f"CASE WHEN {lower} = {upper} THEN {low}"
          f" ELSE {low} + ({position} - CAST({lower} AS DOUBLE)) * ({high} - {low}) END")
    # SKETCH_LEVELS computed in the plan, as Python computes them (k / 1000, one IEEE
    # division): a literal array would make a plan of 1,001 literals
    last = len(SKETCH_LEVELS) - 1
    levels = f"transform(sequence(0, {last}), k -> CAST(k AS DOUBLE) / {float(last)!r}D)"
    return F.expr(f"CASE WHEN {size} > 0 THEN transform({levels}, q -> {at}) END")


# Adaptive query execution re-plans what is left of a query after every shuffle stage and
# runs each stage as a job of its own: on the fused pass (one large plan, small data) that
# re-planning is most of the time, and its partition coalescing buys nothing with few
# shuffle partitions. Off for the analysis only; the session's own setting comes back.
# Small tables (which levels a run counts in, the streams of a mix, the subscriptions) go
# into the plan as literal maps (:func:`literal_map`), and joins are never broadcast:
# every broadcast is a Spark job of its own.
ANALYSIS_CONF = {"spark.sql.adaptive.enabled": "false",
                 "spark.sql.autoBroadcastJoinThreshold": "-1"}


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def shuffle_partitions(spark: SparkSession, held_partitions: int) -> int:
    """How many partitions the analysis's shuffles get: as many as the campaign's events
    are held in, but at least one per core Spark runs tasks on, and never more than the
    session's own ``spark.sql.shuffle.partitions``.

    A quickstart is one held partition: on two cores its shuffles get 2 partitions where
    the session's 4 made twice the tasks for the same rows (``bench/analyze_small.py``:
    ~10 % less JVM CPU per analysis, alternating calls in one process).
    """
    configured = int(spark.conf.get(SHUFFLE_PARTITIONS, "200") or 200)
    return min(configured, max(spark.sparkContext.defaultParallelism, held_partitions))


@contextmanager
def analysis_conf(spark: SparkSession, partitions: int | None = None) -> Iterator[None]:
    """Set ANALYSIS_CONF on ``spark`` for the duration, then restore what was there.

    ``partitions`` (see :func:`shuffle_partitions`), when given, sets the shuffles'
    partitions too."""
    conf = spark.conf
    wanted = dict(ANALYSIS_CONF)
    if partitions is not None:
        wanted[SHUFFLE_PARTITIONS] = str(partitions)
    before = {key: conf.get(key, None) for key in wanted}
    for key, value in wanted.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, was in before.items():
            if was is None:
                conf.unset(key)
            else:
                conf.set(key, was)


def collect_facts(frames: dict[str, DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Collect several small frames in one Spark action: each row as a dict, by name.

    The rows travel as JSON (``to_json`` of the row), so frames of any schema share one
    union; integers stay exact (JSON numbers without a fraction). A null stays a key with
    None (``to_json`` leaves it out by default: a run that measured nothing, its start
    null, lost the key and failed the analysis of every run).
    """
    from pyspark.sql import functions as F

    named = [frame.select(F.lit(name).alias("name"),
                          F.to_json(F.struct(*frame.columns),
                                    {"ignoreNullFields": "false"}).alias("row"))
             for name, frame in frames.items()]
    union = named[0]
    for frame in named[1:]:
        union = union.unionByName(frame)
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in frames}
    for row in union.collect():
        found[row["name"]].append(json.loads(row["row"]))
    return found


class Struct(dict[str, Any]):
    """A struct for :func:`sql_literal`: its fields by name, in order."""


def sql_literal(value: Any) -> str:
    """``value`` as a Spark SQL literal: None, bool, int (bigint), float (double), str,
    a :class:`Struct`, or lists (arrays) and str-keyed dicts (maps) of them.

    A table the driver holds goes into the plan as one expression parsed once
    (``F.expr``): built from ``F.lit`` and friends it costs a round trip to the JVM per
    element (~50 us each; the quickstart's tables were thousands of them per analysis).
    Strings keep every character: a backslash and a quote are escaped, nothing else is
    read as an escape (``tests/test_analytics_passes.py``).
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}L"
    if isinstance(value, float):
        if math.isfinite(value):
            return f"{value!r}D"
        return f"CAST('{value}' AS DOUBLE)"   # 'nan', 'inf', '-inf': Spark reads all three
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Struct):
        return "named_struct(" + ", ".join(f"{sql_literal(name)}, {sql_literal(field)}"
                                           for name, field in value.items()) + ")"
    if isinstance(value, dict):
        return "map(" + ", ".join(f"{sql_literal(k)}, {sql_literal(v)}"
                                  for k, v in value.items()) + ")"
    if isinstance(value, list | tuple):
        return "array(" + ", ".join(sql_literal(item) for item in value) + ")"
    raise TypeError(f"no SQL literal for {type(value).__name__}: {value!r}")


def literal_map(mapping: Mapping[str, Any]) -> Column | None:
    """``mapping`` (values as :func:`sql_literal` takes them) as a map literal of the plan
    (None when empty): a lookup in a table the driver holds, without a join or a
    broadcast. Look up with :func:`lookup`."""
    from pyspark.sql import functions as F

    # an entry without a value (None, an empty map or list) is an absent key: null either way
    present = {key: value for key, value in mapping.items()
               if value is not None and not (isinstance(value, dict | list) and not value)}
    if not present:
        return None
    return F.expr(sql_literal(present))


def lookup(mapping: Column | None, key: Column, kind: str) -> Column:
    """The value of ``key`` in a :func:`literal_map` (of values of type ``kind``); null
    when the key is null or absent."""
    from pyspark.sql import functions as F

    if mapping is None:
        return F.lit(None).cast(kind)
    return F.when(key.isNotNull(), F.try_element_at(mapping, key)).cast(kind)


def number(value: Any) -> float | None:
    """Return ``value`` as a float, None for null, NaN or infinity."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


_SKETCH_INDEX = {name: round(q * (len(SKETCH_LEVELS) - 1)) for name, q in PERCENTILES.items()}
# the PERCENTILES in thousandths (each is one of the SKETCH_LEVELS)
_PERCENTILE_MILLS = sorted(_SKETCH_INDEX.values())
assert all(SKETCH_LEVELS[k] == q for k, q in zip(_PERCENTILE_MILLS, PERCENTILE_LEVELS,
                                                 strict=True))

# a group's sketch (or None) and its short percentiles (or None: read from the sketch)
_Quantiles = tuple[list[float] | None, list[float | None] | None]


def _group_key(row: Row) -> GroupKey:
    return (row["family"], row["level"], row["key"], row["sub"], row["figure"])


def _collected_quantiles(row: Row) -> _Quantiles:
    quantiles = None if row["quantiles"] is None else [float(q) for q in row["quantiles"]]
    return quantiles, row["percentiles"]


def _ranked_quantiles(row: Row, by_rank: Mapping[int, float]) -> _Quantiles:
    n = int(row["count"])
    if n == 0:
        return None, None
    if row["full"]:
        return [quantile_at(by_rank, n, q) for q in SKETCH_LEVELS], None
    return None, [quantile_at(by_rank, n, q) for q in PERCENTILE_LEVELS]


def _aggregate(row: Row, found: _Quantiles) -> Aggregate:
    quantiles, short = found
    if quantiles is not None:
        percentiles = {name: number(quantiles[i]) for name, i in _SKETCH_INDEX.items()}
    else:
        listed = short or [None] * len(PERCENTILES)
        percentiles = {name: number(v) for name, v in zip(PERCENTILES, listed, strict=True)}
    return Aggregate(rows=int(row["rows"]), count=int(row["count"]), mean=number(row["mean"]),
                     std=number(row["std"]), max=number(row["max"]), min=number(row["min"]),
                     sum=number(row["sum"]), max_abs=number(row["max_abs"]),
                     quantiles=quantiles, percentiles=percentiles)
