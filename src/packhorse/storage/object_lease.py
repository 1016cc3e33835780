"""Per-object leases in the ops database (seed 003 "lock single objects").

An S3 location whose store ignores ``If-None-Match: *`` (``write_once_probe = false``) cannot
publish atomically. Its publications then hold a lease on the one destination key while they
check that the key is free and write it: the lease covers one object for the seconds one
upload takes, not a whole prefix for a whole task, so it is unlikely to expire mid-write.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from packhorse.db.models import ObjectLease, utcnow
from packhorse.db.session import Database
from packhorse.errors import StorageServiceError


def db_object_lease(db: Database, location: str, *, lease_seconds: float,
                    wait_seconds: float) -> Callable[[str], AbstractContextManager[None]]:
    """Return ``lease(key)``: a context manager holding the lease on ``(location, key)``.

    Args:
        db: the ops database.
        location: data location name.
        lease_seconds: how long an acquisition is valid (a crashed holder blocks no longer).
        wait_seconds: how long to wait for another holder before giving up.

    Raises (on entering):
        StorageServiceError: the lease stayed held by another publisher for ``wait_seconds``
            (retryable).
    """

    @contextmanager
    def lease(key: str) -> Iterator[None]:
        token = secrets.token_hex(16)

        def acquire(s: Session) -> bool:
            now = utcnow()
            row = s.scalar(select(ObjectLease).where(ObjectLease.location == location, ObjectLease.key == key))
            expires = now + dt.timedelta(seconds=lease_seconds)
            if row is None:
                s.add(ObjectLease(location=location, key=key, holder=token, expires_at=expires))
                return True
            if row.expires_at <= now:
                row.holder, row.expires_at = token, expires
                return True
            return False

        deadline = time.monotonic() + wait_seconds
        delay = 0.02
        while True:
            try:
                got = db.transact(acquire)
            except Exception as e:  # a concurrent insert of the same key: look again
                if "UNIQUE" not in str(e).upper() and "DUPLICATE" not in str(e).upper():
                    raise
                got = False
            if got:
                break
            if time.monotonic() >= deadline:
                raise StorageServiceError(f"{location}: {key!r} is being published by another worker "
                                          f"(object lease held for more than {wait_seconds:.0f} s)",
                                          side="destination", path=key, host=location)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        try:
            yield
        finally:
            db.transact(lambda s: s.execute(delete(ObjectLease).where(
                ObjectLease.location == location, ObjectLease.key == key, ObjectLease.holder == token)))

    return lease
