"""API tokens: created once and shown once; only their SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum

from sqlalchemy.orm import sessionmaker

from mqttbed.controller.db import TokenRow

TOKEN_PREFIX = "mqb_"


class TokenRole(StrEnum):
    USER = "user"      # defines and runs campaigns, reads results
    AGENT = "agent"    # an agent talking to the controller, nothing else


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(sessions: sessionmaker, name: str, role: TokenRole) -> str:
    """Store a new token's hash under ``name`` and return the token (never stored)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with sessions() as s:
        s.add(TokenRow(name=name, role=role, token_sha256=_digest(token)))
        s.commit()
    return token


def resolve_token(sessions: sessionmaker, token: str) -> tuple[str, TokenRole] | None:
    """Return ``(name, role)`` of a valid token, else None."""
    if not token:
        return None
    with sessions() as s:
        row = s.query(TokenRow).filter_by(token_sha256=_digest(token)).first()
        return (row.name, TokenRole(row.role)) if row is not None else None
