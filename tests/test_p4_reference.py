"""pams.p4, its hand-written P4Info and the eBPF program stay one pipeline, by name."""

from __future__ import annotations

import re
from pathlib import Path

from mqttbed.brokers.p4 import tables
from mqttbed.brokers.p4.p4runtime import load_p4info

P4_DIR = Path(tables.__file__).resolve().parent
P4_SOURCE = (P4_DIR / "pams.p4").read_text()
EBPF_SOURCE = (P4_DIR / "ebpf" / "pams.bpf.c").read_text()
P4INFO = load_p4info()


def p4_block(kind: str, name: str) -> str:
    """The text of ``kind name { ... }`` in pams.p4 (up to its closing brace at indent 4)."""
    match = re.search(rf"^    {kind} {name}\b.*?^    }}", P4_SOURCE, re.S | re.M)
    assert match, f"no {kind} {name} in pams.p4"
    return match.group(0)


def p4_tables() -> set[str]:
    return set(re.findall(r"^\s*table (\w+) \{", P4_SOURCE, re.M))


def p4_counters() -> dict[str, str]:
    return dict((name, size) for size, name in
                re.findall(r"counter\((\w+), CounterType\.packets\) (\w+);", P4_SOURCE))


def p4_action_params() -> dict[str, list[tuple[str, int]]]:
    found = {}
    for name, params in re.findall(r"^\s*action (\w+)\(([^)]*)\)", P4_SOURCE, re.M):
        found[name] = [(p, int(w)) for w, p in re.findall(r"bit<(\d+)> (\w+)", params)]
    return found


def ebpf_maps() -> set[str]:
    return set(re.findall(r"\} (\w+) SEC\(\"\.maps\"\)", EBPF_SOURCE))


def counter_indices(source: str, pattern: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(pattern, source)}


def test_every_ebpf_map_is_a_p4_table_or_counter_and_in_the_p4info():
    p4info_names = {t.preamble.alias for t in P4INFO.tables} | {
        c.preamble.alias for c in P4INFO.counters}
    for name in ebpf_maps():
        assert name in p4_tables() | set(p4_counters()), name
        assert name in p4info_names, name


def test_p4info_tables_actions_and_counters_are_those_of_the_program():
    assert {t.preamble.alias for t in P4INFO.tables} == p4_tables()
    assert {c.preamble.alias: str(c.size) for c in P4INFO.counters} == {
        name: "8" if size == "CNT_COUNT" else size for name, size in p4_counters().items()}
    table_actions = {a for t in p4_tables()
                     for a in re.findall(r"(\w+);", p4_block("table", t).split("actions")[1]
                                         .split("}")[0])}
    assert {a.preamble.alias for a in P4INFO.actions} == table_actions
    params = p4_action_params()
    for action in P4INFO.actions:
        if action.preamble.alias != "NoAction":
            assert [(p.name, p.bitwidth) for p in action.params] == params[action.preamble.alias]


def test_topic_table_keys_match_in_all_three():
    p4_keys = re.findall(r"([\w.]+): exact;", p4_block("table", "topic_table"))
    info = next(t for t in P4INFO.tables if t.preamble.alias == "topic_table")
    assert [m.name for m in info.match_fields] == p4_keys
    assert [(m.bitwidth, m.match_type) for m in info.match_fields] == [(2, 2), (16, 2)]
    struct = re.search(r"struct topic_key \{(.*?)\};", EBPF_SOURCE, re.S).group(1)
    ebpf_keys = [f for f in re.findall(r"(\w+);", struct) if f != "pad"]
    assert ebpf_keys == [k.split(".")[-1] for k in p4_keys]


def test_counter_indices_and_limits_agree():
    in_p4 = counter_indices(P4_SOURCE, r"const bit<32> (CNT_\w+) = (\d+);")
    in_ebpf = counter_indices(EBPF_SOURCE, r"\t(CNT_\w+) = (\d+),")
    assert in_p4 == in_ebpf
    named = {f"CNT_{name.upper()}": index for index, name in enumerate(tables.COUNTERS)}
    assert named == {k: v for k, v in in_ebpf.items() if k != "CNT_COUNT"}
    limit = re.search(r"#define MAX_SUBSCRIBERS (\d+)", EBPF_SOURCE).group(1)
    assert int(limit) == tables.MAX_SUBSCRIBERS
