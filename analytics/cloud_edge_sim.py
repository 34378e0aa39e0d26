"""The cloud-edge paper's discrete-time policy simulation (seed 003, Figs. 8 and 9).

Tseng et al. compare, for 1 MB messages on a congested downstream link, the mean
end-to-end latency (sojourn in the broker plus one-way network latency) of: no withholding
(baseline), the conservative, probabilistic (good and bad λ) and historic policies
(:mod:`mqttbed.core.withholding`, the same code the adaptive broker decides with), and a
clairvoyant bound. Figure 8 sweeps ``threshold_l`` at ``TQ`` = 1 s; Figure 9 sweeps the RTT
query period ``TQ``.

The model, as the paper's section "Analytical performance of all policies" states it:

- Time runs in units of 1 s. A 10 KB RTT query's RTT is drawn per unit, uniform in
  [0.15, 0.45] s; during a latency burst an extra RTT is added.
- A large message arrives every 5 units; 5,000 units are simulated.
- A 1 MB message's one-way latency is ten times the query's one-way latency:
  ``10 × RTT/2``. The policies scale ``L_now`` and ``threshold_l`` by the same factor (the
  paper's note under Eq. 6).
- The starvation timer ``D`` is 20 s; λ is 0.057 (good: 1/17.5 s, the mean burst) or 0.016
  (bad: a supposed 60 s burst).

Readings of what the text leaves open (checked against the authors' published simulator,
github.com/wangc86/Adaptive-MQTT-Transmit-Policy, ``simulation/``; where the two differ the
paper's text wins and the difference is said here):

- Time step: "the time unit was assumed to be 1 s" is the simulation's step. The link
  holds one RTT per unit, messages arrive, are decided on and leave at whole units, and
  ``TQ`` and ``D`` count in units.
- Burst start: "10 % probability to have an additional latency burst" is read per time
  unit while the link is not congested; bursts never overlap. Congestion therefore covers
  about two thirds of the time (mean gap 9 units, mean burst 17.5 units).
- Burst size: one draw from Exp(λ = 0.3 /s) (mean 3.3 s of extra RTT) holds for the whole
  burst, whose length is uniform over the integers 10 … 25 units (mean 17.5 s, the paper's
  "average congestion duration"; the authors' script truncates to 10 … 24).
- RTT knowledge: queries complete at multiples of ``TQ`` and report the RTT of the unit
  just before; a message sent at unit ``s`` meets that unit's RTT.
- Decisions happen on arrival, at each query completion, and when the sojourn first
  exceeds ``D`` (unit ``D + 1``), so the timer fires on its own with a long ``TQ``.
- Transmission: 0.08 s is added to every 1 MB delivery (1 MB at 100 Mbit/s, from the
  authors' script; the text is silent). It shifts every policy alike.
- Clairvoyant: the best integer wait ``j ≥ 0`` knowing the whole trace,
  ``min_j j + latency(t + j)``: the "exhaustive search along the progress of time".
- Confidence intervals are 1.96 · std / √n over the messages, as the paper's error bars.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from mqttbed.analytics.cloud_edge_results import (
    CloudEdgeSimulation,
    SweepPoint,
    check_paper_claims,
)
from mqttbed.core.withholding import Withholding, WithholdingPolicy

if TYPE_CHECKING:
    import numpy as np

Z_95 = 1.96
WITHHOLDING_POLICIES = ("conservative", "probabilistic_good", "probabilistic_bad", "historic")
POLICIES = ("baseline", *WITHHOLDING_POLICIES, "clairvoyant")


@dataclass(frozen=True)
class LinkModel:
    """The downstream link: the query's RTT per time unit and a large message's latency."""

    rtt_min_s: float = 0.15
    rtt_max_s: float = 0.45
    burst_start_probability: float = 0.10  # per uncongested unit
    burst_min_units: int = 10
    burst_max_units: int = 25  # inclusive
    burst_rate_per_s: float = 0.3  # λ of the exponential extra RTT of a burst
    large_latency_scale: float = 10.0  # 1 MB message over 10 KB query
    large_transmission_s: float = 0.08  # 1 MB at 100 Mbit/s (the authors' script)

    def __post_init__(self) -> None:
        if not 0 < self.rtt_min_s <= self.rtt_max_s:
            raise ValueError(f"rtt_min_s={self.rtt_min_s}, rtt_max_s={self.rtt_max_s}: "
                             "need 0 < rtt_min_s <= rtt_max_s")
        if not 0 <= self.burst_start_probability <= 1:
            raise ValueError(f"burst_start_probability={self.burst_start_probability}: "
                             "must be within [0, 1]")
        if not 0 < self.burst_min_units <= self.burst_max_units:
            raise ValueError(f"burst_min_units={self.burst_min_units}, burst_max_units="
                             f"{self.burst_max_units}: need 0 < min <= max")
        if self.burst_rate_per_s <= 0 or self.large_latency_scale <= 0:
            raise ValueError("burst_rate_per_s and large_latency_scale must be positive")

    def rtt_trace(self, length: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The query RTT of each of ``length`` units (s), bursts included, and which units
        are in a burst."""
        import numpy as np

        rtt = rng.uniform(self.rtt_min_s, self.rtt_max_s, size=length)
        coins = rng.random(size=length)
        congested = np.zeros(length, dtype=bool)
        unit = 0
        while unit < length:
            if coins[unit] < self.burst_start_probability:
                extra_s = rng.exponential(1 / self.burst_rate_per_s)
                duration = int(rng.integers(self.burst_min_units, self.burst_max_units + 1))
                rtt[unit:unit + duration] += extra_s
                congested[unit:unit + duration] = True
                unit += duration
            else:
                unit += 1
        return rtt, congested

    def large_latency_s(self, rtt_s: np.ndarray) -> np.ndarray:
        """One-way latency of a large message sent in each unit: scaled ``RTT/2`` plus its
        transmission time."""
        return self.large_latency_scale * rtt_s / 2 + self.large_transmission_s


