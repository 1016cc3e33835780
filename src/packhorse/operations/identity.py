"""Process identity: who holds a lease (DESIGN.md "Lease").

A lease owner is ``<host>:<pid>`` with tags that say what kind of process it is (a Celery pool
child, a local runner's worker) and, where the host runs processes in Linux PID namespaces, which
namespace. The stalled-task monitor and ``health`` read them back to tell whether the holder
still lives (:mod:`packhorse.recovery.monitor`, :mod:`packhorse.recovery.health`).
"""

from __future__ import annotations

import functools
import socket
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)


def worker_identity(suffix: str = "") -> str:
    """``host:pid[:ns-<namespace>][:suffix]`` — who holds a lease. The embedded runner's leases
    name the runner's own pid (``host:pid:ns-…:<thread>``, or ``host:<runner pid>:ns-…:worker-<pid>:<thread>``
    from one of its worker processes, :func:`runner_worker_identity`); a Celery pool child's name
    the child (``host:pid:ns-…:celery-<task id>``, :data:`CELERY_OWNER_TAG`). The ``ns-`` part
    (:func:`process_namespace`) says which kernel boot and pid namespace the pids belong to;
    it is left out where the system does not tell (no ``/proc``)."""
    import os

    ns = process_namespace()
    return (f"{socket.gethostname()}:{os.getpid()}" + (f":{NAMESPACE_TAG}{ns}" if ns else "")
            + (f":{suffix}" if suffix else ""))


#: What marks the lease owner of a Celery pool child (its pid is the child's, not its service's).
CELERY_OWNER_TAG = "celery-"


#: What marks the process namespace in a lease owner (:func:`process_namespace`).
NAMESPACE_TAG = "ns-"


@functools.cache
def process_namespace() -> str | None:
    """``<boot>-<pid namespace>`` of this process: the first 12 hex digits of the kernel's boot
    id (``/proc/sys/kernel/random/boot_id``, new at every boot, the same in every container of
    one kernel) and the inode number of its pid namespace (``/proc/self/ns/pid``, different in
    each container). Two processes with the same namespace see the same pids, so a pid of a
    lease owner with this namespace that does not run here belongs to a process that is gone:
    what lets a restarted service take over the leases of the one that was killed at once
    instead of waiting them out (:func:`packhorse.recovery.monitor.check_stalled`). A hostname
    alone does not tell that: containers may share one. ``None`` without ``/proc`` (not Linux)."""
    import os

    if not proc_is_ours():
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip().replace("-", "")[:12]
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, UnicodeDecodeError):
        return None
    return f"{boot}-{pid_ns}" if boot else None


def proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's own pid namespace: ``/proc/self`` names this
    process's pid. A process started in a new pid namespace without a ``/proc`` of its own
    (``unshare --pid`` without ``--mount-proc``) sees the outer namespace's ``/proc``, where
    ``/proc/<pid>`` is another process than the one ``pid`` means here: nothing about a pid may
    then be read there (:func:`process_namespace` is ``None``, so no lease is taken over early;
    :func:`packhorse.recovery.health.process_alive` asks the kernel only)."""
    import os

    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def namespace_of(owner: str | None) -> str | None:
    """The process namespace a lease owner names (:func:`worker_identity`: its ``ns-`` part),
    or ``None`` for an owner without one (an older version's, a system without ``/proc``)."""
    for part in (owner or "").split(":")[2:]:
        if part.startswith(NAMESPACE_TAG):
            return part[len(NAMESPACE_TAG):]
    return None


def runner_worker_identity(runner_pid: int) -> str:
    """``host:<runner pid>[:ns-<namespace>]:worker-<pid>`` — a worker process of the embedded
    runner ``runner_pid``, as its leases name it: the runner first (:func:`runner_of`), then the
    worker process itself."""
    import os

    ns = process_namespace()
    return (f"{socket.gethostname()}:{runner_pid}" + (f":{NAMESPACE_TAG}{ns}" if ns else "")
            + f":{RUNNER_WORKER_TAG}{os.getpid()}")


#: What marks a worker process of the embedded runner in a lease owner (:func:`runner_worker_identity`).
RUNNER_WORKER_TAG = "worker-"


def holder_processes(owner: str | None) -> tuple[str, list[int]] | None:
    """``(host, [pid, …])`` of the processes an attempt's lease depends on, as its owner names
    them (:func:`worker_identity`): the runner or claiming process, and an embedded runner's
    worker process (``worker-<pid>``) when there is one; a Celery pool child's own pid. ``None``
    for an owner of another form."""
    parts = (owner or "").split(":")
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    workers = [p[len(RUNNER_WORKER_TAG):] for p in parts[2:] if p.startswith(RUNNER_WORKER_TAG)]
    return parts[0], [int(parts[1])] + [int(w) for w in workers if w.isdigit()]


def runner_of(owner: str | None) -> tuple[str, int] | None:
    """``(host, pid)`` of the embedded runner an operation's lease owner names
    (:func:`worker_identity`), or ``None`` for any other owner: a Celery pool child, a claim by
    hand, an owner of another form. The runner's death ends every lease it holds at once (its
    worker processes go with it); a worker process of a live runner dying does not change it."""
    parts = (owner or "").split(":")
    if len(parts) < 2 or not parts[1].isdigit() or any(p.startswith(CELERY_OWNER_TAG) for p in parts[2:]):
        return None
    return parts[0], int(parts[1])
