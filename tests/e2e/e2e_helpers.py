"""End-to-end helpers: a three-site packhorse installation in a temp folder, driven through
real ``packhorse`` subprocesses, and checks of what actually landed in the archives.

``pipeline(**config_overrides)`` writes the config of ``tests/conftest.py`` (fyst → cologne,
cornell) and returns a :class:`Pipeline`. Archive checks never trust packhorse: every
archived tar is extracted with GNU tar, every bag is validated with the reference ``bagit``
library, and payload bytes are compared by sha256 with the source files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat as st
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import bagit

from packhorse.bags.validation import validate_folder, validate_path

LTAS = ("cologne-lta", "cornell-lta")
BUFFERS = ("fyst-buffer", "cologne-buffer", "cornell-buffer")
PARTIAL_SUFFIX = ".packhorse-partial"
#: the identity marker every location root carries (packhorse.storage.identity.MARKER_KEY)
MARKER_KEY = "_packhorse/location.json"
#: Where repairs move bad objects (``StorageBackend.quarantine``), never overwriting them.
QUARANTINE_PREFIX = "_packhorse/quarantine/"


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass
class Bag:
    """One archived package tar, extracted and validated."""

    key: str                    # object key in the archive, e.g. raw/chai/obs_1.tar
    root: Path                  # the extracted bag folder
    info: dict[str, Any]        # bag-info.txt
    payload: dict[str, str]     # path under data/ -> sha256 of the extracted bytes


class Pipeline:
    """A packhorse installation under ``root`` (the folder holding ``packhorse.toml``)."""

    def __init__(self, config: Path, cli: Callable[..., subprocess.CompletedProcess[str]], scratch: Path) -> None:
        self.config = config
        self.root = config.parent
        self.source = self.root / "source"
        self._cli = cli
        self._scratch = scratch
        self._n = 0

    # -- running packhorse -------------------------------------------------------------
    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``packhorse <args> -c <config>`` in a subprocess, from the installation folder."""
        return self._cli(*args, "-c", str(self.config), env=env, cwd=self.root)

    def init(self, *, adopt: tuple[str, ...] = ()) -> None:
        """``packhorse init``; ``adopt``: locations whose roots an earlier installation (a lost
        ops database) marked, taken over with ``--adopt``."""
        r = self.cli("init", *(a for name in adopt for a in ("--adopt", name)))
        assert r.returncode == 0, f"packhorse init exited {r.returncode}\n{r.stderr}"

    def run(self, expect: int | None = 0) -> subprocess.CompletedProcess[str]:
        r = self.cli("run", "--until-idle", "--quiet")
        if expect is not None:
            assert r.returncode == expect, (f"packhorse run exited {r.returncode}, expected {expect}\n"
                                            f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-6000:]}")
        return r

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def verify(self) -> tuple[int, dict[str, Any]]:
        r = self.cli("verify", "--json")
        return r.returncode, json.loads(r.stdout)

    # -- locations -----------------------------------------------------------------------
    def location(self, name: str) -> Path:
        site, role = name.split("-")
        return self.root / "sites" / site / ("archive" if role == "lta" else "buffer")

    def objects(self, location: str) -> dict[str, Path]:
        """Every file under a location's folder, by key (partial writes included; the
        location's identity marker ``_packhorse/location.json`` left out, and so are the
        markers of earlier installations ``init --adopt`` kept in the quarantine)."""
        root = self.location(location)
        out = {}
        old_markers = f"_packhorse/quarantine/{MARKER_KEY}."
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                p = Path(dirpath) / name
                key = p.relative_to(root).as_posix()
                if key != MARKER_KEY and not key.startswith(old_markers):
                    out[key] = p
        return out

    def snapshot(self, location: str) -> dict[str, tuple[int, int, int, str]]:
        """``{key: (inode, mtime_ns, size, sha256)}`` of every file in a location."""
        out = {}
        for key, p in self.objects(location).items():
            s = os.lstat(p)
            out[key] = (s.st_ino, s.st_mtime_ns, s.st_size, sha256_file(p))
        return out

    # -- what is in an archive -----------------------------------------------------------
    def bags(self, location: str) -> list[Bag]:
        """Extract every tar of ``location`` with GNU tar and validate each bag with ``bagit``, and
        with packhorse's validator as a tar and as the extracted folder."""
        objects = self.objects(location)
        partials = [k for k in objects if k.endswith(PARTIAL_SUFFIX)]
        assert not partials, f"{location}: partial writes left behind: {partials}"
        bags = []
        for key, path in sorted(objects.items()):
            if key.startswith(QUARANTINE_PREFIX):
                continue  # bad objects moved aside by a repair (checked by the tests that make them)
            assert key.startswith("raw/") and key.endswith(".tar"), f"{location}: unexpected object {key!r}"
            self._n += 1
            dest = self._scratch / f"x{self._n}"
            dest.mkdir(parents=True)
            r = subprocess.run(["tar", "xf", str(path), "-C", str(dest)], capture_output=True, text=True)
            assert r.returncode == 0, f"GNU tar could not extract {location}:{key}: {r.stderr}"
            tops = list(dest.iterdir())
            assert len(tops) == 1 and tops[0].is_dir(), f"{location}:{key}: expected one bag folder, got {tops}"
            for report in (validate_path(path), validate_folder(tops[0])):  # packhorse's own validator, both forms
                assert report.valid, f"{location}:{key}: bag does not validate with packhorse: {report.summary()}"
            bag = bagit.Bag(str(tops[0]))
            try:
                bag.validate()
            except bagit.BagValidationError as e:
                details = "; ".join(str(d) for d in e.details) if e.details else ""
                raise AssertionError(f"{location}:{key}: bag does not validate with bagit: {e} {details}") from None
            payload = {}
            data = tops[0] / "data"
            for dirpath, _dirs, files in os.walk(data):
                for name in files:
                    p = Path(dirpath) / name
                    payload[p.relative_to(data).as_posix()] = sha256_file(p)
            bags.append(Bag(key, tops[0], dict(bag.info), payload))
        return bags