@dataclass(frozen=True)
class CloudEdgeScenario:
    """Every parameter of the simulation, the paper's values by default."""

    units: int = 5000
    message_period_units: int = 5  # a large message every 5 units
    link: LinkModel = field(default_factory=LinkModel)
    starvation_s: float = 20.0  # D
    query_period_units: int = 1  # TQ of Fig. 8 (1 unit = 1 s)
    threshold_l_s: float = 0.5  # where the per-policy figures (Fig. 8 bars) are taken
    thresholds_l_s: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7)  # Fig. 8/9 x axis
    query_periods_units: tuple[int, ...] = (1, 2, 3, 4, 5)  # Fig. 9 curves
    tq_sweep_policies: tuple[str, ...] = ("conservative", "historic")
    congestion_rate_good_per_s: float = 0.057  # 1/17.5 s
    congestion_rate_bad_per_s: float = 0.016  # 1/60 s
    tail_units: int = 1000  # trace past ``units`` for messages still withheld at the end

    def __post_init__(self) -> None:
        for name in ("units", "message_period_units", "query_period_units", "tail_units"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if self.units <= self.message_period_units:
            raise ValueError(f"units={self.units}: must exceed message_period_units="
                             f"{self.message_period_units}, or no large message arrives")
        if any(not isinstance(q, int) or q <= 0 for q in self.query_periods_units):
            raise ValueError(f"query_periods_units={self.query_periods_units!r}: must be "
                             "positive integers (units of 1 s)")
        unknown = set(self.tq_sweep_policies) - set(WITHHOLDING_POLICIES)
        if unknown:
            raise ValueError(f"tq_sweep_policies: unknown {sorted(unknown)}; known: "
                             f"{WITHHOLDING_POLICIES}")

    def withholding(self, policy: str, threshold_l_s: float,
                    query_period_units: int) -> Withholding:
        """The broker-side policy object for one of :data:`WITHHOLDING_POLICIES`."""
        rates = {"probabilistic_good": self.congestion_rate_good_per_s,
                 "probabilistic_bad": self.congestion_rate_bad_per_s}
        kind = WithholdingPolicy(policy.removesuffix("_good").removesuffix("_bad"))
        rate = {"congestion_rate_per_s": rates[policy]} if policy in rates else {}
        return Withholding(policy=kind, threshold_l_s=threshold_l_s,
                           query_period_s=float(query_period_units),
                           starvation_s=self.starvation_s,
                           latency_scale=self.link.large_latency_scale, **rate)


class Trace:
    """One RTT trace (``units`` plus a tail) and the large-message latency of every unit."""

    def __init__(self, scenario: CloudEdgeScenario, rtt_s: np.ndarray,
                 congested: np.ndarray | None = None):
        import numpy as np

        if len(rtt_s) < scenario.units:
            raise ValueError(f"an RTT trace of {len(rtt_s)} units is shorter than "
                             f"units={scenario.units}")
        self.scenario = scenario
        self.rtt_s = np.asarray(rtt_s, dtype=float)
        self.congested = (np.asarray(congested, dtype=bool) if congested is not None
                          else self.rtt_s > scenario.link.rtt_max_s)
        self.large_s = scenario.link.large_latency_s(self.rtt_s)
        self.arrivals = range(scenario.message_period_units, scenario.units,
                              scenario.message_period_units)
        self._rtt = self.rtt_s.tolist()  # list indexing is ~10x numpy scalar indexing
        self._large = self.large_s.tolist()

    @classmethod
    def generate(cls, scenario: CloudEdgeScenario, seed: int) -> Trace:
        """The paper's random trace from ``numpy.random.default_rng(seed)``."""
        import numpy as np

        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r}: must be a non-negative integer")
        rtt_s, congested = scenario.link.rtt_trace(scenario.units + scenario.tail_units,
                                                   np.random.default_rng(seed))
        return cls(scenario, rtt_s, congested)

    def _at(self, values: list[float], unit: int) -> float:
        if unit >= len(values):
            raise RuntimeError(f"a message was withheld past the trace's {len(values)} units; "
                               "raise tail_units")
        return values[unit]

    def latest_rtt_s(self, unit: int, query_period_units: int) -> float | None:
        """The RTT the broker knows at ``unit``: the last query's, None before the first."""
        completed = unit - unit % query_period_units
        return self._at(self._rtt, completed - 1) if completed > 0 else None

    def baseline_s(self) -> list[float]:
        """Every large message sent on arrival."""
        return [self._at(self._large, t) for t in self.arrivals]

    def clairvoyant_s(self) -> list[float]:
        """The best wait per message knowing the future: no wait longer than the latency
        of sending at once can win, so the search stops there."""
        import numpy as np

        best = []
        for t in self.arrivals:
            waits = np.arange(int(self.large_s[t]) + 1)
            if t + len(waits) > len(self.large_s):
                raise RuntimeError("the clairvoyant search ran past the trace; raise tail_units")
            best.append(float(np.min(waits + self.large_s[t:t + len(waits)])))
        return best

    def withheld_s(self, withholding: Withholding, query_period_units: int) -> list[float]:
        """Sojourn plus network latency of every message under ``withholding``."""
        timer = withholding.starvation_timer_s
        timeout_units = None if timer is None else math.floor(timer) + 1  # first ΔS > D
        latencies = []
        for t in self.arrivals:
            unit = t
            while not withholding.sends_now(self.latest_rtt_s(unit, query_period_units),
                                            unit - t):
                next_unit = unit - unit % query_period_units + query_period_units
                if timeout_units is not None and unit < t + timeout_units < next_unit:
                    next_unit = t + timeout_units
                unit = next_unit
            latencies.append(unit - t + self._at(self._large, unit))
        return latencies


