"""Names that become file and directory names: plain, or refused with what is allowed.

Campaign, run and agent ids end up in paths under the data dir
(``events/campaign_id=C/run_id=R/<agent>-<seq>.parquet``). An id with a ``/`` or ``..``
would write or read outside it, so every id that arrives from outside (a request path, an
agent's message, a command line) is checked before it is used.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from mqttbed.core.errors import MqttbedError

MAX_NAME_CHARS = 128
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class UnsafeName(MqttbedError, ValueError):
    """A name that cannot be a file name as it is; the message says what is allowed."""


def check_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is a plain file name, else raise :class:`UnsafeName`."""
    if (not isinstance(value, str) or len(value) > MAX_NAME_CHARS
            or not _PLAIN.fullmatch(value) or ".." in value):
        shown = value[:60] + "..." if isinstance(value, str) and len(value) > 60 else value
        raise UnsafeName(f"{what} {shown!r}: use letters, digits, '.', '_' and '-' only, "
                         f"starting with a letter or digit, at most {MAX_NAME_CHARS} "
                         "characters, no '/' and no '..' (it names files)")
    return value


def _checked(value: str) -> str:
    return check_name(value, "id")


# A pydantic field type for ids that name files.
PlainName = Annotated[str, AfterValidator(_checked)]
