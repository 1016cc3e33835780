"""``transfer``: move a bundle from the source site's buffer to a destination site's buffer.

Run by the destination site's workers (they pull). Methods (per route):

* ``copy``: stream through the storage backends (local or mounted disks).
* ``sftp``: pull the bundle from the source site's buffer over SSH (the sites share no file
  system; :mod:`packhorse.storage.sftp`), as the route's ``streams`` parallel ranged reads,
  written in order into the resumable partial; an interrupted attempt's partial is checked
  against the source by sampled ranges, not re-read whole over the link; a cut link keeps the
  partial for the next attempt (:mod:`packhorse.stages.pull`).
* ``command``: run the route's ``command`` template (e.g. ``rsync -a {source} {destination}``)
  with ``{source}`` = the bundle's local path and ``{destination}`` = a partial file beside the
  final name at the destination; the arguments are split like a shell line and never passed to
  a shell. The lease is checked while the command runs; the command is killed if it is lost,
  and dies with its worker process (``PR_SET_PDEATHSIG``), so no orphaned command writes on.
  ``{partial}`` is the same partial file, but the template declares the command resumes
  (``rsync --partial --append-verify {source} {partial}``): it then gets the earlier attempt's
  partial, cut to its verified prefix, instead of an empty one.

Resumption (docs/reliability.md "Resumable transfers"): both methods write the partial under
the attempt's fencing token (:meth:`~packhorse.storage.base.StorageBackend.open_resumable_write`).
A later attempt takes over the partial an interrupted one left, reads it and the source's
prefix and compares them block by block (:func:`~packhorse.stages.base.resume_partial`), keeps
the equal prefix and writes only the rest; an S3 destination continues the interrupted
multipart upload with the parts that verify. The verification before and after publishing is
the same as for a fresh copy.

A route's ``bandwidth_limit_bytes_per_second`` is shared by its transfers in progress: each
reads at most the limit divided by their number (counted in the ops database every
:data:`SHARE_REFRESH_SECONDS`, so it holds across worker processes and machines). A command
gets its share as ``{bandwidth_limit}`` (bytes/s) and ``{bandwidth_limit_kib}`` (KiB/s). The
source reads that verify a resumed partial's prefix keep to the same share. A throttled ``copy``
reads and writes in pieces of about a second of its share (at least 64 KiB,
:func:`~packhorse.ratelimit.piece_bytes`), each in the partial file before the next is paid
for, so a transfer killed while it waits for the limiter loses at most one piece.

Either way the result is hashed and compared with the bundle's sha256 before it is published,
then re-read and verified (I4).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from packhorse.db.models import DataTransferPackage, Operation
from packhorse.domain import OperationKind, Status, TransferMethod
from packhorse.errors import (
    ConfigError,
    DestinationWriteError,
    SourceMissingError,
    TransferCommandError,
    VerificationError,
)
from packhorse.ratelimit import RateLimiter
from packhorse.rules.space import room_to_unpack
from packhorse.runtime.topology import bundle_key
from packhorse.stages.base import (
    Recorder,
    Work,
    clear_partials,
    copy_object,
    note_corrupt_source,
    note_lost_source,
    publish_verified,
    record_copy,
    resume_partial,
    there_or_moved_aside,
)
from packhorse.stages.pull import pull_over_ssh
from packhorse.storage.base import StorageBackend
from packhorse.storage.registry import read_limited

#: How often a rate-limited transfer counts the route's transfers in progress again, seconds.
SHARE_REFRESH_SECONDS = 0.25


def command_args(template: str, source: str, destination: str, bandwidth_limit: int | None = None) -> list[str]:
    """Split ``template`` like a shell line and fill ``{source}`` and ``{destination}`` /
    ``{partial}`` (both the partial file ``destination``) in each arg, and ``{bandwidth_limit}``
    (bytes/s) / ``{bandwidth_limit_kib}`` (KiB/s, at least 1) when a limit is given."""
    values = {"{source}": source, "{destination}": destination, "{partial}": destination}
    if bandwidth_limit is not None:
        values["{bandwidth_limit}"] = str(int(bandwidth_limit))
        values["{bandwidth_limit_kib}"] = str(max(1, int(bandwidth_limit) // 1024))
    out = []
    for arg in shlex.split(template):
        for k, v in values.items():
            arg = arg.replace(k, v)
        out.append(arg)
    return out


def route_share(work: Work, limit: int) -> float:
    """This transfer's share of a route limit of ``limit`` bytes/s: ``limit`` divided by the
    route's transfers in progress (the same source location; this one counted at least once)."""
    from sqlalchemy import func, select


    n = work.ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
        Operation.kind == OperationKind.TRANSFER.value, Operation.status == Status.IN_PROGRESS.value,
        Operation.source_location_id == work.op.source_location_id))) or 0
    return limit / max(1, int(n))


