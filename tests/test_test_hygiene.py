"""Tests wait on conditions, never for a fixed time (issue 26).

A ``time.sleep`` in a test either polls inside a loop that waits for something with a
deadline (``tests.conftest.wait_until`` is that loop), or is a fixed window on purpose: a
check that something does *not* happen within it, a load paced, a CPU use measured over
it. Such a window says so on its line with ``# window: <why>``. Any other sleep waits for
something to have happened and guesses how long that takes: too short on a loaded machine
(a flaky test), wasted time on a quiet one. This check finds those by their syntax tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WINDOW_COMMENT = re.compile(r"#\s*window:\s*\S")

# Scopes of their own: a sleep in a function defined in a loop body is not in that loop.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _is_sleep(call: ast.Call, sleep_names: set[str]) -> bool:
    """``time.sleep(...)``, or ``sleep(...)`` where ``sleep`` was imported from time."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return (func.attr == "sleep" and isinstance(func.value, ast.Name)
                and func.value.id == "time")
    return isinstance(func, ast.Name) and func.id in sleep_names


def _sleep_aliases(tree: ast.AST) -> set[str]:
    """The names ``from time import sleep [as x]`` bound in ``tree``."""
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "time"
            for alias in node.names if alias.name == "sleep"}


def _in_loop_body(path: list[ast.AST]) -> bool:
    """Whether the innermost scope on ``path`` (root first, the call last) has the call
    in the body of a ``while`` or ``for`` (its ``else:`` does not count)."""
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:]), strict=True):
        if isinstance(parent, _SCOPES):
            return False
        if isinstance(parent, (ast.While, ast.For, ast.AsyncFor)) and child in parent.body:
            return True
    return False


def bare_sleeps(source: str, filename: str = "<snippet>") -> list[str]:
    """``file:line: text`` of each sleep in ``source`` that is neither inside a loop nor
    marked ``# window: <why>`` on one of its lines."""
    tree = ast.parse(source, filename=filename)
    lines = source.splitlines()
    sleep_names = _sleep_aliases(tree)
    found: list[str] = []

    def visit(node: ast.AST, path: list[ast.AST]) -> None:
        path = [*path, node]
        if isinstance(node, ast.Call) and _is_sleep(node, sleep_names) \
                and not _in_loop_body(path):
            end = node.end_lineno or node.lineno
            text = lines[node.lineno - 1:end]
            if not any(WINDOW_COMMENT.search(line) for line in text):
                found.append(f"{filename}:{node.lineno}: {text[0].strip()}")
        for child in ast.iter_child_nodes(node):
            visit(child, path)

    visit(tree, [])
    return found


def test_every_sleep_in_the_tests_is_a_poll_in_a_loop_or_a_marked_window():
    offenders = [hit for path in sorted(TESTS.glob("*.py"))
                 for hit in bare_sleeps(path.read_text(), path.name)]
    assert offenders == [], (
        "a sleep that waits for something to have happened: wait on it with "
        "tests.conftest.wait_until(predicate, timeout_s, what); a fixed window on purpose "
        "says why with '# window: <why>' on its line:\n" + "\n".join(offenders))


def test_a_bare_sleep_is_caught_and_a_poll_or_a_marked_window_is_not():
    # line 17 is marked, but says no why: caught too
    snippet = """\
import time
from time import sleep as nap

time.sleep(1)                          # line 4: bare
time.sleep(0.5)  # window: held for two periods
while not ready():
    time.sleep(0.01)                   # a poll
for n in range(3):
    if n:
        time.sleep(0.6)                # pacing, in the loop's body
else:
    time.sleep(1)                      # line 12: a loop's else is not its body
for n in range(3):
    def later():
        time.sleep(1)                  # line 15: its own scope, not the loop's
nap(2)                                 # line 16: imported under another name
time.sleep(0.2)  # window:
time.sleep(   # window: a call over lines, marked on one of them
    0.1)
"""
    assert [hit.split(":")[1] for hit in bare_sleeps(snippet)] == ["4", "12", "15", "16", "17"]


def test_a_sleep_in_a_test_file_on_disk_is_named_with_its_file_and_line(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import time\n\n\ndef test_x():\n    start()\n    time.sleep(1.2)\n")
    assert bare_sleeps(probe.read_text(), probe.name) == ["test_probe.py:6: time.sleep(1.2)"]
