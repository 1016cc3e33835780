"""End-to-end: files that change. A file modified (or still growing with ``settle_seconds = 0``)
between its registration and its packaging, a file that vanishes before packaging, and a
file modified after it was archived — each followed by a plain ``packhorse run --until-idle``
(no reset, no SQL, no configuration change). Judged by the archives' bytes (GNU tar, the
reference ``bagit`` library), ``status`` / ``locate`` JSON, the notification outbox and exit codes.

The window between registration and packaging is hit deterministically by the test-side
fault hooks (``tests/fault_hooks.py``): at ``raw_data_package.sources`` (just before the
package stage looks at its source files) a hook appends to, rewrites or removes a source file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from e2e_helpers import LTAS, assert_archived_everywhere, assert_clean_finish, sha256_file, source_files

OLD = 1_700_000_000


def write(root: Path, rel: str, data: bytes, mtime: int = OLD) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, (mtime, mtime))


def _unit(source: Path) -> None:
    write(source, "cam/obs1/a.dat", b"a" * 1000)
    write(source, "cam/obs1/b.dat", b"b" * 2000)
    write(source, "cam/obs1/c.dat", b"c" * 3000)


def _run_with(p, faults: list[dict]) -> None:
    r = p.cli("run", "--until-idle", "--quiet", env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    assert r.returncode == 0, f"run exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-6000:]}"


def _payloads(p, lta: str) -> dict[str, dict[str, str]]:
    return {b.key: b.payload for b in p.bags(lta)}


def _locate(p, query: str) -> dict:
    r = p.cli("locate", query, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _notifications(p, event: str) -> list[tuple[str, str]]:
    with sqlite3.connect(p.root / "packhorse.db") as db:
        return db.execute("SELECT subject, body FROM notification_outbox WHERE event = ?", (event,)).fetchall()


@pytest.mark.parametrize("change", ["append", "rewrite"])
def test_a_file_changed_before_packaging_is_registered_again_and_its_siblings_are_archived(pipeline, tmp_path, change):
    # append: the file grows (its size differs: found by the stat before the build); rewrite:
    # the same size, other bytes (found by the hash while the tar is built)
    p = pipeline(settle_seconds=0)
    _unit(p.source)
    target = p.source / "cam/obs1/b.dat"
    marker = tmp_path / "changed"
    if change == "append":
        fault = {"point": "raw_data_package.sources", "action": "append", "path": str(target),
                 "data": "late bytes", "marker": str(marker), "unless_exists": str(marker)}
    else:
        fault = {"point": "raw_data_package.sources", "action": "rewrite", "path": str(target),
                 "marker": str(marker), "unless_exists": str(marker)}
    p.init()
    _run_with(p, [fault])
    assert marker.exists(), "the fault hook never fired"
    expected = source_files(p.source)
    assert expected["cam/obs1/b.dat"][0] != sha256_file(p.source / "cam/obs1/a.dat")

    # every file's current content is archived and verified, once, in every archive
    assert_archived_everywhere(p, expected)
    status = p.status()
    assert_clean_finish(status)
    for lta in LTAS:
        assert _payloads(p, lta).keys() == {"raw/cam/obs1.tar", "raw/cam/obs1+2.tar"}
        assert set(_payloads(p, lta)["raw/cam/obs1.tar"]) == {"cam/obs1/a.dat", "cam/obs1/c.dat"}
        assert set(_payloads(p, lta)["raw/cam/obs1+2.tar"]) == {"cam/obs1/b.dat"}
    code, report = p.verify()
    assert code == 0 and not report["corrupt"] and not report["missing"], report

    # locate tells the story: the registration taken out, then the one archived
    found = _locate(p, "cam/obs1/b.dat")
    withdrawn = [v for v in found["versions"] if v["withdrawn"]]
    archived = [v for v in found["versions"] if not v["withdrawn"]]
    assert len(withdrawn) == 1 and "taken out of package cam/obs1" in withdrawn[0]["withdrawn"], found["versions"]
    assert [(v["package"], v["sha256"]) for v in archived] == [("cam/obs1+2", expected["cam/obs1/b.dat"][0])]


def test_a_file_modified_after_archiving_is_archived_as_a_second_version_and_the_first_stays(pipeline):
    p = pipeline(settle_seconds=0)
    _unit(p.source)
    p.init()
    p.run()
    before = {lta: p.snapshot(lta) for lta in LTAS}
    first_sha = sha256_file(p.source / "cam/obs1/b.dat")

    write(p.source, "cam/obs1/b.dat", b"B" * 2500, mtime=OLD + 100)  # the instrument rewrites it
    p.run()
    status = p.status()
    assert_clean_finish(status)
    new_sha = sha256_file(p.source / "cam/obs1/b.dat")
    for lta in LTAS:
        now = p.snapshot(lta)
        assert {k: now[k] for k in before[lta]} == before[lta], f"{lta}: an archived object changed (I2)"
        assert set(now) - set(before[lta]) == {"raw/cam/obs1+v2.tar"}
        bags = {b.key: b for b in p.bags(lta)}
        v2 = bags["raw/cam/obs1+v2.tar"]
        assert v2.payload == {"cam/obs1/b.dat": new_sha}
        assert v2.info["Packhorse-Version"] == "2" and v2.info["External-Identifier"] == "cam/obs1+v2"
        assert bags["raw/cam/obs1.tar"].payload["cam/obs1/b.dat"] == first_sha
        assert "Packhorse-Version" not in bags["raw/cam/obs1.tar"].info

    found = _locate(p, "cam/obs1/b.dat")
    assert [(v["version"], v["package"], v["sha256"]) for v in found["versions"]] == [
        (1, "cam/obs1", first_sha), (2, "cam/obs1+v2", new_sha)]
    by_name = {pk["name"]: pk for pk in found["packages"]}
    assert by_name["cam/obs1+v2"]["version"] == 2 and by_name["cam/obs1"]["version"] == 1
    for pk in by_name.values():
        assert {c["location"] for c in pk["copies"] if c["status"] == "present"} == set(LTAS), pk["copies"]
    text = p.cli("locate", "cam/obs1/b.dat")
    assert text.returncode == 0 and "cam/obs1+v2" in text.stdout

    # the same bytes with a new mtime (a touch) are no new version
    os.utime(p.source / "cam/obs1/b.dat", (OLD + 200, OLD + 200))
    p.run()
    assert p.status()["packages"]["total"] == 2
    assert len(_locate(p, "cam/obs1/b.dat")["versions"]) == 2


def _dry_run(p) -> dict:
    r = p.cli("run", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_dry_run_predicts_no_new_version_for_a_touched_file_and_one_for_new_bytes(pipeline):
    # the dry run decides as the scan does: a registered file whose mtime differs is hashed
    # (read-only) and is a new version only if its bytes differ from its registration
    p = pipeline(settle_seconds=0)
    _unit(p.source)
    p.init()
    p.run()
    assert _dry_run(p)["totals"]["files"] == 0

    os.utime(p.source / "cam/obs1/b.dat", (OLD + 100, OLD + 100))  # a touch: same bytes, new mtime
    for _ in range(2):  # before the real run and after it (which registers nothing)
        plan = _dry_run(p)
        assert plan["register"] == [{"location": "fyst-source", "files": 0, "bytes": 0, "settling": 0,
                                     "skipped": []}], plan["register"]
        assert plan["package"] == [] and plan["totals"]["packages"] == 0, plan["package"]
        assert plan["totals"]["archive_copies"] == 0 and plan["totals"]["shipments"] == 0, plan["totals"]
        p.run()
        assert p.status()["packages"]["total"] == 1
        assert len(_locate(p, "cam/obs1/b.dat")["versions"]) == 1
    text = p.cli("run", "--dry-run")
    assert text.returncode == 0 and "would register fyst-source: 0 file(s)" in text.stdout, text.stdout
    assert "to register, 0 package(s)" in text.stdout and " 0 archive copies" in text.stdout, text.stdout

    # new bytes of the same size (only the hash can tell): version 2 is predicted, and made
    write(p.source, "cam/obs1/b.dat", b"B" * 2000, mtime=OLD + 200)
    plan = _dry_run(p)
    assert plan["register"][0]["files"] == 1 and plan["register"][0]["bytes"] == 2000, plan["register"]
    assert [(x["name"], x["files"], x["bytes"]) for x in plan["package"]] == [("cam/obs1+v2", 1, 2000)]
    assert plan["totals"]["archive_copies"] == len(LTAS), plan["totals"]
    p.run()
    assert p.status()["packages"]["total"] == 2
    assert [v["version"] for v in _locate(p, "cam/obs1/b.dat")["versions"]] == [1, 2]
    plan = _dry_run(p)
    assert plan["totals"]["files"] == 0 and plan["package"] == [], plan


def test_a_file_gone_before_packaging_is_recorded_with_a_reason_and_a_notification(pipeline, tmp_path):
    p = pipeline(settle_seconds=0)
    _unit(p.source)
    write(p.source, "cam/obs2/only.dat", b"the only file of its unit")
    gone, alone = tmp_path / "gone", tmp_path / "alone"
    faults = [{"point": "raw_data_package.sources", "action": "remove", "path": str(p.source / "cam/obs1/b.dat"),
               "marker": str(gone), "unless_exists": str(gone)},
              {"point": "raw_data_package.sources", "action": "remove", "path": str(p.source / "cam/obs2/only.dat"),
               "marker": str(alone), "unless_exists": str(alone)}]
    p.init()
    _run_with(p, faults)
    assert gone.exists() and alone.exists()

    assert_archived_everywhere(p, source_files(p.source))  # the siblings, each once, in every archive
    status = p.status()
    assert_clean_finish(status, skipped=2)
    reasons = {s["path"]: s["reason"] for s in status["skipped"]}
    assert "gone from the source before it was packaged" in reasons["cam/obs1/b.dat"]
    assert "gone from the source before it was packaged" in reasons["cam/obs2/only.dat"]
    assert status["packages"]["total"] == 1  # the unit left with no file was dropped, not failed
    sent = _notifications(p, "source_files_vanished")
    assert len(sent) == 2 and any("cam/obs1/b.dat" in body for _, body in sent), sent
    assert all(s.startswith("Source file(s) gone before packaging") for s, _ in sent)
    text = p.cli("status", "--skipped")
    assert text.returncode == 0 and "cam/obs1/b.dat" in text.stdout

    # it comes back: registered and archived, no longer listed
    write(p.source, "cam/obs1/b.dat", b"b" * 2000)
    write(p.source, "cam/obs2/only.dat", b"the only file of its unit")
    p.run()
    assert_archived_everywhere(p, source_files(p.source))
    assert_clean_finish(p.status())


def test_a_file_gone_for_good_is_forgotten_by_an_operator_and_no_longer_listed(pipeline, tmp_path):
    """A source file deleted on purpose before it was packaged stays listed as skipped (it is
    not archived, I1) until an operator says it is gone for good: ``packhorse skipped forget``
    takes it off the list, keeps who, when and why, and refuses what is not such a file."""
    p = pipeline(settle_seconds=0)
    _unit(p.source)
    (p.source / "cam/obs1/link.dat").symlink_to("/etc/hostname")  # skipped while it is a link
    gone = tmp_path / "gone"
    faults = [{"point": "raw_data_package.sources", "action": "remove", "path": str(p.source / "cam/obs1/b.dat"),
               "marker": str(gone), "unless_exists": str(gone)}]
    p.init()
    _run_with(p, faults)
    assert sorted(s["path"] for s in p.status()["skipped"]) == ["cam/obs1/b.dat", "cam/obs1/link.dat"]

    # refused: no reason, a blank one; a path that is not skipped; a link (listed while it is one)
    assert p.cli("skipped", "forget", "cam/obs1/b.dat").returncode == 2
    assert p.cli("skipped", "forget", "cam/obs1/b.dat", "--reason", "  ").returncode == 2
    nothing = p.cli("skipped", "forget", "cam/obs1/a.dat", "--reason", "x")
    assert nothing.returncode == 1 and "no source file gone before it was packaged is listed" in nothing.stderr
    link = p.cli("skipped", "forget", "cam/obs1/link.dat", "--reason", "x")
    assert link.returncode == 1 and "is skipped (" in link.stderr and "exclude" in link.stderr, link.stderr

    done = p.cli("skipped", "forget", "fyst-source:cam/obs1/b.dat", "--reason", "deleted at the telescope", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["forgotten"] == [
        {"location": "fyst-source", "path": "cam/obs1/b.dat",
         "reason": "gone from the source before it was packaged (taken out of package cam/obs1)"}]
    assert [s["path"] for s in p.status()["skipped"]] == ["cam/obs1/link.dat"]
    listed = p.cli("skipped", "list", "--json")
    assert [s["path"] for s in json.loads(listed.stdout)] == ["cam/obs1/link.dat"]
    (p.source / "cam/obs1/link.dat").unlink()
    r = p.cli("run", "--until-idle", "--quiet")
    assert r.returncode == 0 and "skipped" not in r.stderr, r.stderr  # nothing left to count
    [withdrawn] = [v for v in _locate(p, "cam/obs1/b.dat")["versions"] if v["withdrawn"]]
    assert "forgotten at" in withdrawn["withdrawn"] and "deleted at the telescope" in withdrawn["withdrawn"]
    audit = json.loads(p.cli("audit", "--json").stdout)
    assert [(a["action"], a["result"]) for a in audit if a["action"] == "file.forget"] == [
        ("file.forget", "ok"), ("file.forget", "refused"), ("file.forget", "refused")]
    # the audit's text: one line per entry, whatever a path holds, and the reason given
    forged = p.cli("skipped", "forget", "x\n2026-01-01T00:00:00+00:00 cli:alice operation.reset transfer/7 ok",
                   "--reason", "y")
    assert forged.returncode == 1
    text = p.cli("audit").stdout.splitlines()
    assert not any(line.startswith("2026-01-01") for line in text), text
    assert any("file.forget" in line and "(reason: deleted at the telescope)" in line for line in text), text

    # it comes back after all: archived as ever
    write(p.source, "cam/obs1/b.dat", b"b" * 2000)
    p.run()
    assert_archived_everywhere(p, source_files(p.source))
    assert_clean_finish(p.status())