def run(work: Work) -> Recorder:
    """Copy and verify the bundle at the destination buffer; record the copy there."""
    ctx = work.ctx
    dtp = ctx.db.read(lambda s: s.get(DataTransferPackage, work.op.data_transfer_package_id))
    assert dtp is not None and dtp.size is not None and dtp.sha256 is not None
    src_name = ctx.location_name(work.op.source_location_id)
    dst_name = ctx.location_name(work.op.destination_location_id)
    src, dst = ctx.backend(src_name), ctx.backend(dst_name)
    key = bundle_key(dtp.name)
    work.info.update(bundle=dtp.name, source=src_name, destination=dst_name, key=key)
    route = ctx.settings.route_from(ctx.topology.site_name(dtp.source_site_id))
    method = route.method if route else TransferMethod.COPY

    limit = route.bandwidth_limit_bytes_per_second if route else None
    src_id = work.op.source_location_id
    ctx.hooks.hit("transfer.start")  # hooks: claimed, nothing read yet (tests lose the bundle here)
    if dst.stat(key) is None:  # keep room for its unpack and for the bundles there before it
        room_to_unpack(ctx, work.op.id, dtp.id, dst_name)
    if method is TransferMethod.COPY:
        source = src if limit is None else _throttled(work, src, limit)
        try:
            copy_object(work, source, key, dst, key, size=dtp.size, sha256=dtp.sha256, point="transfer",  # type: ignore[arg-type]
                        resume=True, to_buffer=True)
        except SourceMissingError:
            note_lost_source(work, src, key, location_id=src_id, data_transfer_package_id=dtp.id)
            raise
        except VerificationError:
            note_corrupt_source(work, src, key, expected_sha256=dtp.sha256, location_id=src_id,
                                data_transfer_package_id=dtp.id)
            raise
    elif method is TransferMethod.SFTP:
        assert route is not None
        share = None if limit is None else (lambda: route_share(work, limit))  # type: ignore[arg-type]
        pull_over_ssh(work, src_name, dst, key, size=dtp.size, sha256=dtp.sha256, location_id=src_id,
                      data_transfer_package_id=dtp.id, streams=route.streams, share=share,
                      compression=route.compression)
    elif not there_or_moved_aside(dst, key, dtp.size, dtp.sha256, work.ctx):
        if note_lost_source(work, src, key, location_id=src_id, data_transfer_package_id=dtp.id):
            raise SourceMissingError(f"{src_name}: {key!r} does not exist", side="source", path=key, host=src_name,
                                     step="transfer")
        assert route is not None and route.command is not None
        src_path = src.local_path(key)
        if src_path is None:
            raise ConfigError(f"routes: method 'command' needs disk locations ({src_name} is not)")
        resumes = "{partial}" in route.command
        if not resumes:
            clear_partials(dst, key)
        with (dst.open_resumable_write(key, work.claim.attempt) if resumes else dst.open_write(key)) as w:
            if w.local_path is None:
                raise ConfigError(f"routes: method 'command' needs disk locations ({dst_name} is not)")
            if w.resumed_bytes:
                source = src if limit is None else _throttled(work, src, limit)
                with source.open_read(key) as f:
                    resume_partial(work, f, w, dtp.size)  # the command writes the rest itself
            share = None if limit is None else int(route_share(work, limit))
            args = command_args(route.command, str(src_path), str(w.local_path), share)
            try:
                _run_command(work, args, key)
            except TransferCommandError as e:
                full = _out_of_space(w.local_path, dtp.size, dst_name, key, e)
                if full is not None:  # the command met a full buffer: wait for space, as a copy does
                    raise full from e
                raise
            w.adopt_local_file()
            if dtp.size is not None and w.size != dtp.size:
                # the command said it succeeded: the size says what it did (a cut copy, a
                # wrong file), before any hash
                raise VerificationError(
                    f"{dst_name}:{key}: the transfer command left {w.size:,} bytes, the bundle has {dtp.size:,} "
                    f"(the command exited 0: {route.command!r}); nothing published",
                    step="transfer", side="destination", path=key, host=dst_name)
            try:
                publish_verified(work, w, dst, expected_sha256=dtp.sha256, point="transfer")
            except VerificationError:
                note_corrupt_source(work, src, key, expected_sha256=dtp.sha256, location_id=src_id,
                                    data_transfer_package_id=dtp.id)
                raise
    location_id = ctx.topology.location_ids[dst_name]
    size, sha, dtp_id = dtp.size, dtp.sha256, dtp.id

    def record(s: Session) -> None:
        record_copy(s, location_id=location_id, key=key, size=size, sha256=sha, data_transfer_package_id=dtp_id)

    return record


