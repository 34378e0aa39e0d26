"""The results of the cloud-edge policy simulation as one typed document.

:mod:`mqttbed.analytics.cloud_edge_sim` fills it; the CLI (``mqttbed simulate
cloud-edge --json``), the API (``/api/v1/simulations/cloud-edge``) and the report page
read it. Latencies are mean end-to-end latencies of the large (1 MB) messages, in seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SweepPoint(_Block):
    """One point of a curve: the mean latency at ``x`` (``threshold_l`` in s)."""

    x: float
    mean_s: float
    ci95_s: float = Field(description="half width of the 95 % interval: 1.96 std / sqrt(n) "
                                      "over the messages, as the paper's error bars")


class PaperReference(_Block):
    """What the paper publishes about its simulation (reference-figures.yaml,
    ``cloud_edge_withholding``): one number and the shapes of Figs. 8 and 9."""

    source: str = "Tseng et al.: cloud-edge MQTT messaging (PeerJ CS, 2025), Figs. 8 and 9"
    historic_saving_s: float = 3.5
    units: int = 5000
    threshold_l_s: float = 0.5
    starvation_timer_s: float = 20.0
    probabilistic_lambda_good: float = 0.057
    probabilistic_lambda_bad: float = 0.016


PAPER = PaperReference()


class PaperClaim(_Block):
    """A statement of the paper about Figs. 8/9, and whether our simulation shows it."""

    key: str
    statement: str
    holds: bool
    ours: str = Field(description="the numbers of ours the verdict rests on")


class CloudEdgeSimulation(_Block):
    """Mean large-message latency per policy (Fig. 8) and over the sweeps (Figs. 8, 9)."""

    seed: int
    units: int
    large_messages: int
    threshold_l_s: float = Field(description="threshold_l of the per-policy figures")
    query_period_s: int = Field(description="TQ of the per-policy figures and Fig. 8's sweep")
    congested_fraction: float = Field(description="share of the units inside a burst")
    policies: dict[str, float] = Field(description="policy -> mean latency (s)")
    policies_ci95_s: dict[str, float]
    historic_saving_s: float = Field(description="baseline minus historic mean latency (s)")
    threshold_l_sweep: dict[str, list[SweepPoint]] = Field(
        description="Fig. 8: policy -> mean latency per threshold_l at TQ = query_period_s")
    tq_sweep: dict[str, dict[int, list[SweepPoint]]] = Field(
        description="Fig. 9: policy -> TQ (s) -> mean latency per threshold_l")
    scenario: dict[str, Any] = Field(description="every parameter of the simulation")
    paper: PaperReference = PAPER
    claims: list[PaperClaim] = []


def _means(points: list[SweepPoint]) -> list[float]:
    return [p.mean_s for p in points]


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def check_paper_claims(result: CloudEdgeSimulation) -> list[PaperClaim]:
    """The paper's statements about Figs. 8 and 9 (section "Analytical performance of all
    policies"), each checked on ``result``; a claim whose curves are missing is left out."""
    policies, sweep, tq_sweep = result.policies, result.threshold_l_sweep, result.tq_sweep
    baseline, clairvoyant = policies["baseline"], policies["clairvoyant"]
    curves = [*sweep.values(), *(c for by_tq in tq_sweep.values() for c in by_tq.values())]
    fastest = min(p.mean_s for curve in curves for p in curve)
    claims = [
        PaperClaim(key="clairvoyant_bound", holds=clairvoyant <= fastest,
                   statement="Clairvoyant withholding is the bound: no policy is faster "
                             "at any threshold_l or TQ (Fig. 8)",
                   ours=f"clairvoyant {clairvoyant:.2f} s, fastest policy point "
                        f"{fastest:.2f} s"),
        PaperClaim(key="historic_saving", holds=result.historic_saving_s > 0,
                   statement=f"The historic policy is faster than no withholding, by about "
                             f"{PAPER.historic_saving_s} s (Fig. 8)",
                   ours=f"baseline {baseline:.2f} s − historic {policies['historic']:.2f} s"
                        f" = {result.historic_saving_s:.2f} s"),
    ]
    if conservative := sweep.get("conservative"):
        means = _means(conservative)
        claims += [
            PaperClaim(key="conservative_threshold_l",
                       holds=all(a >= b for a, b in zip(means, means[1:], strict=False)),
                       statement="Conservative: the smaller threshold_l, the longer the "
                                 "latency (withholding too sensitive); a larger one is better",
                       ours=f"conservative over threshold_l: {_fmt(means)} s"),
            PaperClaim(key="conservative_beats_baseline", holds=means[-1] < baseline,
                       statement="Conservative beats no withholding at a large threshold_l",
                       ours=f"conservative at the largest threshold_l {means[-1]:.2f} s, "
                            f"baseline {baseline:.2f} s")]
    if conservative and (good := sweep.get("probabilistic_good")):
        claims.append(PaperClaim(
            key="probabilistic_beats_conservative",
            holds=all(g < c for g, c in zip(_means(good), _means(conservative), strict=True)),
            statement="Probabilistic (good λ) beats conservative (Fig. 8, red below orange)",
            ours=f"probabilistic good {_fmt(_means(good))} s; conservative "
                 f"{_fmt(_means(conservative))} s"))
    if (good := sweep.get("probabilistic_good")) and (bad := sweep.get("probabilistic_bad")):
        claims.append(PaperClaim(
            key="bad_lambda_costs",
            holds=all(g < b for g, b in zip(_means(good), _means(bad), strict=True)),
            statement="A wrong λ (0.016, a supposed 60 s burst) makes probabilistic slower "
                      "than the right one (0.057)",
            ours=f"good {_fmt(_means(good))} s; bad {_fmt(_means(bad))} s"))
    if by_tq := tq_sweep.get("conservative"):
        shortest, longest = by_tq[min(by_tq)], by_tq[max(by_tq)]
        best = min(longest, key=lambda p: p.mean_s)
        baseline_ci = result.policies_ci95_s["baseline"]
        claims += [
            PaperClaim(key="conservative_shorter_tq",
                       holds=all(a < b for a, b in zip(_means(shortest), _means(longest),
                                                        strict=True)),
                       statement="A shorter RTT query period TQ gives lower latency "
                                 "(conservative, Fig. 9)",
                       ours=f"TQ {min(by_tq)} s: {_fmt(_means(shortest))} s; TQ {max(by_tq)} "
                            f"s: {_fmt(_means(longest))} s"),
            PaperClaim(key="conservative_long_tq_no_better",
                       holds=best.mean_s + best.ci95_s >= baseline - baseline_ci,
                       statement=f"Conservative with TQ = {max(by_tq)} s is no better than no "
                                 "withholding (Fig. 9, as in the cloud experiment): its best "
                                 "95 % interval reaches the baseline's",
                       ours=f"best {best.mean_s:.2f} ± {best.ci95_s:.2f} s, baseline "
                            f"{baseline:.2f} ± {baseline_ci:.2f} s")]
    if by_tq := tq_sweep.get("historic"):
        slowest = max(p.mean_s for curve in by_tq.values() for p in curve)
        claims.append(PaperClaim(
            key="historic_every_tq", holds=slowest < baseline,
            statement="Historic beats no withholding at every TQ and threshold_l (Fig. 9)",
            ours=f"slowest historic point {slowest:.2f} s, baseline {baseline:.2f} s"))
    return claims
