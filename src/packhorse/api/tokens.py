"""Bearer tokens of the HTTP API: create (shown once), list, revoke, authenticate.

A token is ``ph_`` + 43 URL-safe characters (256 random bits, :func:`secrets.token_urlsafe`).
Only its sha256 is stored: with that much entropy a fast hash is enough, and a database leak
reveals no usable token. Roles: ``observer`` (sees what is stuck) and ``admin`` (sees why and
acts); an admin token may do everything an observer token may.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packhorse.db.models import ApiToken, utcnow
from packhorse.db.session import Database
from packhorse.errors import TokenError

#: From least to most: ``kiosk`` reads only the problem summary (``/api/kiosk``, a wallboard's),
#: ``observer`` everything read-only (and what a kiosk reads), ``admin`` everything.
ROLES = ("kiosk", "observer", "admin")
TOKEN_PREFIX = "ph_"
#: ``last_used_at`` is written at most this often per token (seconds): no write per request.
LAST_USED_RESOLUTION_SECONDS = 60.0


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's ``name`` and ``role`` (one of :data:`ROLES`)."""

    name: str
    role: str

    @property
    def actor(self) -> str:
        """The audit-log actor: ``token:<name>``."""
        return f"token:{self.name}"

    def may(self, role: str) -> bool:
        """Whether this principal has ``role``: each role of :data:`ROLES` includes the ones
        before it (admin ⊃ observer ⊃ kiosk)."""
        return role in ROLES and self.role in ROLES and ROLES.index(role) <= ROLES.index(self.role)


def hash_token(token: str) -> str:
    """sha256 hex digest of ``token`` (what is stored)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(db: Database, *, name: str, role: str, created_by: str) -> str:
    """Create a token and return it (the only time it is visible).

    Raises:
        TokenError: ``role`` is not one of :data:`ROLES`, ``name`` is empty or already used.
    """
    if role not in ROLES:
        raise TokenError(f"--role: unknown role {role!r}; one of {', '.join(ROLES)}")
    if not name or len(name) > 100:
        raise TokenError("--name: give a name of 1 to 100 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)

    def tx(s: Session) -> None:
        s.add(ApiToken(name=name, role=role, token_hash=hash_token(token), created_at=utcnow(),
                       created_by=created_by))
        s.flush()

    try:
        db.transact(tx)
    except IntegrityError:
        raise TokenError(f"--name: a token called {name!r} already exists (revoke it or pick another name)") from None
    return token


def list_tokens(session: Session) -> list[dict[str, Any]]:
    """Every token without its secret: ``[{"id", "name", "role", "created_at", "created_by",
    "last_used_at", "revoked_at"}]`` (times ISO UTC or ``None``)."""
    def iso(t: dt.datetime | None) -> str | None:
        return t.isoformat() if t else None

    return [{"id": t.id, "name": t.name, "role": t.role, "created_at": iso(t.created_at), "created_by": t.created_by,
             "last_used_at": iso(t.last_used_at), "revoked_at": iso(t.revoked_at)}
            for t in session.scalars(select(ApiToken).order_by(ApiToken.id))]


def revoke_token(db: Database, name: str) -> None:
    """Revoke the token called ``name`` (it is refused from then on).

    Raises:
        TokenError: no live token has that name.
    """
    def tx(s: Session) -> int:
        return s.execute(update(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                         .values(revoked_at=utcnow())).rowcount

    if db.transact(tx) != 1:
        raise TokenError(f"no live token called {name!r}")


def authenticate(db: Database, token: str) -> Principal | None:
    """The principal of a live ``token``, or ``None`` (unknown or revoked)."""
    digest = hash_token(token)
    row = db.read(lambda s: s.execute(select(ApiToken.id, ApiToken.name, ApiToken.role, ApiToken.last_used_at)
                                      .where(ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None))).first())
    if row is None:
        return None
    now = utcnow()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > LAST_USED_RESOLUTION_SECONDS:
        db.transact(lambda s: s.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now)))
    return Principal(row.name, row.role)
