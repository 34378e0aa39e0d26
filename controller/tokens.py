"""API tokens: created once and shown once; only their SHA-256 is stored.

A token is 32 random bytes, so a plain SHA-256 is enough to keep a stolen database from
yielding usable tokens (a slow password hash guards guessable secrets, which these are
not). A token may expire (``expires_at``) and may be revoked (``revoked_at``); either
takes effect at the next request, since every request looks its token up.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy.orm import sessionmaker

from mqttbed.controller.db import TokenRow, utcnow
from mqttbed.core.errors import MqttbedError

TOKEN_PREFIX = "mqb_"
_DURATION = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class TokenRole(StrEnum):
    USER = "user"      # defines and runs campaigns, reads results
    AGENT = "agent"    # an agent talking to the controller, nothing else


class TokenError(MqttbedError):
    """A token operation cannot be done as asked; the message says why and what to do."""


@dataclass(frozen=True)
class TokenRecord:
    """What is known of a token, never the token itself."""

    id: int
    name: str
    role: TokenRole
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def problem(self, now: datetime) -> str | None:
        """Why the token cannot be used at ``now``, or None while it can."""
        if self.revoked_at is not None:
            return f"token {self.name!r} was revoked at {self.revoked_at:%Y-%m-%d %H:%M} UTC"
        if self.expires_at is not None and self.expires_at <= now:
            return f"token {self.name!r} expired at {self.expires_at:%Y-%m-%d %H:%M} UTC"
        return None

    def state(self, now: datetime) -> str:
        """active, expired or revoked."""
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.problem(now) else "active"


def parse_duration(text: str) -> timedelta | None:
    """``90d``, ``12h``, ``30m``, ``45s`` as a timedelta; ``never`` as None."""
    if text == "never":
        return None
    match = _DURATION.match(text)
    if match is None:
        raise TokenError(f"expiry {text!r}: give a number and a unit (s, m, h, d), e.g. 90d, "
                         "or 'never'")
    return timedelta(seconds=int(match[1]) * _SECONDS[match[2]])


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


def _record(row: TokenRow) -> TokenRecord:
    # the database hands back timezone-aware UTC times on SQLite too (db.UtcDateTime)
    return TokenRecord(id=row.id, name=row.name, role=TokenRole(row.role),
                       created_at=row.created_at, expires_at=row.expires_at,
                       revoked_at=row.revoked_at)


def create_token(sessions: sessionmaker, name: str, role: TokenRole,
                 expires_in: timedelta | None = None) -> str:
    """Store a new token's hash under ``name`` and return the token (never stored)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = utcnow() + expires_in if expires_in is not None else None
    with sessions() as s:
        s.add(TokenRow(name=name, role=role, token_sha256=_digest(token),
                       expires_at=expires_at))
        s.commit()
    return token


def find_token(sessions: sessionmaker, token: str) -> TokenRecord | None:
    """The record of a stored token (usable or not), else None."""
    if not token:
        return None
    with sessions() as s:
        row = s.query(TokenRow).filter_by(token_sha256=_digest(token)).first()
        return _record(row) if row is not None else None


def list_tokens(sessions: sessionmaker) -> list[TokenRecord]:
    """Every stored token, oldest first."""
    with sessions() as s:
        return [_record(row) for row in s.query(TokenRow).order_by(TokenRow.id)]


def revoke_tokens(sessions: sessionmaker, *, token_id: int | None = None,
                  name: str | None = None) -> list[TokenRecord]:
    """Revoke the token with ``token_id``, or every unrevoked token named ``name``; return
    what was revoked. Revoking nothing is an error naming what was asked."""
    with sessions() as s:
        query = s.query(TokenRow).filter(TokenRow.revoked_at.is_(None))
        if token_id is not None:
            query = query.filter(TokenRow.id == token_id)
        elif name is not None:
            query = query.filter(TokenRow.name == name)
        else:
            raise TokenError("say which token to revoke: --id N or --name NAME")
        rows = query.all()
        if not rows:
            which = f"id {token_id}" if token_id is not None else f"name {name!r}"
            raise TokenError(f"no unrevoked token with {which}; `mqttbed token list` shows "
                             "them all")
        now = utcnow()
        for row in rows:
            row.revoked_at = now
        s.commit()
        return [_record(row) for row in rows]
