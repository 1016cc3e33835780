"""Storage faults: the refusals of a data location's storage that make it unavailable rather
than fail the work (DESIGN.md "Architecture": storage that is absent is not empty; a disk that
turned read-only or answers I/O errors is not there for writing either).

A *fault* is met while writing at a location, or on its root:

* on disk, an :class:`OSError` whose errno is one of :data:`FAULT_ERRNOS` — ``EROFS`` (the
  file system was remounted read-only, often by the kernel after errors), ``EIO`` (a failing
  disk or a lost network mount), ``EACCES`` (permissions changed under the writer);
* on an object store, a :class:`~packhorse.errors.StorageServiceError` whose ``code`` is one
  of :data:`FAULT_CODES` (``AccessDenied`` on a write: a policy or a credential changed).

Neither heals by retrying an operation a few times in seconds, and neither is the operation's
fault: the location is recorded unavailable and the work waits until a write there succeeds
again (:func:`packhorse.rules.availability.probe`).
"""

from __future__ import annotations

import errno

from packhorse.errors import StorageServiceError

#: errnos that make a disk location unavailable when met writing there or on its root
FAULT_ERRNOS: frozenset[int] = frozenset({errno.EROFS, errno.EIO, errno.EACCES})
#: object-store error codes that make a location unavailable when met writing there
FAULT_CODES: frozenset[str] = frozenset({"AccessDenied", "AllAccessDisabled"})


def fault_of(exc: BaseException | None) -> tuple[str, str] | None:
    """The storage fault behind ``exc`` (itself, its ``__cause__`` or ``__context__``, at
    most 16 deep), as ``(name, text)``: ``name`` an errno name (``"EROFS"``) or an object
    store's error code (``"AccessDenied"``), ``text`` one phrase for a person
    (``"[Errno 30] Read-only file system (EROFS)"``). ``None`` when there is none: the error
    is then the operation's own (retried or failed as before). Never raises."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 16:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
            name = errno.errorcode.get(exc.errno, str(exc.errno))
            return name, f"[Errno {exc.errno}] {exc.strerror or exc} ({name})"
        code = getattr(exc, "code", None) if isinstance(exc, StorageServiceError) else None
        if code in FAULT_CODES:
            return str(code), f"the object store answered {code}"
        exc = exc.__cause__ or exc.__context__
    return None
