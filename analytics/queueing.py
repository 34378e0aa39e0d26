"""The PAMS paper's queueing model of publisher-to-subscriber latency (seed 004, IV-A).

Publisher, switch and broker are M/M/1 queues of service rate mu. A share omega of the
PUBLISHes is accelerated (switch -> subscriber); the rest go switch -> broker -> switch ->
subscriber. With n publishers of rate lambda each, the paper's equation (Fig. 6, 7):

    E[W] = 1/(mu - lambda) + 2(1 - omega)/(mu - lambda(1 - omega)n) + 1/(mu - lambda n)

Campaigns quote it as reference points beside measured latency (``report.reference``);
a test keeps their numbers equal to this function.
"""

from __future__ import annotations


def pams_expected_wait_s(lam: float, mu: float, omega: float, n: int) -> float:
    """E[W] in seconds; every queue must be stable (mu above its arrival rate)."""
    if not 0 <= omega <= 1 or n < 1 or mu <= lam * n:
        raise ValueError(f"unstable or invalid: lambda={lam}, mu={mu}, omega={omega}, n={n}")
    return (1 / (mu - lam) + 2 * (1 - omega) / (mu - lam * (1 - omega) * n)
            + 1 / (mu - lam * n))
