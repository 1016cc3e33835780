"""``pull``: the ``sftp`` method of the ``transfer`` stage: a destination site's worker pulls a
bundle from the source site's buffer over SSH (DESIGN.md "Across sites": sites share no file
system), through :class:`packhorse.storage.sftp.SftpSource`, into its own buffer.

The bundle is read as the route's ``streams`` parallel ranged reads and written in order into
a resumable partial under the attempt's fencing token, then hashed and compared with the sha256
recorded at the source before it is published, and read back (I2, I4), as every transfer is.
What differs from ``copy`` (docs/reliability.md "Resumable transfers"):

* a cut link keeps the partial on the disk for the next attempt
  (:meth:`~packhorse.storage.base.PendingWrite.suspend`) instead of removing it, and so does a
  lost lease (a stale fencing token, or the renewal deadline passed without renewal), which
  aborts a read waiting on a stalled link at once
  (:meth:`~packhorse.operations.lease.LeaseKeeper.on_lost`); a successor waits for a partial
  its stale predecessor still holds (:func:`held_partial_wait_seconds`) and resumes it;
* a taken-over partial is compared with the source by sampled ranges
  (:func:`resume_sampled`), not re-read whole over the link;
* the source's availability (its root and identity marker) is looked at over SSH
  (:meth:`~packhorse.storage.sftp.SftpSource.connect`), never through a local path, and nothing
  is written at the source site: a bundle lost there is recorded ``missing`` (the pipeline makes
  it again), but a damaged one is left for that site's own workers to quarantine.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import structlog

from packhorse.errors import (
    LeaseLostError,
    SourceMissingError,
    SshConnectionError,
    TransientDatabaseError,
    VerificationError,
)
from packhorse.ratelimit import RateLimiter
from packhorse.stages.base import Work, note_lost_source, publish_verified, there_or_moved_aside
from packhorse.storage.base import CHUNK_BYTES, PendingWrite, StorageBackend
from packhorse.storage.sftp import SftpSource, endpoint_for

log = structlog.get_logger(__name__)

#: How often a rate-limited pull asks for its share of the route's limit again, seconds.
SHARE_REFRESH_SECONDS = 0.25
#: Resumption: the taken-over partial's end is compared with the source in blocks of
#: this many bytes, walking back over at most :data:`RESUME_TAIL_BLOCKS` of them (a crash's
#: garbage tail) ...
RESUME_TAIL_BYTES = 1024 * 1024
RESUME_TAIL_BLOCKS = 8
#: ... and :data:`RESUME_SAMPLES` ranges of :data:`RESUME_SAMPLE_BYTES` spread over the rest.
RESUME_SAMPLES = 16
RESUME_SAMPLE_BYTES = 64 * 1024
#: A successor attempt waits for the partial its stale predecessor still holds for two
#: heartbeat intervals and this many seconds more (:func:`held_partial_wait_seconds`).
HELD_PARTIAL_MARGIN_SECONDS = 10.0


def held_partial_wait_seconds(work: Work) -> float:
    """How long (seconds) a pull waits for the partial a stale attempt of its operation still
    holds before it starts without it: ``2 × heartbeat interval + HELD_PARTIAL_MARGIN_SECONDS``.
    The stale attempt's next renewal, at most one interval after the successor's claim, finds
    its fencing token stale and aborts its read (:meth:`~packhorse.operations.lease.LeaseKeeper.on_lost`);
    it then suspends its partial, which frees the lock (docs/reliability.md "Resumable
    transfers"). A stale attempt cut off from the database too aborts its read the same way at
    its renewal deadline (``lease_timeout − 1.5 × heartbeat_interval`` after its last renewal),
    which passes before its lease can expire, so usually before the successor's claim: the lock
    is then free already. Only a predecessor that cannot run at all (a paused process) holds
    it past the wait; the successor then starts without its partial, as it would without the
    wait."""
    return 2 * work.lease.interval + HELD_PARTIAL_MARGIN_SECONDS


def pull_over_ssh(work: Work, src_name: str, dst: StorageBackend, key: str, *, size: int, sha256: str,
                  location_id: int, data_transfer_package_id: int, streams: int,
                  share: Callable[[], float] | None, compression: bool = False) -> None:
    """The ``sftp`` method: pull ``key`` (``size`` bytes) from data location ``src_name`` of
    another site over SSH into the destination buffer ``dst``, verified against ``sha256`` (the
    one recorded at the source) before and after publishing (I4), written once (I2).

    The partial is resumable under the attempt's fencing token; a taken-over partial is kept
    as far as :func:`resume_sampled` finds it equal to the source, and the rest is read over
    ``streams`` SSH connections in order (zlib-compressed with ``compression``, the route's). A cut link (:class:`~packhorse.errors.SshConnectionError`)
    keeps the partial on the disk for the next attempt
    (:meth:`~packhorse.storage.base.PendingWrite.suspend`); any other failure removes it, as for
    ``copy`` (a failed final verification included, so a partial whose sampled check passed but
    whose bytes differ is never resumed twice). A lost lease (the fencing token found stale by
    a renewal, or the renewal deadline passed without a successful renewal, e.g. while the
    database is unreachable) aborts the read at once instead of after the link's patience, and
    the partial is suspended: its lock is free for the successor, which waits for it up to
    :func:`held_partial_wait_seconds` instead of starting from byte 0. With ``share`` (a function giving this
    transfer's share of the route's bandwidth limit now, bytes/s) every byte read over the link
    is paid for first; it is asked again every :data:`SHARE_REFRESH_SECONDS`.

    Raises:
        SshConnectionError: the link failed or was cut (retried; the partial stays).
        HostKeyError / SshAuthenticationError: the configuration is wrong (never retried).
        LocationUnavailableError: the remote root or its identity marker is missing (waits).
        SourceMissingError: no bundle under ``key`` at the source (its copy is recorded missing).
        VerificationError: the bytes differ from ``sha256`` (nothing published).
        LeaseLostError: the lease was lost (nothing published);
            :class:`~packhorse.errors.LeaseNotRenewedError` when it was not renewed in time.
    """
    if there_or_moved_aside(dst, key, size, sha256, work.ctx):
        return
    limiter = None if share is None else RateLimiter(share(), burst_seconds=0.25)
    next_refresh = [time.monotonic() + SHARE_REFRESH_SECONDS]

    def refresh() -> None:
        if limiter is not None and share is not None and time.monotonic() >= next_refresh[0]:
            next_refresh[0] = time.monotonic() + SHARE_REFRESH_SECONDS
            limiter.set_rate(share())

    with SftpSource(endpoint_for(work.ctx.settings, src_name), streams=streams, limiter=limiter,
                    compression=compression) as source:
        source.connect()
        found = source.stat(key)
        if found is None:
            note_lost_source(work, source, key, location_id=location_id,  # type: ignore[arg-type]
                             data_transfer_package_id=data_transfer_package_id)
            raise SourceMissingError(f"{src_name}: {key!r} does not exist on {source.endpoint.host}", side="source",
                                     path=key, host=source.endpoint.host, step="transfer")
        if found.size != size:
            raise VerificationError(
                f"{src_name}:{key}: the bundle at {source.endpoint.host} has {found.size:,} bytes, {size:,} were "
                "recorded; nothing read", step="transfer", side="source", path=key, host=source.endpoint.host,
                diagnosis=f"the bundle at rest in {src_name} changed; `packhorse verify` at that site finds it")
        work.info.update(streams=streams, over=source.endpoint.where)
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        with dst.open_resumable_write(key, work.claim.attempt, wait_for_held_seconds=held_partial_wait_seconds(work),
                                      while_waiting=work.check) as w:
            deferred = w.defer_hash()  # disk: the finished partial is read back before publishing
            try:
                forget = work.lease.on_lost(source.abort_range_reads)  # as for the reader below
                try:
                    kept = resume_sampled(work, source, w, size, hash_prefix=not deferred) if w.resumed_bytes else 0
                finally:
                    forget()
                with source.open_read(key, offset=kept, size=size, on_read=refresh) as f:
                    # a stale attempt (or one past its renewal deadline) stops at once, not after
                    # a stalled read's patience: its partial is suspended below and its lock freed
                    # for the successor
                    forget = work.lease.on_lost(f.abort)
                    try:
                        first = True
                        while n := f.readinto(buf):
                            w.write(view[:n])
                            if first:
                                work.ctx.hooks.hit("transfer.writing")
                                first = False
                            work.progress(n)
                    finally:
                        forget()
            except (SshConnectionError, LeaseLostError, TransientDatabaseError):
                # the link, or this worker's hold on the database, was lost, not the bytes: what
                # arrived stays for the next attempt to resume (a site cut off for longer than a
                # lease keeps its partial; the successor re-checks it and reads it all back, I4)
                w.suspend()
                raise
            publish_verified(work, w, dst, expected_sha256=sha256, point="transfer")


def resume_sampled(work: Work, source: SftpSource, w: PendingWrite, size: int, *, hash_prefix: bool = True) -> int:
    """Decide how much of the partial ``w`` took over to keep, comparing it with the source
    over the link by ranges instead of re-reading it whole (which would cost the link what the
    resumption saves; docs/reliability.md "Resumable transfers").

    The end of the taken-over bytes (at most ``size``) is compared in blocks of
    :data:`RESUME_TAIL_BYTES`, walking back over at most :data:`RESUME_TAIL_BLOCKS` blocks past
    a differing one (a crash's garbage tail): the prefix up to the first equal block's end is
    the candidate. Then :data:`RESUME_SAMPLES` ranges spread over that prefix must all be equal
    (a partial of other bytes); otherwise nothing is kept. The kept prefix is not proven by
    this: the whole bundle is hashed and compared with the sha256 recorded at the source before
    it is published (I4), and a failure there removes the partial, so the next attempt starts
    from byte 0. Link cost: at most about (RESUME_TAIL_BLOCKS × 1 MiB + 1 MiB) bytes.

    ``hash_prefix``: hash the kept bytes (read locally) for ``w``'s running sha256; ``False``
    for a write that reads its bytes back before publishing (:meth:`~packhorse.storage.base.PendingWrite.defer_hash`).

    Returns:
        the bytes kept (the offset to read the source from); ``w`` is cut there
        (:meth:`~packhorse.storage.base.PendingWrite.keep_prefix`).

    Raises:
        SshConnectionError: the link failed meanwhile (nothing decided).
        LeaseLostError: the lease was lost meanwhile.
    """
    taken = min(w.resumed_bytes, size)
    key = w.key
    kept = 0
    with w.open_resumed() as p:
        def equal(offset: int, length: int) -> bool:
            p.seek(offset)
            mine = p.read(length)
            work.check()
            return bool(mine) and source.read_range(key, offset, length) == mine

        end = taken
        for _ in range(RESUME_TAIL_BLOCKS + 1):
            if end <= 0:
                break
            start = max(0, end - RESUME_TAIL_BYTES)
            if equal(start, end - start):
                kept = end
                break
            end = start
        if kept:
            span = max(0, kept - RESUME_TAIL_BYTES)
            for i in range(RESUME_SAMPLES):
                offset = span * i // RESUME_SAMPLES
                if span and not equal(offset, min(RESUME_SAMPLE_BYTES, span - offset)):
                    kept = 0
                    break
        hasher = hashlib.sha256()
        if kept and hash_prefix:
            p.seek(0)
            left = kept
            while left:
                chunk = p.read(min(CHUNK_BYTES, left))
                hasher.update(chunk)
                left -= len(chunk)
    w.keep_prefix(kept, hasher)
    if kept:
        work.progress(kept)
    work.info.update(resumed_bytes=kept, partial_bytes_dropped=w.resumed_bytes - kept)
    log.info("partial_resumed", key=key, taken_over_bytes=w.resumed_bytes, kept_bytes=kept, to_write_bytes=size - kept,
             checked="sampled")
    return kept
