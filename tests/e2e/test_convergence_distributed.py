"""Desired state, converged — in distributed mode: PostgreSQL, one Celery worker per site
(Redis broker), a ``packhorse manager`` and a ``packhorse monitor``, all real processes. The
same faults as ``test_convergence.py``; the cluster keeps running and must converge by itself
(nobody runs ``reset``, SQL or changes the configuration), judged from outside: the bytes in
every archive, the quarantined bad objects, ``status --json`` and the notification outbox.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import LTAS, Pipeline, assert_archived_everywhere, source_files
from test_convergence import (
    GROUPS,
    SOURCE_DELETION,
    copy_statuses,
    corrupt_archive_copies,
    notifications,
    package_names,
    quarantined,
    write_source,
)

from distributed_support import (
    CLEAN,
    ArchiveWatch,
    Cluster,
    postgres_database,
    redis_url,
    report_heal,
    source_digests,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]


class _Installation:
    """A cluster of the three-site configuration and the helpers of ``test_convergence`` on it."""

    def __init__(self, site_config: Any, cli: Any, tmp_path: Path, *, extra: str = "",
                 worker_env: dict[str, dict[str, str]] | None = None) -> None:
        self.db_url, self.drop = postgres_database()
        config = site_config(bundle_max_wait_seconds=1, poll_interval_seconds=0.5, extra=extra)
        self.cluster = Cluster(config, self.db_url, redis_url())
        self.p = Pipeline(config, cli, tmp_path / "extracted")
        os.environ["PACKHORSE_DATABASE__URL"] = self.db_url  # for the helpers' plain reads and p.cli
        self.worker_env = worker_env

    def start(self) -> None:
        write_source(self.p)
        self.cluster.init()
        self.cluster.start_all(monitor=True, worker_env=self.worker_env)

    def status(self) -> dict[str, Any]:
        return self.cluster.status()

    def converged(self) -> dict[str, Any] | None:
        st = self.status()
        pk = st["packages"]
        if pk["total"] != len(GROUPS) or pk["archived"] != pk["total"] or st["failed_operations"] or st["blocked"]:
            return None
        if any(st["copies"][b]["count"] for b in ("fyst-buffer", "cologne-buffer", "cornell-buffer")):
            return None
        if any(set(c) - {"COMPLETED", "FAILED"} for c in st["operations"].values()):
            return None
        return st

    def wait_converged(self, timeout: float = 300, watch: ArchiveWatch | None = None) -> dict[str, Any]:
        def converged() -> dict[str, Any] | None:
            if watch is not None:
                watch.look()
            return self.converged()

        try:
            return wait_for(converged, timeout, "the cluster to converge", interval=1.0)
        except AssertionError:
            logs = "\n".join(f"--- {n}.log (tail)\n{self.cluster.log(n)[-3000:]}" for n in
                             ["manager", "monitor", "worker-fyst", "worker-cologne", "worker-cornell"])
            raise AssertionError(f"not converged: {json.dumps(self.status())[:4000]}\n{logs}") from None

    def verify(self) -> tuple[int, dict[str, Any]]:
        r = self.cluster.cli("verify", "--json")
        return r.returncode, json.loads(r.stdout)

    def close(self) -> None:
        self.cluster.stop_all()
        os.environ.pop("PACKHORSE_DATABASE__URL", None)
        self.drop()


@pytest.fixture
def installation(site_config, cli, tmp_path):
    made: list[_Installation] = []

    def make(**kw: Any) -> _Installation:
        inst = _Installation(site_config, cli, tmp_path, **kw)
        made.append(inst)
        return inst

    yield make
    for inst in made:
        inst.close()


def _assert_archived(inst: _Installation) -> None:
    assert_archived_everywhere(inst.p, source_files(inst.p.source))
    code, report = inst.verify()
    assert code == 0 and report["ok"] == report["checked"] == 2 * len(GROUPS), report


def test_every_archive_copy_corrupt_is_re_archived_from_the_source_files(installation) -> None:
    inst = installation()
    inst.start()
    inst.wait_converged()
    name = package_names(inst.p)[0]
    bad = corrupt_archive_copies(inst.p, name)
    code, report = inst.verify()
    assert code == 1 and sorted(c["location"] for c in report["corrupt"]) == list(LTAS), report

    inst.wait_converged()

    _assert_archived(inst)
    for lta in LTAS:
        assert quarantined(inst.p, lta, name) == [bad[lta]]
        assert copy_statuses(inst.p, name)[lta] == ["corrupt", "present"]


def test_bundle_deleted_before_its_transfer_is_rebuilt_and_shipped(installation, tmp_path: Path) -> None:
    marker, deleted = tmp_path / "transfer-paused", tmp_path / "bundle-deleted"
    # each transfer is held until the bundle is deleted (a fixed pause could end first on a loaded machine)
    hook = {"PACKHORSE_TEST_FAULTS": json.dumps([{"point": "transfer.start", "action": "wait_for",
                                                  "path": str(deleted), "seconds": 120, "marker": str(marker),
                                                  "unless_exists": str(deleted)}])}
    inst = installation(worker_env={"cologne": hook, "cornell": hook})
    inst.start()
    wait_for(marker.exists, 180, "a transfer to start")
    bundles = [path for key, path in inst.p.objects("fyst-buffer").items() if key.startswith("bundles/")]
    assert len(bundles) == 1, bundles
    watch = ArchiveWatch(inst.p.root)
    watch.look()
    os.chmod(bundles[0], 0o644)
    bundles[0].unlink()
    deleted.write_text("")
    gone = time.monotonic()  # a deleted bundle does not come back by itself: counted from the deletion

    st = inst.wait_converged(watch=watch)
    healed = time.monotonic() - gone

    _assert_archived(inst)
    counts = watch.tally(source_digests(inst.p.source))
    report_heal("bundle deleted under its transfer", "redis", healed, counts,
                since="the deletion (until converged)")
    assert counts == CLEAN, counts
    assert st["operations"]["data_transfer_package"] == {"COMPLETED": 2}, st["operations"]


def test_every_copy_bad_and_the_source_gone_is_the_one_loud_dead_end(installation) -> None:
    inst = installation(extra=SOURCE_DELETION)
    inst.start()
    inst.wait_converged()
    wait_for(lambda: source_files(inst.p.source) == {}, 120, "the source files to be deleted")
    name = package_names(inst.p)[0]
    bad = corrupt_archive_copies(inst.p, name)
    assert inst.verify()[0] == 1

    def blocked() -> list[dict[str, Any]]:
        return [b for b in inst.status()["blocked"] if b["cause"] == "no_good_source"]

    items = wait_for(blocked, 120, "the dead end to be reported")
    assert [b["subject"] for b in items] == [f"package {name}"] and items[0]["exit_code"] == 3, items
    release = items[0]["release"]  # what works: the recorded bytes back under an archive key
    assert all(f"{lta}:raw/{name}.tar" in release for lta in LTAS) and "`packhorse run`" in release, items
    assert "restoring its source files does not help" in release, items
    wait_for(lambda: any(lvl == "CRITICAL" and ev == "no_good_source" and name in subj
                         for lvl, ev, subj, _ in notifications(inst.p)), 60, "the CRITICAL notification")
    time.sleep(3)  # a few more manager cycles: nothing is rebuilt or overwritten
    for lta in LTAS:
        assert (inst.p.location(lta) / f"raw/{name}.tar").read_bytes() == bad[lta]
    assert inst.p.objects("fyst-buffer") == {}
    d = inst.cluster.cli("diagnose", "--package", name)
    assert d.returncode == 1 and "no good source left" in d.stdout, d.stdout
