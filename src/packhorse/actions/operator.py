"""Operator actions shared by the HTTP API and the CLI: reset, reconcile, and forgetting a
skipped source file.

Every action is audited (:mod:`packhorse.runtime.audit`) with its actor and result. Resets reuse
:func:`packhorse.operations.lifecycle.reset_failed` (PENDING, retry count + 1, cached error context
cleared, failure history kept); circuit-breaker resets and forced retries reuse
:mod:`packhorse.recovery.breakers`.

*Reconcile* recomputes a raw data package's stored derived state — ``archived_at`` — from its
physical copies (DESIGN.md I1: archived = every long-term archive of every destination site of
its route holds a present, verified copy). It sets ``archived_at`` when the package is archived
but was never marked so (e.g. a crash between the last archive copy and the mark), and clears
it when a required archive copy is no longer present and verified, so the package shows as
not archived again. The pipeline keeps that state itself — recomputed in the same transaction
as every change of an archive copy's status, and swept by the fixity manager
(:func:`packhorse.rules.policy.refresh_archived`, DESIGN.md "Converging") — so this is a
check an operator may run, never a step anything waits for.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import DataLocation, Operation, RawDataPackage, SkippedFile, WithdrawnFile, utcnow
from packhorse.domain import OperationKind, Status
from packhorse.errors import (
    EmptyReasonError,
    NotSkippedError,
    ResetRefusedError,
    UnknownOperationError,
    UnknownPackageError,
)
from packhorse.operations.lifecycle import get_operation, reset_failed
from packhorse.recovery.breakers import force_retry, reset_breaker
from packhorse.rules.policy import is_archived
from packhorse.runtime import audit
from packhorse.runtime.context import ProcessContext
from packhorse.status.locate import source_candidates


def reset_operation(ctx: ProcessContext, kind: OperationKind, operation_id: int, *, actor: str,
                    reason: str | None = None) -> list[int]:
    """Reset one FAILED operation to PENDING; audited.

    Returns:
        ``[operation_id]``.

    Raises:
        UnknownOperationError: no operation of ``kind`` with that id.
        ResetRefusedError: it exists but is not FAILED (audited as ``refused``).
    """
    target = f"{kind.value}/{operation_id}"
    try:
        ctx.db.read(lambda s: get_operation(s, kind, operation_id))
    except UnknownOperationError:
        audit.record(ctx.db, actor=actor, action="operation.reset", target=target, details={"reason": reason},
                     result="refused", message="unknown operation")
        raise
    try:
        ids = reset_failed(ctx.db, kind, operation_id)
    except ResetRefusedError as e:
        audit.record(ctx.db, actor=actor, action="operation.reset", target=target, details={"reason": reason},
                     result="refused", message=str(e))
        raise
    audit.record(ctx.db, actor=actor, action="operation.reset", target=target,
                 details={"reason": reason, "reset": ids})
    return ids


def reset_all_failed(ctx: ProcessContext, kind: OperationKind, *, actor: str, reason: str | None = None) -> list[int]:
    """Reset every FAILED operation of ``kind``; audited (when there was none, the entry says
    so: nothing was changed). Returns the ids reset (``[]``: none was FAILED)."""
    ids = reset_failed(ctx.db, kind, None)
    audit.record(ctx.db, actor=actor, action="operation.reset_all_failed", target=kind.value,
                 details={"reason": reason, "reset": ids, "count": len(ids)},
                 message=None if ids else f"no FAILED {kind.value} operation: nothing reset")
    return ids


def _reconcile_one(s: Session, ctx: ProcessContext, pkg: RawDataPackage) -> dict[str, Any] | None:

    archived = is_archived(s, ctx, pkg)
    failed = s.scalar(select(Operation.id).where(Operation.raw_data_package_id == pkg.id,
                                                 Operation.status == Status.FAILED.value).limit(1)) is not None
    before = pkg.archived_at
    if archived and before is None:
        pkg.archived_at = utcnow()
        change = "marked archived"
    elif not archived and before is not None:
        pkg.archived_at = None
        change = "archived mark cleared: a required archive copy is not present and verified"
    else:
        return None
    return {"package_id": pkg.id, "name": pkg.name, "change": change,
            "archived_at_before": before.isoformat() if before else None,
            "archived_at": pkg.archived_at.isoformat() if pkg.archived_at else None, "has_failed_operation": failed}


def reconcile_package(ctx: ProcessContext, package_id: int, *, actor: str) -> dict[str, Any]:
    """Recompute one raw data package's derived state; audited.

    Returns:
        ``{"package_id", "name", "changed": bool, "change": str | None, "archived": bool}``.

    Raises:
        UnknownPackageError: no raw data package with that id.
    """
    def tx(s: Session) -> dict[str, Any]:
        pkg = s.get(RawDataPackage, package_id)
        if pkg is None:
            raise UnknownPackageError(f"no raw data package with id {package_id}")
        ch = _reconcile_one(s, ctx, pkg)
        return {"package_id": pkg.id, "name": pkg.name, "changed": ch is not None,
                "change": ch["change"] if ch else None, "archived": pkg.archived_at is not None}

    try:
        out = ctx.db.transact(tx)
    except UnknownPackageError as e:
        audit.record(ctx.db, actor=actor, action="package.reconcile", target=str(package_id), result="refused",
                     message=str(e))
        raise
    audit.record(ctx.db, actor=actor, action="package.reconcile", target=str(package_id), details=out)
    return out


def reconcile_inconsistent(ctx: ProcessContext, *, actor: str) -> dict[str, Any]:
    """Recompute the derived state of every raw data package; audited.

    Returns:
        ``{"checked": n, "changed": [{"package_id", "name", "change", ...}]}``.
    """
    def tx(s: Session) -> dict[str, Any]:
        changed, n = [], 0
        for pkg in s.scalars(select(RawDataPackage).order_by(RawDataPackage.id)):
            n += 1
            ch = _reconcile_one(s, ctx, pkg)
            if ch:
                changed.append(ch)
        return {"checked": n, "changed": changed}

    out = ctx.db.transact(tx)
    audit.record(ctx.db, actor=actor, action="package.reconcile_inconsistent",
                 details={"checked": out["checked"], "changed": [c["package_id"] for c in out["changed"]]})
    return out


def _audited(ctx: ProcessContext, action: str, kind: OperationKind, operation_id: int, actor: str, reason: str | None,
             fn: Any) -> dict[str, Any]:
    target = f"{kind.value}/{operation_id}"
    try:
        out = fn(ctx.db, kind, operation_id, reason=reason or "not given", actor=actor)
    except (UnknownOperationError, ResetRefusedError) as e:
        audit.record(ctx.db, actor=actor, action=action, target=target, details={"reason": reason},
                     result="refused", message=str(e))
        raise
    audit.record(ctx.db, actor=actor, action=action, target=target, details={"reason": reason})
    return out


def reset_circuit_breaker(ctx: ProcessContext, kind: OperationKind, operation_id: int, *, actor: str,
                          reason: str | None = None) -> dict[str, Any]:
    """Close an operation's circuit breaker by hand (:func:`packhorse.recovery.breakers.reset_breaker`); audited.

    Raises:
        UnknownOperationError: no operation of ``kind`` with that id.
    """
    return _audited(ctx, "breaker.reset", kind, operation_id, actor, reason, reset_breaker)


def force_retry_operation(ctx: ProcessContext, kind: OperationKind, operation_id: int, *, actor: str,
                          reason: str | None = None) -> dict[str, Any]:
    """Force a retry (:func:`packhorse.recovery.breakers.force_retry`: breaker closed, PENDING,
    dispatchable now); audited.

    Raises:
        UnknownOperationError: no operation of ``kind`` with that id.
        ResetRefusedError: the operation is COMPLETED.
    """

    return _audited(ctx, "operation.force_retry", kind, operation_id, actor, reason, force_retry)


def forget_skipped(ctx: ProcessContext, path: str, *, reason: str, actor: str) -> list[dict[str, Any]]:
    """Stop listing a source file that went away before its package was built (a registration
    taken out of its package, ``withdrawn_files``): an operator says it is gone for good, and
    why. ``packhorse status`` lists it as skipped until then, and ``run --until-idle`` counts
    it, since it is not archived (I1: nothing is skipped silently); this is the state's way out
    besides the file coming back. The row stays, with who forgot it, when and why (``packhorse
    locate`` shows it); if the file does come back, the scan registers and archives it as ever.
    Audited (``file.forget``).

    Args:
        path: ``LOCATION:PATH``, an absolute path under a source location, or a path relative
            to a source location (:func:`packhorse.status.locate.source_candidates`).
        reason: why it is gone for good (kept in the row and the audit log).

    Returns:
        ``[{"location", "path", "reason"}]`` of the entries forgotten (one per location the
        path names).

    Raises:
        EmptyReasonError: ``reason`` is empty or blank (nothing is changed).
        NotSkippedError: no such listed entry: the path is skipped for a reason that lasts only
            as long as its cause (a symbolic link, an unreadable file: remove the cause or
            exclude the path), or it is not skipped at all; or a relative path is listed in
            more than one source location (give ``LOCATION:PATH``). Audited as refused.
    """
    if not reason.strip():
        raise EmptyReasonError("--reason: say why the file is gone for good (kept with the entry and in the audit log)")

    def tx(s: Session) -> list[dict[str, Any]]:
        names = dict(s.execute(select(DataLocation.id, DataLocation.name)).all())
        found: dict[tuple[str, str], list[WithdrawnFile]] = {}
        other: list[str] = []
        for loc_id, rel in source_candidates(s, path, ctx.settings):
            rows = list(s.scalars(select(WithdrawnFile).where(WithdrawnFile.location_id == loc_id,
                                                              WithdrawnFile.relative_path == rel,
                                                              WithdrawnFile.listed())))
            if rows:
                found[(names[loc_id], rel)] = rows
            other += [f"{names[loc_id]}:{rel} is skipped ({k.reason})"
                      for k in s.scalars(select(SkippedFile).where(SkippedFile.location_id == loc_id,
                                                                   SkippedFile.relative_path == rel))]
        if len(found) > 1:
            raise NotSkippedError(f"{path!r} is listed in more than one source location "
                                  f"({', '.join(f'{loc}:{rel}' for loc, rel in found)}): "
                                  "give the one to forget as LOCATION:PATH")
        now = utcnow()
        done: list[dict[str, Any]] = []
        for (loc, rel), rows in found.items():
            for w in rows:
                w.forgotten_at, w.forgotten_by, w.forgotten_reason = now, actor, reason
            done.append({"location": loc, "path": rel, "reason": "; ".join(dict.fromkeys(w.reason for w in rows))})
        if not done:
            why = ("; ".join(other) + ": it is listed while that lasts (remove the cause, or exclude the path "
                   "with the location's exclude patterns)") if other else (
                f"no source file gone before it was packaged is listed at {path!r}; `packhorse status` lists "
                "the skipped ones")
            raise NotSkippedError(why)
        return done

    try:
        done = ctx.db.transact(tx)
    except NotSkippedError as e:
        audit.record(ctx.db, actor=actor, action="file.forget", target=path, details={"reason": reason},
                     result="refused", message=str(e))
        raise
    audit.record(ctx.db, actor=actor, action="file.forget", target=path,
                 details={"reason": reason, "forgotten": done})
    return done
