"""Files that change, in distributed mode: PostgreSQL (migration 0009 on it), a Celery worker
per site with Redis, a manager and a monitor as their own processes. A file grows between its
registration and its packaging (``settle_seconds = 0``, hit by the fault hooks on the fyst
worker), and later a file is rewritten after it was archived: every source file's current
content ends archived and verified in both archives, the first version stays byte-identical,
and the second version is a package of its own (``<unit>+v2``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e_helpers import LTAS, Pipeline, assert_archived_everywhere, assert_clean_finish, sha256_file, source_files

from distributed_support import Cluster, postgres_database, redis_url

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _write(root: Path, rel: str, data: bytes, mtime: int = 1_700_000_000) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, (mtime, mtime))


def test_changed_files_on_postgres_with_a_worker_per_site(site_config, cli, tmp_path: Path) -> None:
    db_url, drop = postgres_database()
    config = site_config(bundle_max_wait_seconds=1, poll_interval_seconds=0.5, settle_seconds=0)
    source = config.parent / "source"
    for unit in ("obs1", "obs2"):
        for name in ("a.dat", "b.dat", "c.dat"):
            _write(source, f"cam/{unit}/{name}", os.urandom(4096))
    marker = tmp_path / "grown"
    faults = [{"point": "raw_data_package.sources", "action": "append", "path": str(source / "cam/obs1/b.dat"),
               "data": "still being written", "marker": str(marker), "unless_exists": str(marker)}]
    cluster = Cluster(config, db_url, redis_url(), env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    p = Pipeline(config, cli, tmp_path / "extracted")
    try:
        cluster.init()
        cluster.start_all(monitor=True)
        # cam/obs1 without b.dat, cam/obs1+2 with its grown bytes, cam/obs2
        st = cluster.wait_finished(240, packages=3)
        assert marker.exists(), "the fault hook never fired"
        assert_clean_finish(st)
        p_env = {"PACKHORSE_DATABASE__URL": db_url}
        first = {lta: p.snapshot(lta) for lta in LTAS}
        assert_archived_everywhere(p, source_files(source))

        _write(source, "cam/obs2/c.dat", b"rewritten after it was archived", mtime=1_700_000_500)
        st = cluster.wait_finished(240, packages=4)
        assert_clean_finish(st)
    finally:
        cluster.stop_all()
    try:
        for lta in LTAS:
            now = p.snapshot(lta)
            assert {k: now[k] for k in first[lta]} == first[lta], f"{lta}: an archived object changed (I2)"
            assert set(now) - set(first[lta]) == {"raw/cam/obs2+v2.tar"}
            bags = {b.key: b for b in p.bags(lta)}
            assert set(bags["raw/cam/obs1.tar"].payload) == {"cam/obs1/a.dat", "cam/obs1/c.dat"}
            assert bags["raw/cam/obs1+2.tar"].payload == {"cam/obs1/b.dat": sha256_file(source / "cam/obs1/b.dat")}
            assert bags["raw/cam/obs2+v2.tar"].payload == {"cam/obs2/c.dat": sha256_file(source / "cam/obs2/c.dat")}
            assert bags["raw/cam/obs2+v2.tar"].info["Packhorse-Version"] == "2"
        r = p.cli("locate", "cam/obs2/c.dat", "--json", env=p_env)
        assert r.returncode == 0, r.stderr
        assert [(v["version"], v["package"]) for v in json.loads(r.stdout)["versions"]] == [
            (1, "cam/obs2"), (2, "cam/obs2+v2")]
    finally:
        drop()
