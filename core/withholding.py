"""Size-aware withholding of large messages: the cloud-edge paper's scheduling policies.

Tseng et al., "Cloud-edge MQTT messaging for latency mitigation and broker memory
footprint reduction" (PeerJ CS 2025, seed 003), section "Large message scheduling". A
broker holds a large message (payload above ``threshold_s``) for one subscriber while the
downstream link looks congested, and decides again each time a new RTT estimate arrives
and once the message has waited longer than the starvation timer ``D``. The paper's
notation, kept in the names here:

- ``L_now = RTT_latest / 2`` (Eq. 1): the expected one-way latency should the message be
  sent now, from the latest RTT query.
- ``ΔS``, ``sojourn_s``: how long the message has been withheld so far.
- ``TQ``, ``query_period_s``: the period of the RTT queries (the next decision comes at
  most ``TQ`` later).
- ``threshold_l``: the RTT of the uncongested link; ``threshold_l / 2`` is its one-way
  latency.

The policies, each "send now" when its condition holds:

- conservative (Eq. 2): ``L_now < threshold_l/2  or  ΔS > D``
- probabilistic (Eq. 3): ``L_now < TQ + L_next  or  ΔS > D`` with
  ``L_next = p L_now + (1 − p) threshold_l/2`` (Eq. 4) and ``p = exp(−λ (ΔS + TQ))``
  (Eq. 5), ``λ`` the inverse of the mean congestion duration
- historic (Eq. 6): ``L_now < TQ + threshold_l/2 + ΔS`` (no timer: ``ΔS`` caps the wait)

When the RTT query is smaller than the data message, the paper scales ``L_now`` and
``threshold_l`` alike to the message's size (``latency_scale``: 10 for its 10 KB query and
1 MB message). With no RTT estimate yet every policy sends: there is nothing to withhold on.

The functions are pure (no clock, no I/O) so that the adaptive broker and the policy
simulator (:mod:`mqttbed.analytics.cloud_edge_sim`) decide with the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

PAPER_THRESHOLD_L_S = 0.5
PAPER_QUERY_PERIOD_S = 5.0
PAPER_STARVATION_S = 20.0
PAPER_CONGESTION_RATE_PER_S = 0.057  # 1/17.5 s, the simulation's mean burst ("good" case)


class WithholdingPolicy(StrEnum):
    """Which rule decides when a withheld large message goes out."""

    BASELINE = "baseline"  # no withholding: every message is sent on arrival
    CONSERVATIVE = "conservative"
    PROBABILISTIC = "probabilistic"
    HISTORIC = "historic"


def expected_latency_s(rtt_latest_s: float, latency_scale: float = 1.0) -> float:
    """``L_now`` (Eq. 1): half the latest RTT, scaled from the query's size to the message's."""
    return latency_scale * rtt_latest_s / 2


def congestion_persists_probability(sojourn_s: float, query_period_s: float,
                                    congestion_rate_per_s: float) -> float:
    """``p`` (Eq. 5): the chance the congestion still lasts at the next decision,
    ``exp(−λ (ΔS + TQ))``."""
    return math.exp(-congestion_rate_per_s * (sojourn_s + query_period_s))


def expected_next_latency_s(l_now_s: float, threshold_l_s: float,
                            persist_probability: float) -> float:
    """``L_next`` (Eq. 4): ``p L_now + (1 − p) threshold_l/2``."""
    return persist_probability * l_now_s + (1 - persist_probability) * threshold_l_s / 2


def conservative_sends(l_now_s: float, threshold_l_s: float, sojourn_s: float,
                       starvation_s: float) -> bool:
    """Eq. 2: send if ``L_now < threshold_l/2`` or the message waited past ``D``."""
    return l_now_s < threshold_l_s / 2 or sojourn_s > starvation_s


def probabilistic_sends(l_now_s: float, threshold_l_s: float, sojourn_s: float,
                        query_period_s: float, congestion_rate_per_s: float,
                        starvation_s: float) -> bool:
    """Eq. 3: send if sending now beats waiting ``TQ`` for the expected ``L_next``, or the
    message waited past ``D``."""
    p = congestion_persists_probability(sojourn_s, query_period_s, congestion_rate_per_s)
    l_next_s = expected_next_latency_s(l_now_s, threshold_l_s, p)
    return l_now_s < query_period_s + l_next_s or sojourn_s > starvation_s


def historic_sends(l_now_s: float, threshold_l_s: float, sojourn_s: float,
                   query_period_s: float) -> bool:
    """Eq. 6: send if ``L_now < TQ + threshold_l/2 + ΔS``; the growing sojourn releases it."""
    return l_now_s < query_period_s + threshold_l_s / 2 + sojourn_s


@dataclass(frozen=True)
class Withholding:
    """One subscriber's policy with its parameters (the paper's experiment by default).

    Call :meth:`sends_now` when a large message arrives, again each time a new RTT
    estimate arrives while it is withheld, and once its sojourn passes
    :attr:`starvation_timer_s` (when that is not None).
    """

    policy: WithholdingPolicy = WithholdingPolicy.CONSERVATIVE
    threshold_l_s: float = PAPER_THRESHOLD_L_S
    query_period_s: float = PAPER_QUERY_PERIOD_S
    starvation_s: float = PAPER_STARVATION_S  # D; conservative and probabilistic only
    congestion_rate_per_s: float = PAPER_CONGESTION_RATE_PER_S  # λ; probabilistic only
    latency_scale: float = 1.0  # the message's latency over the RTT query's

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", WithholdingPolicy(self.policy))
        for name in ("threshold_l_s", "query_period_s", "starvation_s",
                     "congestion_rate_per_s", "latency_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"withholding {name}={value!r}: must be a positive number")

    @property
    def starvation_timer_s(self) -> float | None:
        """``D``, after which the message goes out whatever the link; None without a timer."""
        if self.policy in (WithholdingPolicy.CONSERVATIVE, WithholdingPolicy.PROBABILISTIC):
            return self.starvation_s
        return None

    def sends_now(self, rtt_latest_s: float | None, sojourn_s: float) -> bool:
        """Whether a large message withheld for ``sojourn_s`` goes out now, given the latest
        RTT estimate of the query (None: no estimate yet, so it goes)."""
        if self.policy is WithholdingPolicy.BASELINE or rtt_latest_s is None:
            return True
        l_now_s = expected_latency_s(rtt_latest_s, self.latency_scale)
        threshold_l_s = self.threshold_l_s * self.latency_scale
        match self.policy:
            case WithholdingPolicy.CONSERVATIVE:
                return conservative_sends(l_now_s, threshold_l_s, sojourn_s, self.starvation_s)
            case WithholdingPolicy.PROBABILISTIC:
                return probabilistic_sends(l_now_s, threshold_l_s, sojourn_s,
                                           self.query_period_s, self.congestion_rate_per_s,
                                           self.starvation_s)
            case _:
                return historic_sends(l_now_s, threshold_l_s, sojourn_s, self.query_period_s)
