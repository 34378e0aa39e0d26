"""ejabberd's external authentication program for a run: checks one user's password hash.

ejabberd (``auth_method: external``, ``extauth_program``) starts this module with the
run's user file and asks it over stdin/stdout in its extauth protocol: each request is a
2-byte big-endian length and ``op:User:Server[:Password]``; each answer is ``\\x00\\x02``
and ``\\x00\\x01`` (yes) or ``\\x00\\x00`` (no). The file holds ``name:salt:hash`` lines
(PBKDF2-HMAC-SHA256, hex), so no password is ever written in clear. Only ``auth`` and
``isuser`` can say yes; registering, changing or removing users is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sys
from pathlib import Path
from typing import BinaryIO

ITERATIONS = 100_000
SALT_BYTES = 16


def _digest(password: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, ITERATIONS)


def hash_line(username: str, password: str, salt: bytes | None = None) -> str:
    """The user file's line for ``username`` (``name:salt:hash``, no newline)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return f"{username}:{salt.hex()}:{_digest(password, salt).hex()}"


def parse_line(line: str) -> tuple[str, tuple[bytes, bytes]]:
    """A user file's line as (name, (salt, hash))."""
    name, salt, digest = line.rsplit(":", 2)
    return name, (bytes.fromhex(salt), bytes.fromhex(digest))


def read_users(path: Path) -> dict[str, tuple[bytes, bytes]]:
    """name -> (salt, hash) of a user file."""
    return dict(parse_line(line) for line in path.read_text().splitlines() if line)


def answer(request: str, users: dict[str, tuple[bytes, bytes]]) -> bool:
    """Whether ejabberd's ``request`` is granted."""
    op, _, rest = request.partition(":")
    if op == "auth":
        user, _server, password = (rest.split(":", 2) + ["", ""])[:3]
        known = users.get(user)
        return known is not None and hmac.compare_digest(_digest(password, known[0]),
                                                         known[1])
    if op == "isuser":
        return rest.split(":", 1)[0] in users
    return False


def serve(users: dict[str, tuple[bytes, bytes]], requests: BinaryIO,
          answers: BinaryIO) -> None:
    """Answer requests until ejabberd closes the pipe."""
    while len(head := requests.read(2)) == 2:
        body = requests.read(int.from_bytes(head, "big"))
        granted = answer(body.decode("utf-8", "replace"), users)
        answers.write(b"\x00\x02" + (b"\x00\x01" if granted else b"\x00\x00"))
        answers.flush()


def main(argv: list[str]) -> int:
    """``python -m mqttbed.brokers.command.ejabberd_auth USERS_FILE``."""
    if len(argv) != 1:
        print("usage: python -m mqttbed.brokers.command.ejabberd_auth USERS_FILE",
              file=sys.stderr)
        return 2
    serve(read_users(Path(argv[0])), sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
