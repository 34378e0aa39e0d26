"""The fused pass's quantile sketch is Spark's exact ``percentile``, value for value.

``analytics.passes.sketch`` replaces ``percentile`` at the 1,001 sketch levels (it is
about 12 times cheaper there); every figure built on the sketch, and the bootstrap that
resamples it, must not move by one bit.
"""

from __future__ import annotations

import random

import pytest

from mqttbed.analytics.passes import SKETCH_LEVELS, sketch

pytestmark = pytest.mark.integration


def groups() -> dict[str, list[float]]:
    rng = random.Random(7)
    return {
        "one": [42.5],
        "two": [1.0, 3.0],
        "ties": [5.0] * 40 + [6.0] * 3 + [7.25] * 11,
        "negative": [rng.uniform(-1e3, 1e3) for _ in range(257)],
        "latencies": [rng.lognormvariate(5, 1.2) for _ in range(5000)],
        "integers": [float(rng.randrange(0, 50)) for _ in range(3001)],
    }


def test_the_sketch_equals_percentile_at_every_level_to_the_bit(spark):
    from pyspark.sql import functions as F

    rows = [(name, v) for name, values in groups().items() for v in values]
    rows += [("empty", None)]
    frame = spark.createDataFrame(rows, "g string, v double")
    result = (frame.groupBy("g")
              .agg(F.percentile("v", SKETCH_LEVELS).alias("spark"),
                   F.array_sort(F.collect_list("v")).alias("sorted"))
              .select("g", "spark", sketch("sorted").alias("ours"))
              .collect())
    found = {r["g"]: (r["spark"], r["ours"]) for r in result}
    assert set(found) == {*groups(), "empty"}
    assert found["empty"] == (None, None)
    for name in groups():
        theirs, ours = found[name]
        assert len(ours) == len(SKETCH_LEVELS)
        assert ours == theirs, name   # float equality: the same operations, in order
    # and what it is: the value at rank (n - 1) q, interpolated
    latencies = sorted(groups()["latencies"])
    assert found["latencies"][1][500] == latencies[2499] + 0.5 * (latencies[2500]
                                                                  - latencies[2499])
    assert found["latencies"][1][0] == latencies[0]
    assert found["latencies"][1][-1] == latencies[-1]


def test_the_analysis_shuffles_as_many_partitions_as_it_holds_within_the_sessions_limit(spark):
    from mqttbed.analytics.passes import SHUFFLE_PARTITIONS, analysis_conf, shuffle_partitions

    configured = spark.conf.get(SHUFFLE_PARTITIONS)
    cores = spark.sparkContext.defaultParallelism
    # a small campaign (one held partition): one shuffle partition per core, at most the
    # session's; a large one: the session's
    assert shuffle_partitions(spark, 1) == min(int(configured), cores)
    assert shuffle_partitions(spark, 10_000) == int(configured)
    with analysis_conf(spark, 3):
        assert spark.conf.get(SHUFFLE_PARTITIONS) == "3"
        assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
    assert spark.conf.get(SHUFFLE_PARTITIONS) == configured


