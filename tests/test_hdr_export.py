"""The HdrHistogram logs: our encoder read by the HdrHistogram tools, and the exported logs
against the results they must agree with.

Decoding is never ours: the ``hdrhistogram`` package (HdrHistogram.py) and Java's
``HistogramLogProcessor`` (Debian's libhdrhistogram-java) read what we write.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from mqttbed.analytics.hdr_export import RunWindow, point_logs
from mqttbed.analytics.hdr_log import (
    HistogramLayout,
    HistogramLog,
    Interval,
    encode_histogram,
    zigzag_leb128,
)

HDR_JAR = Path("/usr/share/java/hdrhistogram.jar")


def _recorded(values: np.ndarray, lowest: int, highest: int, digits: int) -> HdrHistogram:
    """The histogram HdrHistogram.py itself records from ``values``."""
    histogram = HdrHistogram(lowest, highest, digits)
    for value in values.tolist():
        histogram.record_value(value)
    return histogram


def _counts(histogram: HdrHistogram) -> list[int]:
    return [histogram.get_count_at_index(i) for i in range(histogram.counts_len)]


@pytest.mark.parametrize(("digits", "lowest"), [(3, 1), (2, 1), (3, 1000), (1, 1)])
def test_encoded_histogram_decodes_to_the_counts_hdrhistogram_records(digits, lowest):
    rng = np.random.default_rng(digits * 7 + lowest)
    # latencies of tens of us to ms in ns, with the edges of the first buckets and a
    # value 12 powers of two above the rest
    values = np.concatenate([rng.lognormal(11.0, 1.2, 5000).astype(np.int64),
                             [0, 1, 2, 1023, 1024, 2047, 2048, 2049, 4096, 10**12]])
    highest = int(values.max())
    layout = HistogramLayout(digits, lowest, highest)

    decoded = HdrHistogram.decode(encode_histogram(values, layout))
    expected = _recorded(values, lowest, highest, digits)

    assert decoded.get_total_count() == values.size
    assert decoded.counts_len == expected.counts_len
    assert _counts(decoded) == _counts(expected)
    for percentile in (50.0, 90.0, 99.0, 99.9, 100.0):
        assert (decoded.get_value_at_percentile(percentile)
                == expected.get_value_at_percentile(percentile))


def test_an_empty_histogram_decodes_to_no_values():
    decoded = HdrHistogram.decode(encode_histogram(np.zeros(0, np.int64), HistogramLayout(3)))
    assert decoded.get_total_count() == 0


def test_zigzag_leb128_matches_the_format_examples():
    # ZigZag: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ...; LEB128: 7 bits a byte, low bits first
    assert zigzag_leb128(0) == b"\x00"
    assert zigzag_leb128(-1) == b"\x01"
    assert zigzag_leb128(1) == b"\x02"
    assert zigzag_leb128(63) == b"\x7e"
    assert zigzag_leb128(64) == b"\x80\x01"
    assert zigzag_leb128(-300) == bytes([0xD7, 0x04])   # zigzag 599 = 0b1001010111
    # the 64b9B variant: the largest values take 9 bytes, the last one all 8 bits
    assert zigzag_leb128(2**63 - 1) == b"\xfe" + b"\xff" * 7 + b"\xff"
    assert len(zigzag_leb128(-(2**63))) == 9


def test_bad_values_and_layouts_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="value -5"):
        encode_histogram(np.array([3, -5]), HistogramLayout(3, 1, 100))
    with pytest.raises(ValueError, match="value 101 exceeds highest_trackable=100"):
        encode_histogram(np.array([101]), HistogramLayout(3, 1, 100))
    with pytest.raises(ValueError, match="significant_digits=6"):
        HistogramLayout(6)
    with pytest.raises(ValueError, match="highest_trackable=3"):
        HistogramLayout(3, 2, 3)
    log = HistogramLog([Interval(10.0, 1.0, np.array([1])), Interval(5.0, 1.0, np.array([1]))],
                       HistogramLayout(3))
    with pytest.raises(ValueError, match="not in time order"):
        log.text()


def _windows() -> list[RunWindow]:
    return [RunWindow("r1", 0, 0, {"workload.rate_hz": 100}, 1_790_000_000.25, 2.5),
            RunWindow("r2", 1, 0, {"workload.rate_hz": 200}, 1_790_000_003.0, 2.0),
            RunWindow("r3", 0, 1, {"workload.rate_hz": 100}, 1_790_000_006.5, 3.0)]


def _values() -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(5)
    return {(run, figure): rng.integers(20_000, 900_000, size=n)
            for run, n in (("r1", 400), ("r2", 300), ("r3", 500))
            for figure in ("latency_us", "sync_spread_us")} | {
        ("r3", "latency_us"): np.array([-40, -1, 50_000, 60_000]),
        ("r3", "sync_spread_us"): np.zeros(0, np.int64)}   # a run without a spread


def test_point_logs_hold_one_interval_per_run_at_its_time(tmp_path):
    logs = {(log.point_index, log.figure): log
            for log in point_logs(_values(), _windows(), ("campaign c1",))}
    assert sorted(logs) == [(0, "latency_us"), (0, "sync_spread_us"),
                            (1, "latency_us"), (1, "sync_spread_us")]
    log = logs[(0, "latency_us")]
    assert log.file_name == "point-000-latency.hlog"
    # the negative values are counted, not recorded
    assert (log.count, log.values_below_zero, log.run_ids) == (402, 2, ("r1", "r3"))
    path = tmp_path / log.file_name
    path.write_text(log.text)
    assert "#[values below zero, left out: 2]" in log.text
    assert "#[sweep point 0: workload.rate_hz=100]" in log.text

    reader = HistogramLogReader(str(path), HdrHistogram(1, 10**12, 3))
    first = reader.get_next_interval_histogram()
    second = reader.get_next_interval_histogram()
    assert reader.get_next_interval_histogram() is None
    assert reader.get_start_time_sec() == pytest.approx(1_790_000_000.25)
    assert (first.get_total_count(), second.get_total_count()) == (400, 2)
    # start and end stamps are absolute, in ms
    assert first.get_start_time_stamp() == pytest.approx(1_790_000_000_250, abs=1)
    assert second.get_start_time_stamp() == pytest.approx(1_790_000_006_500, abs=1)
    assert second.get_end_time_stamp() == pytest.approx(1_790_000_009_500, abs=1)
    assert second.get_max_value() == pytest.approx(60_000, rel=1e-3)


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("java") or not HDR_JAR.exists(),
                    reason="needs java and Debian's libhdrhistogram-java "
                           "(scripts/system-deps.sh installs it)")
@pytest.mark.parametrize(("point", "figure", "runs"), [
    (1, "latency_us", ("r2",)),
    (0, "sync_spread_us", ("r1", "r3")),   # r3's interval is empty
])
def test_javas_histogram_log_processor_reads_our_log(tmp_path, point, figure, runs):
    logs = point_logs(_values(), _windows())
    log = next(lg for lg in logs if (lg.point_index, lg.figure) == (point, figure))
    (tmp_path / "in.hlog").write_text(log.text)
    done = subprocess.run(["java", "-cp", str(HDR_JAR), "org.HdrHistogram.HistogramLogProcessor",
                           "-i", str(tmp_path / "in.hlog"), "-o", str(tmp_path / "out"),
                           "-outputValueUnitRatio", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # one line per interval (run), each with its own count ("2.500: I:400 ( ...")
    per_interval = re.findall(r"^[\d.]+: I:(\d+) ", (tmp_path / "out").read_text(), re.M)
    assert [int(n) for n in per_interval] == [_values()[(r, figure)].size for r in runs]
    distribution = (tmp_path / "out.hgrm").read_text()
    values = np.sort(np.concatenate([_values()[(r, figure)] for r in runs]))
    # its summary: the maximum and the count, read from the accumulated histogram
    # ("#[Max     =   895999.000, Total count    =          300]")
    summary = dict(re.findall(r"([A-Z][A-Za-z ]*?)\s*=\s*([\d.]+)", distribution))
    assert int(summary["Total count"]) == values.size
    assert float(summary["Max"]) == pytest.approx(values[-1], rel=1e-3)
    # and its percentile rows: at 50 %, the value's bucket
    rows = [line.split() for line in distribution.splitlines()
            if line.strip() and line.split()[0].replace(".", "").isdigit()]
    p50 = next(float(row[0]) for row in rows if float(row[1]) >= 0.5)
    assert p50 == pytest.approx(values[(values.size - 1) // 2], rel=2e-3)


# -- the export of a finished campaign ---------------------------------------------------


def _value_at_rank(histogram: HdrHistogram, rank: int) -> tuple[int, int]:
    """The lowest and highest value the (0-based) ``rank``-th smallest recorded value
    can have: its bucket's range."""
    seen = 0
    for index in range(histogram.counts_len):
        seen += histogram.get_count_at_index(index)
        if seen > rank:
            value = histogram.get_value_from_index(index)
            return (histogram.get_lowest_equivalent_value(value),
                    histogram.get_highest_equivalent_value(value))
    raise AssertionError(f"rank {rank} past the histogram's {seen} values")


