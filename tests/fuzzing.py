"""What the fuzz tests share: hypothesis settings bounded for CI, and mutation of seeds.

CI runs a fixed, derandomized set of examples (a failure is reproducible, not luck);
``make fuzz`` sets ``MQTTBED_FUZZ_RANDOM=1`` and ``MQTTBED_FUZZ_EXAMPLES`` for a longer
run that explores new ones. Anything a fuzzer finds becomes a regression test.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("MQTTBED_FUZZ_EXAMPLES", "400"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize=not os.environ.get("MQTTBED_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed damaged as a broken client or link would: bits flipped, bytes overwritten,
    cut short, noise inserted, another seed appended."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(data)))
        if kind == 0 and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == 1 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == 2:
            del data[at:]
        elif kind == 3:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            data += draw(st.sampled_from(seeds))
    return bytes(data)


def datagrams(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """Seeds as they are (sequences of valid packets reach deep into state), mutated
    seeds, and plain noise."""
    return st.one_of(st.sampled_from(seeds), mutated(seeds), st.binary(max_size=64))
