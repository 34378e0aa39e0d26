"""MQTT topic filters as regular expressions, so Spark can match them with ``rlike``.

A campaign has a handful of distinct filters; each becomes one anchored regex on the
driver, and the join condition ORs them. The regexes use only syntax that Java (Spark)
and Python read the same way.
"""

from __future__ import annotations

import re

SINGLE_LEVEL = "+"
MULTI_LEVEL = "#"


def is_wildcard(topic_filter: str) -> bool:
    """Return True if ``topic_filter`` has a ``+`` or ``#`` level."""
    return any(level in (SINGLE_LEVEL, MULTI_LEVEL) for level in topic_filter.split("/"))


def topic_filter_regex(topic_filter: str) -> str:
    """Return an anchored regex matching exactly the topic names ``topic_filter`` matches.

    ``+`` matches one level (possibly empty), a final ``#`` matches its parent level and
    everything below it. As MQTT 3.1.1 section 4.7.2 requires, a filter starting with a
    wildcard does not match topics starting with ``$`` (such as ``$SYS/...``). A ``+`` or
    ``#`` that is not a whole level is taken literally: a broker refuses such a filter,
    so it never reaches the event data.
    """
    levels = topic_filter.split("/")
    multi_level = levels[-1] == MULTI_LEVEL
    if multi_level:
        levels = levels[:-1]
    body = "/".join("[^/]*" if level == SINGLE_LEVEL else re.escape(level) for level in levels)
    if multi_level:
        body = f"{body}(?:/.*)?" if levels else ".*"
    no_dollar = r"(?!\$)" if topic_filter[:1] in (SINGLE_LEVEL, MULTI_LEVEL) else ""
    # (?s): a "." under "#" must also cross a newline, which a topic name may contain.
    return f"(?s)^{no_dollar}{body}$"