def _assert_percentile_agrees(histogram: HdrHistogram, quantile: float, stats_us: float,
                              what: str) -> None:
    """``stats_us`` (linearly interpolated at rank (n - 1) q, as Spark's percentile) lies
    between the buckets of the two ranks around (n - 1) q: HdrHistogram's precision."""
    rank = (histogram.get_total_count() - 1) * quantile
    low, _ = _value_at_rank(histogram, int(np.floor(rank)))
    _, high = _value_at_rank(histogram, int(np.ceil(rank)))
    assert low - 1e-6 <= stats_us * 1000 <= high + 1e-6, (what, quantile, low, stats_us, high)


def _read_log(text: str, tmp_path: Path, name: str) -> tuple[HdrHistogram, list[HdrHistogram]]:
    """The pooled histogram of a log and its intervals, as HdrHistogram.py reads them."""
    path = tmp_path / name.replace("/", "_")
    path.write_text(text)
    reader = HistogramLogReader(str(path), HdrHistogram(1, 10**13, 3))
    intervals = []
    while (interval := reader.get_next_interval_histogram()) is not None:
        intervals.append(interval)
    pooled = HdrHistogram(1, 10**13, 3)
    for interval in intervals:
        pooled.add(interval)
    return pooled, intervals


def _check_export(archive: zipfile.ZipFile, stats: dict, tmp_path: Path) -> dict:
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["hdrhistogram_omitted"] is None
    logs = {(entry["point_index"], entry["figure"]): entry for entry in manifest["hdrhistogram"]}
    for point in stats["points"]:
        for figure in ("latency_us", "sync_spread_us"):
            entry = logs[(point["point_index"], figure)]
            assert entry["unit"] == "ns" and entry["significant_digits"] == 3
            assert entry["values_below_zero"] == 0
            assert entry["run_ids"] == point["run_ids"] or sorted(entry["run_ids"]) == sorted(
                point["run_ids"])
            text = archive.read(entry["file"]).decode()
            pooled, intervals = _read_log(text, tmp_path, entry["file"])
            assert len(intervals) == point["runs"]
            expected = point[figure]
            assert pooled.get_total_count() == expected["count"] == entry["count"]
            if figure == "latency_us":
                # every measured delivery, once (none unexpected in these campaigns)
                assert pooled.get_total_count() == point["deliveries_received"]
            for name, quantile in (("p50", 0.5), ("p99", 0.99)):
                _assert_percentile_agrees(pooled, quantile, expected[name], figure)
            assert pooled.get_max_value() == pytest.approx(expected["max"] * 1000, rel=1e-3)
            assert (pooled.get_lowest_equivalent_value(pooled.get_max_value())
                    <= expected["max"] * 1000 + 1e-6)
    return logs


