"""End-to-end: the source audit. A file rewritten in place after it was archived, its size and
mtime put back (``touch -r``): the scan cannot see it; ``packhorse verify --location SOURCE``
re-hashes the files still at the source and registers the new bytes as a new version (archived
by the next run), lists files gone (not an error), and ``status`` / ``locate`` say so; with
``source_audit_interval_seconds`` the run does it by itself. Real processes, real files; the
archives judged by GNU tar and the reference ``bagit`` library."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from e2e_helpers import LTAS

OLD = 1_700_000_000


def write(root: Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.utime(p, (OLD, OLD))


def rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """An in-place edit followed by ``touch -r``: other bytes, the same size and mtime."""
    st = os.stat(path)
    assert len(data) == st.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def unit(source: Path) -> None:
    write(source, "cam/obs1/a.dat", b"a" * 1000)
    write(source, "cam/obs1/b.dat", b"b" * 2000)
    write(source, "cam/obs1/c.dat", b"c" * 3000)


def locate(p, query: str) -> dict:
    r = p.cli("locate", query, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def archived_payloads(p, name: str) -> dict[str, dict[str, str]]:
    """``{lta: payload}`` of package tar ``raw/<name>.tar`` in every archive."""
    return {lta: b.payload for lta in LTAS for b in p.bags(lta) if b.key == f"raw/{name}.tar"}


def with_source_audit(config: Path, interval: float) -> None:
    text = config.read_text()
    marker = 'role = "source"\n'
    assert text.count(marker) == 1
    config.write_text(text.replace(marker, marker + f"source_audit_interval_seconds = {interval}\n"
                                   "fixity_bytes_per_second = 10000000\n"))


def test_verify_source_registers_content_changed_behind_size_and_mtime_as_a_new_version(pipeline) -> None:
    p = pipeline()
    unit(p.source)
    p.init()
    p.run()
    new = b"B" * 2000
    rewrite_keeping_size_and_mtime(p.source / "cam/obs1/b.dat", new)
    (p.source / "cam/obs1/c.dat").unlink()  # deleted on purpose: reported, not an error
    p.run()  # the scan cannot see it
    assert [v["version"] for v in locate(p, "cam/obs1/b.dat")["versions"]] == [1]

    r = p.cli("verify", "--location", "fyst-source", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    audit = json.loads(r.stdout)["source_audit"]
    assert audit["checked"] == 2 and audit["bytes_checked"] == 3000 and audit["completed"]
    assert [(c["path"], c["version"], c["action"]) for c in audit["changed"]] == [("cam/obs1/b.dat", 2, "version")]
    assert audit["changed"][0]["sha256"] == hashlib.sha256(new).hexdigest()
    assert audit["gone"] == ["cam/obs1/c.dat"] and audit["unavailable"] is None

    v1, v2 = locate(p, "cam/obs1/b.dat")["versions"]
    assert (v1["package"], v1["found_by"]) == ("cam/obs1", None)
    assert (v2["version"], v2["found_by"], v2["package"]) == (2, "source_audit", None)
    assert "unchanged size and mtime" in v2["why"]
    text = p.cli("locate", "cam/obs1/b.dat")
    assert "version 2 of fyst-source:cam/obs1/b.dat: content changed behind an unchanged size and mtime" \
        in text.stdout

    status = p.status()
    a = status["source_audits"]["fyst-source"]
    assert (a["files_checked"], a["changed"], a["gone"], a["changed_total"]) == (2, 1, 1, 1)
    assert a["completed_at"] is not None
    assert "source audit fyst-source: last pass completed" in p.cli("status").stdout

    # the next run archives the new version; the first stays as it was, written once
    p.run()
    v2 = locate(p, "cam/obs1/b.dat")["versions"][1]
    assert v2["package"] == "cam/obs1+v2"
    payloads = archived_payloads(p, "cam/obs1+v2")
    assert set(payloads) == set(LTAS)
    for payload in payloads.values():
        assert payload == {"cam/obs1/b.dat": hashlib.sha256(new).hexdigest()}
    for payload in archived_payloads(p, "cam/obs1").values():
        assert payload["cam/obs1/b.dat"] == hashlib.sha256(b"b" * 2000).hexdigest()

    # a second pass finds nothing new
    again = json.loads(p.cli("verify", "--location", "fyst-source", "--json").stdout)["source_audit"]
    assert again["changed"] == [] and again["checked"] == 2


def test_verify_source_text_and_an_unavailable_source(pipeline) -> None:
    p = pipeline()
    unit(p.source)
    p.init()
    p.run()
    rewrite_keeping_size_and_mtime(p.source / "cam/obs1/a.dat", b"A" * 1000)
    r = p.cli("verify", "--location", "fyst-source")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "source fyst-source: checked 3 files (6,000 bytes), changed 1, gone 0" in r.stdout
    assert "CHANGED fyst-source:cam/obs1/a.dat: other bytes behind the same size and mtime" in r.stdout
    (p.source / "_packhorse" / "location.json").unlink()  # an empty mount point looks like this
    r = p.cli("verify", "--location", "fyst-source", "--json")
    assert r.returncode == 1  # could not be checked: as verify says of any location
    assert json.loads(r.stdout)["source_audit"]["unavailable"]


def test_verify_without_a_location_names_the_sources_it_did_not_audit_and_how(pipeline) -> None:
    """``packhorse verify`` alone re-reads the archive and buffer copies; the source files are a
    pass of their own. It said nothing about them, so an operator took "checked 2, ok 2" for
    the sources too: now every source location is named, with its last pass and the command."""
    p = pipeline()
    unit(p.source)
    p.init()
    p.run()
    r = p.cli("verify")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("SOURCE fyst-source: its files are not re-hashed by this verify (never audited; no scheduled "
            "audit (source_audit_interval_seconds)); `packhorse verify --location fyst-source` audits them") \
        in r.stdout, r.stdout
    assert json.loads(p.cli("verify", "--json").stdout)["sources_not_audited"] == [
        {"location": "fyst-source", "last_completed_at": None, "interval_seconds": None}]
    assert p.cli("verify", "--location", "fyst-source").returncode == 0
    after = json.loads(p.cli("verify", "--json").stdout)["sources_not_audited"]
    assert after[0]["last_completed_at"] is not None
    shown = after[0]["last_completed_at"].replace("T", " ")[:19]  # the text surfaces' one time format
    assert f"(last audit pass completed {shown} UTC;" in p.cli("verify").stdout


def test_the_run_audits_sources_on_their_cadence(pipeline) -> None:
    p = pipeline()
    with_source_audit(p.config, 0.1)
    unit(p.source)
    p.init()
    p.run()
    assert p.status()["source_audits"]["fyst-source"]["completed_at"] is not None
    new = b"C" * 3000
    rewrite_keeping_size_and_mtime(p.source / "cam/obs1/c.dat", new)
    p.run()  # no verify: the run's own audit finds it, and the run archives it
    versions = locate(p, "cam/obs1/c.dat")["versions"]
    assert [(v["version"], v["found_by"], v["package"]) for v in versions] == [
        (1, None, "cam/obs1"), (2, "source_audit", "cam/obs1+v2")]
    for payload in archived_payloads(p, "cam/obs1+v2").values():
        assert payload == {"cam/obs1/c.dat": hashlib.sha256(new).hexdigest()}
    assert p.status()["source_audits"]["fyst-source"]["changed_total"] == 1
