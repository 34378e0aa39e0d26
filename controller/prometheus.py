"""The controller's figures in the Prometheus text format: ``GET /metrics``.

One :class:`ControllerCollector` per controller, in a Prometheus collector registry of its
own (:func:`metrics_registry`), never prometheus-client's global one: a test process holds
many controllers, and a served controller's scrape must show its own figures only. The
collector reads at scrape time: the live tallies of the recent runs
(:mod:`mqttbed.controller.live`), the database's campaigns and runs, and the agent
registry. Names follow Prometheus' conventions: base units (seconds, bytes), ``_total``
for counters, ``campaign`` and ``run`` labels on every per-run series.
``docs/how-to/prometheus.md`` lists every metric with its meaning and unit.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString
from sqlalchemy import func
from sqlalchemy.orm import sessionmaker

from mqttbed.controller.agent_registry import AgentRegistry
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.live import NS_PER_S, FixedHistogram, LiveFigures, RunFigures
from mqttbed.controller.states import CampaignStatus, RunState

RUN_LABELS = ("campaign", "run")
AGENT_STATES = ("idle", "busy", "lost", "gone")


def metrics_registry(sessions: sessionmaker, live: LiveFigures,
                     agents: AgentRegistry) -> CollectorRegistry:
    """A Prometheus collector registry of its own holding one controller's collector (no
    process metrics: a controller shares its process with others in the tests)."""
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(ControllerCollector(sessions, live, agents))
    return metrics


class ControllerCollector(Collector):
    """Reads one controller's figures at each scrape."""

    def __init__(self, sessions: sessionmaker, live: LiveFigures, agents: AgentRegistry):
        self._sessions = sessions
        self._live = live
        self._agents = agents

    def collect(self) -> Iterable[Metric]:
        yield from self._run_metrics(self._live.runs())
        yield from self._controller_metrics()

    # -- the recent runs -------------------------------------------------------------------

    def _run_metrics(self, runs: list[RunFigures]) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "mqttbed_run_state", "1 for the run's current state (queued ... done, failed, "
            "interrupted); the runs kept are the controller's most recent",
            labels=[*RUN_LABELS, "state"])
        chunks = CounterMetricFamily(
            "mqttbed_run_chunks", "event chunks stored for the run", labels=RUN_LABELS)
        sent = CounterMetricFamily(
            "mqttbed_run_messages_sent", "publishes recorded so far, warm-up excluded",
            labels=RUN_LABELS)
        deliveries = CounterMetricFamily(
            "mqttbed_run_deliveries", "delivery rows received so far, warm-up excluded, "
            "every copy counted", labels=RUN_LABELS)
        expected = CounterMetricFamily(
            "mqttbed_run_deliveries_expected", "publishes so far times the receivers "
            "subscribed to their topic", labels=RUN_LABELS)
        lost = GaugeMetricFamily(
            "mqttbed_run_lost_deliveries", "deliveries expected minus received so far "
            "(never below 0; in flight and not yet uploaded count until they arrive)",
            labels=RUN_LABELS)
        latency = HistogramMetricFamily(
            "mqttbed_run_latency_seconds", "t_recv - t_pub of each delivery row as "
            "uploaded (no clock offsets; every copy)", labels=RUN_LABELS)
        send_lag = HistogramMetricFamily(
            "mqttbed_run_send_lag_seconds", "t_pub - t_intended of each open-loop publish "
            "(the generator's lateness)", labels=RUN_LABELS)
        send_lag_max = GaugeMetricFamily(
            "mqttbed_run_send_lag_max_seconds", "the largest send lag so far",
            labels=RUN_LABELS)
        cpu = GaugeMetricFamily(
            "mqttbed_run_broker_cpu_ratio", "the broker process tree's CPU use in its latest "
            "sample, in cores (1 = one core busy)", labels=RUN_LABELS)
        rss = GaugeMetricFamily(
            "mqttbed_run_broker_resident_memory_bytes", "the broker process tree's resident "
            "memory in its latest sample", labels=RUN_LABELS)
        received = CounterMetricFamily(
            "mqttbed_run_broker_network_receive_bytes", "bytes the broker received since "
            "deploy, at its latest sample", labels=RUN_LABELS)
        transmitted = CounterMetricFamily(
            "mqttbed_run_broker_network_transmit_bytes", "bytes the broker sent since "
            "deploy, at its latest sample", labels=RUN_LABELS)
        for run in runs:
            labels = [run.campaign_id, run.run_id]
            state.add_metric([*labels, str(run.state)], 1)
            chunks.add_metric(labels, run.chunks)
            sent.add_metric(labels, run.messages_sent)
            deliveries.add_metric(labels, run.deliveries)
            expected.add_metric(labels, run.deliveries_expected)
            lost.add_metric(labels, run.lost)
            latency.add_metric(labels, *_buckets(run.latency))
            send_lag.add_metric(labels, *_buckets(run.send_lag))
            if run.send_lag.max_ns is not None:
                send_lag_max.add_metric(labels, run.send_lag.max_ns / NS_PER_S)
            if (sample := run.broker) is not None:
                cpu.add_metric(labels, sample.cpu_percent / 100)
                rss.add_metric(labels, sample.rss_bytes)
                received.add_metric(labels, sample.bytes_recv)
                transmitted.add_metric(labels, sample.bytes_sent)
        yield from (state, chunks, sent, deliveries, expected, lost, latency, send_lag,
                    send_lag_max, cpu, rss, received, transmitted)

    # -- the controller --------------------------------------------------------------------

    def _controller_metrics(self) -> Iterable[Metric]:
        with self._sessions() as s:
            statuses = dict(s.query(CampaignRow.status, func.count()).group_by(
                CampaignRow.status).all())
            states = dict(s.query(RunRow.state, func.count()).group_by(RunRow.state).all())
        queued = GaugeMetricFamily(
            "mqttbed_campaigns_queued", "campaigns waiting for the campaign worker",
            value=statuses.get(CampaignStatus.QUEUED, 0))
        campaigns = GaugeMetricFamily(
            "mqttbed_campaigns", "campaigns in the database by status", labels=["status"])
        for status in CampaignStatus:
            campaigns.add_metric([str(status)], statuses.get(status, 0))
        runs = GaugeMetricFamily(
            "mqttbed_runs", "runs (each attempt of one) in the database by state",
            labels=["state"])
        for run_state in RunState:
            runs.add_metric([str(run_state)], states.get(run_state, 0))
        agents = GaugeMetricFamily(
            "mqttbed_agents", "agents registered with this controller by state",
            labels=["state"])
        by_state = [record.state for record in self._agents.agents()]
        for agent_state in sorted(set(AGENT_STATES) | set(by_state)):
            agents.add_metric([agent_state], by_state.count(agent_state))
        analysis = HistogramMetricFamily(
            "mqttbed_analysis_duration_seconds", "how long each campaign's analysis took "
            "(analysing until its results, or its failure), since the controller started")
        analysis.add_metric([], *_buckets(self._live.analysis_times()))
        yield from (queued, campaigns, runs, agents, analysis)


def _buckets(histogram: FixedHistogram) -> tuple[list[tuple[str, float]], float]:
    """A histogram's cumulative buckets (``le`` as Prometheus spells it) and its sum, in
    seconds."""
    return ([(floatToGoString(bound), count) for bound, count in histogram.cumulative()],
            histogram.sum_ns / NS_PER_S)
