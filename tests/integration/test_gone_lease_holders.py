"""Leases whose holder is certainly gone are taken over before they expire
(:func:`packhorse.recovery.monitor.provably_gone`), with real processes of this host: a holder
of this pid namespace whose process ended; never a live one, one of another namespace or host,
or an owner without a namespace (docs/recovery.md, "Layer 2")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from sqlalchemy import select

from ops_support import expire, new_op, op_row, with_site
from packhorse.config import settings_from_dict
from packhorse.db.models import FailureEvent, Notification, utcnow
from packhorse.db.session import Database
from packhorse.operations.identity import namespace_of, process_namespace, worker_identity
from packhorse.operations.lifecycle import claim
from packhorse.recovery import health
from packhorse.recovery.monitor import check_stalled
from support import SRC


def settings(**recovery: Any) -> Any:
    return settings_from_dict({"recovery": {"max_stall_count": 3, **recovery}}, environ={})


@pytest.fixture
def db(empty_db: Database) -> Database:
    return with_site(empty_db)


def notes(db: Database, op_id: int) -> list[Notification]:
    return db.read(lambda s: list(s.scalars(select(Notification).where(Notification.operation_id == op_id))))



def _gone_identity() -> str:
    """The lease owner a process of this host and pid namespace named itself by, that has ended."""
    out = subprocess.run([sys.executable, "-c", "from packhorse.operations.identity import worker_identity; "
                          "print(worker_identity('t'))"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    return out.stdout.strip()


def _gone_pid() -> int:
    """The pid of a process of this host that has ended (and been waited for)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _claim_held(db: Database, op_id: int, owner: str, seconds: float = 600) -> None:
    """``owner`` claims the operation; its lease runs ``seconds`` more (far from expired)."""
    assert claim(db, op_id, owner, seconds) is not None


def test_a_lease_whose_holder_process_is_gone_is_taken_over_before_it_expires(db: Database) -> None:
    owner = _gone_identity()
    assert namespace_of(owner) == process_namespace() is not None
    op_id = new_op(db)
    _claim_held(db, op_id, owner)
    report = check_stalled(db, settings())
    assert report.reset == [op_id]
    op = op_row(db, op_id)
    assert (op.status, op.lease_owner, op.retry_count) == ("PENDING", None, 0)
    # the whole service (a runner) went: not the operation's fault, no stall counted
    assert op.stall_count == 0
    [event] = db.read(lambda s: list(s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id))))
    assert event.error_type == "Stalled" and "taken over before it expired" in event.message and owner in event.message
    [n] = notes(db, op_id)
    assert n.event == "stalled_recovered" and "gone from this host" in n.body
    assert claim(db, op_id, "w2", 30) is not None


def test_a_dead_worker_process_of_a_live_runner_is_taken_over_and_counted(db: Database) -> None:
    """A worker process killed under a live runner (its pid in ``worker-<pid>``): taken over at
    once, and the stall counts on the operation's breaker (it may be what kills its worker)."""
    owner = (f"{socket.gethostname()}:{os.getpid()}:ns-{process_namespace()}:worker-{_gone_pid()}"
             ":ThreadPoolExecutor-0_0")
    op_id = new_op(db)
    _claim_held(db, op_id, owner)
    assert check_stalled(db, settings()).reset == [op_id]
    assert op_row(db, op_id).stall_count == 1


@pytest.mark.parametrize("which", ["alive", "other namespace", "no namespace", "other host"])
def test_a_holder_not_certainly_gone_keeps_its_lease(db: Database, which: str) -> None:
    """Only a holder of this very pid namespace whose process is gone is taken over early: a
    live one, one of another container (another namespace, perhaps the same hostname), one of an
    older version (no namespace in its owner) or of another host waits for its lease to expire."""
    host, pid = socket.gethostname(), _gone_pid()
    owner = {"alive": worker_identity("t"),
             "other namespace": f"{host}:{pid}:ns-000000000000-1:t",
             "no namespace": f"{host}:{pid}:t",
             "other host": f"{host}-elsewhere:{pid}:ns-{process_namespace()}:t"}[which]
    op_id = new_op(db)
    _claim_held(db, op_id, owner)
    assert check_stalled(db, settings()).reset == []
    op = op_row(db, op_id)
    assert (op.status, op.lease_owner) == ("IN_PROGRESS", owner)
    # its lease expiring is what hands it out again
    expire(db, op_id)
    assert check_stalled(db, settings()).reset == [op_id]


def test_a_zombie_process_does_not_run() -> None:
    """A killed worker process stays a zombie until its parent waits for it: gone all the same."""
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while health.process_alive(child.pid):
            assert time.monotonic() < deadline, "the exited child still counts as running"
            time.sleep(0.01)
        assert child.returncode is None  # not reaped yet: a zombie
    finally:
        child.wait()
    assert not health.process_alive(child.pid)
    assert health.process_alive(os.getpid())


def _in_new_pid_namespace(*, own_proc: bool) -> subprocess.CompletedProcess[str]:
    """``process_namespace()`` as a process in a new pid namespace sees it: with a ``/proc`` of
    its own (``--mount-proc``) or still the outer one's. Skipped where namespaces cannot be made."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    code = ("import os; from packhorse.operations.identity import process_namespace, proc_is_ours; "
            "print(os.getpid(), proc_is_ours(), process_namespace())")
    args = ["unshare", "--pid", "--fork", *(["--mount-proc"] if own_proc else []), sys.executable, "-c", code]
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    if r.returncode != 0 and ("Operation not permitted" in r.stderr or "unshare failed" in r.stderr):
        pytest.skip(f"pid namespaces cannot be made here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return r


def test_a_process_whose_proc_is_another_namespaces_names_none_and_takes_over_nothing() -> None:
    """In a new pid namespace without a ``/proc`` of its own, ``/proc/<pid>`` is another
    process than ``pid`` means there (a trial saw such a run take over its own live workers'
    leases, its pids matching outer zombies): no namespace is named, so nothing is taken over
    early; with a ``/proc`` of its own, its namespace is named and differs from ours."""
    pid, ours, ns = _in_new_pid_namespace(own_proc=False).stdout.split()
    assert int(pid) < 10 and ours == "False" and ns == "None"
    pid, ours, ns = _in_new_pid_namespace(own_proc=True).stdout.split()
    assert ours == "True" and ns not in ("None", process_namespace())
    assert ns.split("-")[0] == process_namespace().split("-")[0]  # one kernel boot, another pid namespace


def test_health_judges_a_service_of_another_namespace_by_its_heartbeat_alone(db: Database) -> None:
    """``packhorse health`` on this host: a service whose pid is gone is dead at once when it
    recorded this pid namespace (or none, an older version's row), but a service of another
    namespace (a container with the same hostname) is alive while its heartbeat is fresh."""
    now = utcnow()
    dead_pid = _gone_pid()
    for name, ns in (("ours", process_namespace()), ("older", None), ("container", "000000000000-1")):
        health.record_heartbeat(db, f"runner:{name}@{socket.gethostname()}", kind="runner", host=socket.gethostname(),
                                pid=dead_pid, pid_namespace=ns, now=now)
    alive = {r["service"].split("@")[0]: r["alive"] for r in db.read(lambda s: health.list_services(s, now=now))}
    assert alive == {"runner:ours": False, "runner:older": False, "runner:container": True}
    with pytest.raises(health.ServiceHealthError, match="is alive"):
        health.forget_service(db, f"runner:container@{socket.gethostname()}", now=now)