def _throttled(work: Work, backend: StorageBackend, limit: int) -> StorageBackend:
    """``backend`` with reads kept to this transfer's share of ``limit`` (bytes/s), refreshed
    every :data:`SHARE_REFRESH_SECONDS`."""
    limiter = RateLimiter(route_share(work, limit), burst_seconds=0.25)
    next_refresh = [time.monotonic() + SHARE_REFRESH_SECONDS]

    def refresh() -> None:
        if time.monotonic() >= next_refresh[0]:
            next_refresh[0] = time.monotonic() + SHARE_REFRESH_SECONDS
            limiter.set_rate(route_share(work, limit))

    return read_limited(backend, limiter, refresh)


_PR_SET_PDEATHSIG = 1


def _die_with_worker() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the command get SIGKILL when its worker dies (Linux
    ``PR_SET_PDEATHSIG``), or ``None`` where that is not available.

    A command orphaned by a killed worker would otherwise go on writing into the partial file,
    which a later attempt may meanwhile have taken over to resume (fencing, I3)."""
    import ctypes
    import os
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the line above ran
            os._exit(1)

    return preexec


def _out_of_space(partial: Path, size: int, location: str, key: str,
                  failure: TransferCommandError) -> DestinationWriteError | None:
    """A failed transfer command's failure as a full destination (an ``out_of_space``
    :class:`~packhorse.errors.DestinationWriteError`: the operation waits for space, as the
    ``copy`` method's does) when the destination's file system has less room than the bundle
    still needs (``size`` bytes less what the command's ``partial`` file holds); ``None``
    otherwise (the command's failure stands). Decided from the file system, not from the
    command's words (``cp``, ``rsync``, ``rclone`` each say it their own way)."""
    try:
        held = partial.stat().st_size if partial.exists() else 0
        st = os.statvfs(partial.parent)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= size - held:
        return None
    return DestinationWriteError(
        f"{location}: the transfer command could not write {key!r}: the file system is full ({free:,} bytes free, "
        f"{size - held:,} still needed): {failure}", step="transfer", side="destination", path=key, host=location,
        out_of_space=True,
        diagnosis=f"data location {location} is out of space; free space there (deletions under disk pressure: "
                  "docs/deletion.md): the operation waits for it and goes on by itself")


def _run_command(work: Work, args: list[str], key: str) -> None:
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=_die_with_worker())  # noqa: PLW1509 - only prctl runs there
    except OSError as e:
        raise TransferCommandError(f"transfer command {args[0]!r} could not start: {e.strerror}",
                                   step="transfer", path=key) from None
    try:
        while proc.poll() is None:
            work.check()
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")[-2000:]
    if proc.returncode != 0:
        raise TransferCommandError(f"transfer command {shlex.join(args)} exited {proc.returncode}: {err.strip()}",
                                   step="transfer", side="destination", path=key)