def _point(x: float, latencies: list[float]) -> SweepPoint:
    import numpy as np

    values = np.asarray(latencies)
    ci = Z_95 * float(np.std(values, ddof=1)) / math.sqrt(len(values)) if len(values) > 1 \
        else 0.0
    return SweepPoint(x=x, mean_s=float(np.mean(values)), ci95_s=ci)


def simulate(*, seed: int = 0, scenario: CloudEdgeScenario | None = None
             ) -> CloudEdgeSimulation:
    """Run every policy on one seeded trace: Fig. 8 (per policy, and over ``threshold_l``
    at ``TQ`` = ``query_period_units``) and Fig. 9 (over ``threshold_l`` per ``TQ``)."""
    scenario = scenario or CloudEdgeScenario()
    trace = Trace.generate(scenario, seed)
    done: dict[tuple[str, int, float], SweepPoint] = {}

    def run(policy: str, query_period_units: int, threshold_l_s: float) -> SweepPoint:
        key = (policy, query_period_units, threshold_l_s)
        if key not in done:
            withholding = scenario.withholding(policy, threshold_l_s, query_period_units)
            done[key] = _point(threshold_l_s, trace.withheld_s(withholding, query_period_units))
        return done[key]

    tq, thresholds = scenario.query_period_units, scenario.thresholds_l_s
    figures = {"baseline": _point(scenario.threshold_l_s, trace.baseline_s()),
               **{p: run(p, tq, scenario.threshold_l_s) for p in WITHHOLDING_POLICIES},
               "clairvoyant": _point(scenario.threshold_l_s, trace.clairvoyant_s())}
    result = CloudEdgeSimulation(
        seed=seed, units=scenario.units, large_messages=len(trace.arrivals),
        threshold_l_s=scenario.threshold_l_s, query_period_s=tq,
        congested_fraction=float(trace.congested[:scenario.units].mean()),
        policies={p: f.mean_s for p, f in figures.items()},
        policies_ci95_s={p: f.ci95_s for p, f in figures.items()},
        historic_saving_s=figures["baseline"].mean_s - figures["historic"].mean_s,
        threshold_l_sweep={p: [run(p, tq, x) for x in thresholds]
                           for p in WITHHOLDING_POLICIES},
        tq_sweep={p: {q: [run(p, q, x) for x in thresholds]
                      for q in scenario.query_periods_units}
                  for p in scenario.tq_sweep_policies},
        scenario=asdict(scenario))
    return result.model_copy(update={"claims": check_paper_claims(result)})
