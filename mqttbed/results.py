"""Results in Python: a data dir's campaigns, their statistics, and their raw events.

    from mqttbed.results import Results

    with Results("data") as results:         # or Results(): MQTTBED_DATA_DIR, else ./data
        stats = results.stats("latest")      # the typed results document (stats.json)
        points = results.points("latest")    # one pandas row per sweep point
        events = results.events("latest")    # a pyarrow dataset: pandas, DuckDB, polars

A campaign is named by its id, by ``latest`` (the newest by creation time) or by
``latest~N`` (the N-th before it), as on the command line. What each column holds:
docs/reference/stats-columns.md and docs/reference/event-columns.md (generated from the
code). Needs the ``analytics`` extra (pyarrow, pandas) and the ``controller`` one (the
database the campaigns are listed in).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mqttbed.core.errors import MqttbedError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as ds
    from sqlalchemy.orm import sessionmaker

    from mqttbed.analytics.results import CampaignStats
    from mqttbed.controller.storage import DataLayout

__all__ = ["EVENT_COLUMN_DOCS", "LATEST", "CampaignSummary", "NoCampaign", "NoResults",
           "Results", "campaign_ref_offset", "resolve_campaign"]

LATEST = "latest"
_LATEST_FORM = re.compile(r"latest(?:~(?P<back>\d+))?")

# What each column of the events dataset holds (core.events.EVENT_FIELDS gives the names
# and types; tests/test_results_api.py checks that every column is described here once).
EVENT_COLUMN_DOCS: dict[str, str] = {
    "kind": "publish (one per PUBLISH sent), delivery (one per message a subscriber "
            "received) or subscribe (one per subscription, stamped when its SUBACK came)",
    "agent_id": "the agent that recorded the row",
    "publisher": "the publishing client's id (publish and delivery rows)",
    "seq": "the message's sequence number at its publisher; (publisher, seq) is the "
           "message's identity",
    "receiver": "the subscribing client's id (delivery and subscribe rows); null on "
                "publish rows",
    "topic": "the MQTT topic",
    "payload_bytes": "the PUBLISH payload's size",
    "qos": "the QoS of the publication or subscription (0, 1, 2)",
    "warmup": "sent during the warm-up (workload.warmup_messages): left out of the "
              "statistics",
    "t_intended_ns": "the open-loop schedule's send time on the publisher's clock (from the "
                     "payload on delivery rows); t_pub_ns - t_intended_ns is the send lag",
    "t_pub_ns": "the actual send time on the publisher's clock, ns (from the payload on "
                "delivery rows); minus the clock_offset_ns of the publisher's publish rows, "
                "it is on the controller's clock",
    "t_recv_ns": "the receive time on this row's agent's clock, ns (null on publish rows); "
                 "minus clock_offset_ns, on the controller's clock; clock_source says "
                 "which clock stamped it",
    "clock_source": "where t_recv_ns came from: scope, kernel (the socket's receive "
                    "stamp) or user (read in the receive loop)",
    "clock_offset_ns": "this row's agent's clock minus the controller's (0 on the "
                       "controller's machine); subtract it from the agent's times",
    "clock_offset_uncertainty_ns": "the offset's uncertainty (half the probe's round trip)",
    "t_recv_user_ns": "the user-space receive time, whatever clock_source says (null in "
                      "files from before it was recorded)",
    "retain": "the PUBLISH's RETAIN flag: a value set to be retained (publish rows), or "
              "retained state sent on subscribing (delivery rows); null where not recorded",
    "campaign_id": "partition column (directory campaign_id=C): the campaign",
    "run_id": "partition column (directory run_id=R): the run",
}


class NoCampaign(MqttbedError, LookupError):
    """A campaign reference that names no campaign of the data dir."""


class NoResults(MqttbedError, LookupError):
    """A campaign whose results (stats.json, stats.parquet) do not exist (yet)."""


@dataclass(frozen=True)
class CampaignSummary:
    """One campaign of a data dir, as ``mqttbed campaigns list`` shows it."""

    id: str
    name: str
    status: str
    created_at: datetime
    runs_total: int      # a retried run counts once, by its last attempt
    runs_done: int
    runs_failed: int     # failed or interrupted
    reason: str | None


def campaign_ref_offset(ref: str) -> int | None:
    """How far back from the newest campaign ``ref`` is: 0 for ``latest``, N for
    ``latest~N``; None for anything else (a campaign id)."""
    match = _LATEST_FORM.fullmatch(ref)
    if match is None:
        return None
    return int(match["back"] or 0)


def resolve_campaign(sessions: sessionmaker, ref: str, where: str) -> str:
    """The id of the campaign ``ref`` names in the database of ``sessions``: an id,
    ``latest`` or ``latest~N``; :class:`NoCampaign` naming ``ref`` and ``where`` else."""
    from mqttbed.controller.db import CampaignRow

    back = campaign_ref_offset(ref)
    with sessions() as s:
        if back is None:
            row = s.get(CampaignRow, ref)
            if row is None:
                raise NoCampaign(f"no campaign {ref!r} in {where} (mqttbed campaigns list "
                                 "shows its campaigns; 'latest' is the newest)")
            return row.id
        # created_at may tie within a clock tick: the id orders ties, every time alike
        ids = [i for (i,) in s.query(CampaignRow.id).order_by(
            CampaignRow.created_at.desc(), CampaignRow.id.desc()).limit(back + 1)]
    if len(ids) <= back:
        held = ("no campaign" if not ids else "1 campaign (latest)" if len(ids) == 1
                else f"{len(ids)} campaigns (latest ... latest~{len(ids) - 1})")
        raise NoCampaign(f"campaign {ref!r}: {where} holds {held}")
    return ids[back]


class Results:
    """The campaigns of one data dir and their results (read, never changed; opening the
    database brings its schema up to date, as every mqttbed command does).

    ``data_dir`` defaults to ``MQTTBED_DATA_DIR``, else ``./data``; the campaigns are
    listed from the controller's database (SQLite in the data dir, or
    ``MQTTBED_DATABASE_URL``). Close it (or use it in a ``with``) to release the database.
    """

    def __init__(self, data_dir: str | Path | None = None, *,
                 database_url: str | None = None) -> None:
        from mqttbed.controller.storage import DataLayout
        from mqttbed.core.settings import Settings

        self.settings = Settings.from_env(data_dir, database_url=database_url)
        self.layout: DataLayout = DataLayout(self.settings.data_dir)
        self._sessions: sessionmaker | None = None

    @property
    def data_dir(self) -> Path:
        """The data dir read."""
        return self.layout.root

    # -- the database --------------------------------------------------------------------

    def _database(self) -> sessionmaker:
        from mqttbed.controller.db import database_url, open_database

        if self._sessions is None:
            url = self.settings.database_url
            if url is None:
                sqlite = self.layout.root / "mqttbed.sqlite"
                if not sqlite.is_file():  # never create a database to find it empty
                    raise NoCampaign(f"no mqttbed data dir at {self.layout.root} (no "
                                     f"{sqlite.name}): run a campaign into it first, or "
                                     "give its path (data_dir, MQTTBED_DATA_DIR, --data-dir)")
                url = database_url(self.layout.root)
            self._sessions = open_database(url, self.settings.database_reconnect_s)
        return self._sessions

    def close(self) -> None:
        """Release the database connection (the object can open it again)."""
        if self._sessions is not None:
            self._sessions.kw["bind"].dispose()
            self._sessions = None

    def __enter__(self) -> Results:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- campaigns -----------------------------------------------------------------------

    def campaigns(self) -> list[CampaignSummary]:
        """Every campaign of the data dir, newest first."""
        from mqttbed.controller.db import CampaignRow, RunRow
        from mqttbed.controller.engine import latest_attempts
        from mqttbed.controller.states import RunState

        with self._database()() as s:
            rows = s.query(CampaignRow).order_by(CampaignRow.created_at.desc(),
                                                 CampaignRow.id.desc()).all()
            runs: dict[str, list[RunRow]] = {}
            for run in s.query(RunRow).all():
                runs.setdefault(run.campaign_id, []).append(run)
        found = []
        for row in rows:
            latest = latest_attempts(runs.get(row.id, []))
            found.append(CampaignSummary(
                id=row.id, name=row.name, status=row.status, created_at=row.created_at,
                runs_total=len(latest),
                runs_done=sum(r.state == RunState.DONE for r in latest),
                runs_failed=sum(r.state in (RunState.FAILED, RunState.INTERRUPTED)
                                for r in latest),
                reason=row.reason))
        return found

    def campaign_id(self, ref: str = LATEST) -> str:
        """The id of the campaign ``ref`` names: an id, ``latest`` or ``latest~N``."""
        return resolve_campaign(self._database(), ref, f"data dir {self.layout.root}")

    # -- statistics ----------------------------------------------------------------------

    def _results_file(self, campaign_id: str, name: str) -> Path:
        path = self.layout.campaign_dir(campaign_id) / name
        if not path.is_file():
            from mqttbed.controller.db import CampaignRow

            with self._database()() as s:
                row = s.get(CampaignRow, campaign_id)
            status = f"{row.name}, {row.status}" if row is not None else "unknown"
            raise NoResults(f"campaign {campaign_id} ({status}) has no results: {path} does "
                            "not exist (a campaign gets them when its runs end; "
                            f"`mqttbed analyze {campaign_id}` computes them again)")
        return path

    def stats(self, ref: str = LATEST) -> CampaignStats:
        """The campaign's results document (``stats.json``) as its typed model."""
        from mqttbed.analytics.results_files import STATS_JSON, read_stats
        from mqttbed.controller.analysis import results_type

        return read_stats(self._results_file(self.campaign_id(ref), STATS_JSON),
                          results_type())

    def stats_table(self, ref: str = LATEST) -> pa.Table:
        """Every row of the campaign's ``stats.parquet``: points, runs and their streams
        (column ``level``), as an Arrow table."""
        from mqttbed.analytics.results_files import STATS_PARQUET, read_stats_table

        return read_stats_table(self._results_file(self.campaign_id(ref), STATS_PARQUET))

    def points(self, ref: str = LATEST, *, streams: bool = False) -> pd.DataFrame:
        """One row per sweep point (``streams``: per stream of each point's message mix),
        with a column per swept parameter in front, named by its path."""
        from mqttbed.analytics.figures import POINT_LEVEL
        from mqttbed.analytics.results_files import STREAM_LEVEL_SUFFIX

        level = POINT_LEVEL + (STREAM_LEVEL_SUFFIX if streams else "")
        return _level_frame(self.stats_table(ref), level)

    def runs(self, ref: str = LATEST, *, streams: bool = False) -> pd.DataFrame:
        """One row per run, done or not (``state``, ``reason``), parameters in front as in
        :meth:`points`."""
        from mqttbed.analytics.figures import RUN_LEVEL
        from mqttbed.analytics.results_files import STREAM_LEVEL_SUFFIX

        level = RUN_LEVEL + (STREAM_LEVEL_SUFFIX if streams else "")
        return _level_frame(self.stats_table(ref), level)

    # -- raw data ------------------------------------------------------------------------

    def events(self, ref: str | None = LATEST) -> ds.Dataset:
        """The events of the campaign ``ref`` (None: of every campaign) as a pyarrow
        dataset, hive-partitioned by ``campaign_id`` and ``run_id`` (both columns).

        Nothing is read until asked: ``.to_table(filter=..., columns=[...])``,
        ``.to_table().to_pandas()``, ``duckdb.sql("... FROM dataset")``,
        ``polars.scan_pyarrow_dataset(dataset)``.
        """
        return self._dataset(self.layout.events, ref, _events_schema())

    def broker_samples(self, ref: str | None = LATEST) -> ds.Dataset:
        """The broker's resource samples over time (CPU %, RSS, bytes received and sent,
        cumulative), partitioned as :meth:`events`."""
        return self._dataset(self.layout.broker_samples, ref, None)

    def _dataset(self, root: Path, ref: str | None, schema: pa.Schema | None) -> ds.Dataset:
        import pyarrow as pa
        import pyarrow.dataset as ds

        from mqttbed.core.events import PARTITION_COLUMNS

        partitioning = ds.partitioning(
            pa.schema([(name, pa.string()) for name in PARTITION_COLUMNS]), flavor="hive")
        if ref is None:
            files = sorted(root.glob("campaign_id=*/run_id=*/*.parquet"))
        else:
            campaign = root / f"campaign_id={self.campaign_id(ref)}"
            files = sorted(campaign.glob("run_id=*/*.parquet"))
        # Spark's rule, kept here: "." and "_" files are temporary (a compaction's staging
        # file, a _SUCCESS marker), never data.
        files = [f for f in files if not f.name.startswith((".", "_"))]
        if schema is not None:
            schema = pa.schema([*schema, *partitioning.schema])
        return ds.dataset([str(f) for f in files], schema=schema, format="parquet",
                          partitioning=partitioning, partition_base_dir=str(root))


def _events_schema() -> pa.Schema:
    from mqttbed.core.events import arrow_schema

    schema: pa.Schema = arrow_schema()
    return schema


def _level_frame(table: pa.Table, level: str) -> pd.DataFrame:
    """The rows of one level, with the columns of that level (the same in every campaign,
    from the results model, whatever the rows hold), the swept parameters in front."""
    import pyarrow.compute as pc

    from mqttbed.analytics.results_files import stats_columns
    from mqttbed.controller.analysis import results_type

    kept = [column.name for column in stats_columns(results_type())
            if level in column.levels and column.name in table.column_names]
    frame = table.filter(pc.field("level") == level).select(kept).to_pandas()
    if "params" in frame.columns:
        params = [json.loads(text) if text else {} for text in frame["params"]]
        names = list(dict.fromkeys(name for entry in params for name in entry))
        for position, name in enumerate(names):
            frame.insert(position, name, [_scalar(entry.get(name)) for entry in params])
    return frame


def _scalar(value: Any) -> Any:
    """A parameter's value as one cell: lists and mappings (a scenario's) as JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
