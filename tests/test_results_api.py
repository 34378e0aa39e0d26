"""``mqttbed.results``: campaigns by id or ``latest~N``, statistics as the typed document
and as DataFrames, raw events as a partitioned pyarrow dataset; the "Results in Python"
how-to run as written; the generated column references held to the files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mqttbed.core.events import EVENT_COLUMNS, PARTITION_COLUMNS
from mqttbed.results import (
    EVENT_COLUMN_DOCS,
    NoCampaign,
    NoResults,
    Results,
    campaign_ref_offset,
)
from tests.results_campaigns import FIRST, RESULTS_CAMPAIGNS, Campaigns, two_campaigns

# The first test to use the campaigns makes them (runs, and an analysis each; the first
# analysis in a process starts Spark): up to a few minutes on a loaded 2-core machine.
# with tests/test_cli_commands.py on one worker: the two campaigns are made once a process
pytestmark = [pytest.mark.timeout(480), pytest.mark.xdist_group(RESULTS_CAMPAIGNS)]

ROOT = Path(__file__).resolve().parents[1]
HOW_TO = ROOT / "docs" / "how-to" / "results-in-python.md"


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory) -> Campaigns:
    return two_campaigns(tmp_path_factory)


@pytest.fixture
def results(campaigns):
    with Results(campaigns.data_dir) as opened:
        yield opened


# --- without a campaign ------------------------------------------------------------------

def test_every_event_column_is_described_and_nothing_else():
    assert set(EVENT_COLUMN_DOCS) == {*EVENT_COLUMNS, *PARTITION_COLUMNS}
    assert all(text.strip() for text in EVENT_COLUMN_DOCS.values())


def test_latest_forms_are_offsets_and_anything_else_is_an_id():
    assert campaign_ref_offset("latest") == 0
    assert campaign_ref_offset("latest~0") == 0
    assert campaign_ref_offset("latest~12") == 12
    for other in ("c0123456789ab", "latest~", "latest~-1", "latest~x", "Latest", "latest~1~2"):
        assert campaign_ref_offset(other) is None, other


def test_a_data_dir_without_a_database_is_named_and_left_uncreated(tmp_path):
    missing = tmp_path / "nowhere"
    with Results(missing) as results, pytest.raises(NoCampaign) as caught:
        results.campaigns()
    assert f"no mqttbed data dir at {missing}" in str(caught.value)
    assert "MQTTBED_DATA_DIR" in str(caught.value)
    assert not missing.exists()


@pytest.mark.integration  # Mosquitto's backend declaration, a controller's database
def test_a_campaign_without_results_says_so_and_how_to_get_them(tmp_path):
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    controller = create_controller(Settings(data_dir=tmp_path), controller_url="")
    try:
        campaign_id = controller.engine.create_campaign(parse_spec(FIRST))
    finally:
        controller.close()
    with Results(tmp_path) as results:
        assert results.campaign_id() == campaign_id
        with pytest.raises(NoResults) as caught:
            results.points("latest")
    message = str(caught.value)
    assert f"campaign {campaign_id} (results-first, created) has no results" in message
    assert f"mqttbed analyze {campaign_id}" in message


# --- on two real campaigns ---------------------------------------------------------------

@pytest.mark.integration
def test_campaigns_are_listed_newest_first_with_their_runs(results, campaigns):
    listed = results.campaigns()
    assert [c.id for c in listed] == [campaigns.second, campaigns.first]
    assert [c.name for c in listed] == ["results-second", "results-first"]
    assert [(c.status, c.runs_total, c.runs_done, c.runs_failed) for c in listed] == [
        ("done", 1, 1, 0), ("done", 4, 4, 0)]


@pytest.mark.integration
def test_latest_and_latest_n_name_campaigns_by_age_and_too_far_back_is_named(results,
                                                                            campaigns):
    assert results.campaign_id() == results.campaign_id("latest") == campaigns.second
    assert results.campaign_id("latest~1") == campaigns.first
    assert results.campaign_id(campaigns.first) == campaigns.first
    with pytest.raises(NoCampaign, match=r"campaign 'latest~2': data dir .* holds 2 campaigns "
                                         r"\(latest \.\.\. latest~1\)"):
        results.campaign_id("latest~2")
    with pytest.raises(NoCampaign, match="no campaign 'c000000000000' in data dir"):
        results.campaign_id("c000000000000")


@pytest.mark.integration
def test_stats_points_and_runs_hold_the_same_figures(results, campaigns):
    stats = results.stats("latest~1")
    assert stats.campaign.id == campaigns.first and len(stats.points) == 2
    points = results.points("latest~1")
    # the swept parameter is a column of its own, in front
    assert list(points.columns[:2]) == ["workload.subscribers", "level"]
    assert points["workload.subscribers"].tolist() == [1, 2]
    assert points["latency_us_p50"].tolist() == [p.latency_us.p50 for p in stats.points]
    assert points["deliveries_received"].tolist() == [p.deliveries_received
                                                      for p in stats.points]
    assert "run_id" not in points.columns   # a run's columns are not a point's

    runs = results.runs("latest~1")
    assert sorted(runs["run_id"]) == sorted(r.run_id for r in stats.runs)
    assert set(runs["state"]) == {"done"}
    assert runs.groupby("point_index").size().tolist() == [2, 2]
    assert len(results.runs()) == 1   # latest: the second campaign's one run
    assert results.points(streams=True).empty   # no message mix


@pytest.mark.integration
def test_events_are_a_partitioned_dataset_matching_the_figures(results, campaigns):
    import pyarrow.dataset as ds

    events = results.events("latest~1")
    assert events.schema.names == [*EVENT_COLUMNS, *PARTITION_COLUMNS]
    table = events.to_table(filter=(ds.field("kind") == "delivery") & ~ds.field("warmup"),
                            columns=["run_id", "campaign_id"])
    assert set(table["campaign_id"].to_pylist()) == {campaigns.first}
    per_run = table.group_by("run_id").aggregate([("run_id", "count")]).to_pylist()
    counted = {row["run_id"]: row["run_id_count"] for row in per_run}
    runs = results.runs("latest~1")
    assert counted == dict(zip(runs["run_id"], runs["deliveries_received"], strict=True))

    everything = results.events(None)
    assert everything.count_rows() == (events.count_rows()
                                       + results.events("latest").count_rows())
    samples = results.broker_samples("latest~1").to_table()
    assert samples.num_rows > 0 and "cpu_percent" in samples.column_names


@pytest.mark.integration
def test_the_stats_column_reference_lists_the_files_columns_in_order(results):
    import pyarrow.parquet as pq

    from mqttbed.analytics.results_files import stats_columns
    from mqttbed.controller.analysis import results_type

    written = pq.read_schema(results.layout.campaign_dir(results.campaign_id()) /
                             "stats.parquet")
    columns = stats_columns(results_type())
    assert [c.name for c in columns] == written.names
    kinds = {"string": "string", "int": "int64", "float": "double", "bool": "bool"}
    assert [kinds[c.kind] for c in columns] == [str(t) for t in written.types]


@pytest.mark.integration
def test_the_results_in_python_how_to_runs_as_written(campaigns, tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", HOW_TO.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 5, "the how-to's Python blocks were not found"
    (tmp_path / "data").symlink_to(campaigns.data_dir)   # the page reads ./data
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQTTBED_")}
    done = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"{campaigns.second} results-second done" in out
    assert f"{campaigns.first} results-first done" in out
    assert "deliveries in" in out and "events in" in out
    assert f"('{campaigns.second}-r0000', 'delivery'," in out   # DuckDB's rows