def test_quantiles_by_rank_are_the_gathered_ones_to_the_bit(spark, monkeypatch):
    """``ranked`` (a window sort, only the ranks near each level's position collected)
    gives every group the same figures as the gathering aggregation: full groups their
    1,001-level sketch, the others their short percentiles; groups larger than the ranks
    the levels touch (so that most ranks are left out), ties, one value, none."""
    from mqttbed.analytics.passes import aggregate_figures, ranked_values

    rng = random.Random(11)
    values = {**groups(), "large": [rng.lognormvariate(5, 1.2) for _ in range(30_011)],
              "large-ties": [float(rng.randrange(0, 400)) for _ in range(9_000)]}
    rows = [(name, full, v) for name, vs in values.items() for full in (True, False)
            for v in vs]
    rows += [("empty", full, None) for full in (True, False)]
    frame = spark.createDataFrame(rows, "g string, full boolean, v double").selectExpr(
        "'distribution' AS family", "'run' AS level", "g AS key",
        "CAST(NULL AS string) AS sub", "CAST(full AS string) AS figure", "v AS value", "full")
    gathered = aggregate_figures([frame])
    by_rank = aggregate_figures([frame], ranked=True)
    assert len(gathered) == 2 * (len(values) + 1)
    assert by_rank == gathered
    large = sorted(values["large"])
    sketched = by_rank[("distribution", "run", "large", None, "true")]
    assert sketched.quantiles is not None and len(sketched.quantiles) == len(SKETCH_LEVELS)
    position = (len(large) - 1) * 0.999
    assert sketched.percentiles["p999"] == pytest.approx(
        large[int(position)] + (position - int(position)) * (large[int(position) + 1]
                                                              - large[int(position)]))
    short = by_rank[("distribution", "run", "large", None, "false")]
    assert short.quantiles is None and short.percentiles == sketched.percentiles
    # what reaches the driver: ranks near the levels' positions, not the group
    kept = ranked_values(frame, by_id=False)
    assert len(kept[("distribution", "run", "large", None, "true")]) <= 3 * len(SKETCH_LEVELS)
    assert len(kept[("distribution", "run", "large", None, "false")]) <= 12
    assert len(kept[("distribution", "run", "latencies", None, "false")]) <= 12
    assert len(kept[("distribution", "run", "negative", None, "true")]) == 257  # all
    empty = by_rank[("distribution", "run", "empty", None, "true")]
    assert empty.count == 0 and set(empty.percentiles.values()) == {None}
    # groups whose ids collide are sorted by their names instead
    from pyspark.sql import functions as F

    import mqttbed.analytics.passes as passes
    monkeypatch.setattr(passes, "group_id", lambda: F.lit(7).cast("long"))
    assert aggregate_figures([frame], ranked=True) == gathered


def test_a_literal_table_reaches_the_plan_with_every_character_and_number_intact(spark):
    from pyspark.sql import functions as F

    from mqttbed.analytics.passes import Struct, literal_map, lookup, sql_literal

    tricky = ["it's", "back\\slash", "\\'", "100%_", "line\nbreak", "tab\t", "\\u0041",
              "ünï€ode", "", "'; DROP TABLE x; --"]
    numbers = [0.1, -0.0, 1e-300, 2.0 ** 60, 1 / 3, float("inf"), float("-inf")]
    value = {"strings": tricky, "ints": [0, -1, 2 ** 62], "floats": numbers,
             "flags": [True, False, None], "struct": [Struct(level="run", key="r'1")]}
    (row,) = spark.range(1).select(*[F.expr(sql_literal(v)).alias(k)
                                     for k, v in value.items()]).collect()
    assert row["strings"] == tricky
    assert row["ints"] == [0, -1, 2 ** 62]
    assert row["floats"] == numbers and str(row["floats"][1]) == "-0.0"
    assert row["flags"] == [True, False, None]
    assert row["struct"][0].asDict() == {"level": "run", "key": "r'1"}
    (nan,) = spark.range(1).select(F.expr(sql_literal(float("nan"))).alias("v")).collect()
    assert nan["v"] != nan["v"]
    # a map of maps with an empty entry: that key is absent, the others found
    table = literal_map({"a": {"x": ["1"]}, "b": {}, "c": None})
    frame = spark.createDataFrame([("a",), ("b",), ("c",), (None,)], "k string")
    found = frame.select("k", lookup(table, F.col("k"), "map<string,array<string>>")
                         .alias("v")).collect()
    assert {r["k"]: r["v"] for r in found} == {"a": {"x": ["1"]}, "b": None, "c": None,
                                               None: None}
    assert literal_map({"only": None}) is None
    with pytest.raises(TypeError, match="no SQL literal for set"):
        sql_literal({1})