def source_files(root: Path) -> dict[str, tuple[str, int]]:
    """``{relative path: (sha256, mtime in whole seconds)}`` of every archivable source file:
    regular files (symlinks not followed) whose path is valid UTF-8, packhorse's own folder
    ``_packhorse/`` (the identity marker) left out."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        if Path(dirpath) == Path(root) and "_packhorse" in dirs:
            dirs.remove("_packhorse")
        for name in dirs + files:
            p = Path(dirpath) / name
            s = os.lstat(p)
            if not st.S_ISREG(s.st_mode):
                continue
            rel = p.relative_to(root).as_posix()
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                continue
            out[rel] = (sha256_file(p), int(s.st_mtime))
    return out


def assert_archived_everywhere(p: Pipeline, expected: dict[str, tuple[str, int]]) -> dict[str, list[Bag]]:
    """Every expected file is in exactly one bag per archive, with the same bytes (and mtime);
    nothing else is archived; each bag names its package and sits at ``raw/<package>.tar``."""
    out = {}
    for lta in LTAS:
        bags = p.bags(lta)
        assert bags, f"{lta}: nothing archived"
        where: dict[str, list[Bag]] = {}
        for b in bags:
            name = b.info.get("External-Identifier")
            assert b.key == f"raw/{name}.tar", f"{lta}: bag {b.key} says it is package {name!r}"
            for rel in b.payload:
                where.setdefault(rel, []).append(b)
        missing = sorted(set(expected) - set(where))
        assert not missing, f"{lta}: {len(missing)} source file(s) not archived, e.g. {missing[:5]}"
        extra = sorted(set(where) - set(expected))
        assert not extra, f"{lta}: archived files that are not source files: {extra[:5]}"
        for rel, (sha, mtime) in expected.items():
            hits = where[rel]
            assert len(hits) == 1, f"{lta}: {rel!r} is in {len(hits)} bags: {[b.key for b in hits]}"
            assert hits[0].payload[rel] == sha, f"{lta}: {rel!r} in {hits[0].key} has other bytes than the source"
            extracted = hits[0].root / "data" / rel
            assert int(os.stat(extracted).st_mtime) == mtime, f"{lta}: {rel!r} lost its modification time"
        out[lta] = bags
    return out


def assert_clean_finish(status: dict[str, Any], *, skipped: int = 0) -> None:
    """Every package archived, nothing failed, buffers freed."""
    pk = status["packages"]
    assert pk["total"] > 0 and pk["archived"] == pk["total"] and pk["failed"] == 0, pk
    assert status["failed_operations"] == [], status["failed_operations"]
    assert status["files"]["unpackaged"] == 0, status["files"]
    for buf in BUFFERS:
        assert status["copies"][buf]["count"] == 0, f"{buf} still holds copies: {status['copies'][buf]}"
    for lta in LTAS:
        assert status["copies"][lta]["count"] == pk["total"], (lta, status["copies"][lta], pk)
    assert len(status["skipped"]) == skipped, status["skipped"]
    for kind, counts in status["operations"].items():
        assert set(counts) <= {"COMPLETED"}, f"{kind}: {counts}"


def copy_stdlib_subset(dest: Path, packages: tuple[str, ...] = ("email", "json", "xml", "concurrent")) -> None:
    """Copy some packages of the running Python's standard library (no ``__pycache__``)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for pkg in packages:
        shutil.copytree(stdlib / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                        symlinks=True)