def test_exported_logs_agree_with_the_campaigns_results(served, tmp_path):
    campaign_id = served.finished["id"]
    with served.client() as http:
        stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
        response = http.get(f"/api/v1/campaigns/{campaign_id}/dataset")
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    logs = _check_export(archive, stats, tmp_path)
    assert len(logs) == 2 * len(stats["points"])   # 2 and 4 subscribers: both have spreads


REPEATED_SPEC = """
name: hdr-repetitions
workload: {publishers: 1, subscribers: 2, rate_hz: 400, messages: 120, warmup_messages: 10}
repetitions: 2
agents: {count: 2}
"""


@pytest.mark.parallel
@pytest.mark.xdist_group("served")   # the browser tests' `served`: one worker sets it up
@pytest.mark.system   # a whole campaign over REST (20 s alone, 50 s on a busy machine)
@pytest.mark.timeout(300)
def test_each_repetition_is_an_interval_and_their_sum_is_the_point(served, tmp_path):
    campaign_id = served.start_yaml_campaign(REPEATED_SPEC)
    served.wait_for_status(campaign_id, ("done",), 240)
    with served.client() as http:
        stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
        response = http.get(f"/api/v1/campaigns/{campaign_id}/dataset")
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    _check_export(archive, stats, tmp_path)
    [point] = stats["points"]
    runs = {run["run_id"]: run for run in stats["runs"]}
    text = archive.read("hdrhistogram/point-000-latency.hlog").decode()
    _, intervals = _read_log(text, tmp_path, "repeated")
    # in run order, each with that run's own count and maximum
    assert [i.get_total_count() for i in intervals] == [
        runs[r]["latency_us"]["count"] for r in point["run_ids"]]
    for interval, run_id in zip(intervals, point["run_ids"], strict=True):
        assert interval.get_max_value() == pytest.approx(
            runs[run_id]["latency_us"]["max"] * 1000, rel=1e-3)
        assert f"#[run {run_id}, repetition {runs[run_id]['repetition']}:" in text


def test_a_campaign_without_results_exports_no_logs_and_says_why(controller):
    from mqttbed.api.export import build_dataset_zip
    from mqttbed.campaigns.spec import parse_spec

    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "unrun", "workload": {"subscribers": 2, "messages": 30}}))
    path = build_dataset_zip(controller, campaign_id)
    try:
        archive = zipfile.ZipFile(path)
        manifest = json.loads(archive.read("manifest.json"))
        assert not [n for n in archive.namelist() if n.startswith("hdrhistogram/")]
    finally:
        path.unlink()
    assert manifest["hdrhistogram"] == []
    assert "no results (stats.json) yet" in manifest["hdrhistogram_omitted"]
