"""A full listing split over processes (packhorse.managers.scanshards): the shards of any
plan partition the location exactly (every file, skipped entry and folder reported by one
shard, none twice, none lost: I1), their folders merged are the one-process listing's folders
for the scan cache, and a range read of the registrations returns exactly the paths in the
range, in the order Python compares paths (the order the shards are cut by)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from test_scan_cache import make_ctx, write

from packhorse.managers import listing
from packhorse.managers.listing import Shard, registered_files
from packhorse.managers.scanshards import plan_shards, shard_bounds, shard_of
from packhorse.storage.disk import DiskBackend

#: files of a source tree whose depth-2 folders sort around each other ("b!" < "b/" < "b0"),
#: with files at every depth, non-ASCII names, and entries a scan skips
FILES = [
    "top.txt", "a/x.txt", "a/b!x", "a/b/f1", "a/b/c/deep.dat", "a/b!/f2", "a/b0/f3", "a/bb/f4", "a/bb/g/h/i.fits",
    "b/c/f5", "b/d/e/f6", "é/ü/f7", "é/u/f8", "z/only-file",
]


def make_tree(root: Path) -> None:
    for rel in FILES:
        write(root / rel, rel.encode())
    (root / "c" / "d").mkdir(parents=True)  # an empty folder two levels down
    os.symlink("f1", root / "a" / "b" / "link")  # skipped: not followed
    os.mkfifo(root / "a" / "bb" / "pipe")  # skipped: not a regular file
    with open(os.path.join(os.fsencode(root / "b" / "c"), b"bad-\xff"), "wb") as f:  # skipped: not UTF-8
        f.write(b"x")
    os.symlink("a", root / "link-top")  # a symbolic link at the top
    os.symlink("../b", root / "a" / "b1")  # a symbolic link to a folder, two levels down


def walk(root: Path, shard: Shard | None = None) -> tuple[list[str], list[tuple[str, str]], dict, list[str]]:
    found: list = []
    skipped: list[tuple[str, str]] = []
    seen: dict = {}
    unclean: list[str] = []
    listing.walk(DiskBackend("src", root), found, skipped, None, seen, 0, shard=shard,
                      unclean_out=unclean if shard is not None else None)
    return [p for p, _ in found], skipped, seen, unclean


def plans(root: Path) -> list[list[str]]:
    """Every plan of :func:`plan_shards` for 2 to 6 processes, and each folder two levels
    down alone as the one boundary (a cut at every place)."""
    out = [p for n in range(2, 7) if (p := plan_shards(str(root), n)) is not None]
    folders = sorted(f"{a}/{b}/" for a in os.listdir(root) if (root / a).is_dir() and not (root / a).is_symlink()
                     for b in os.listdir(root / a) if (root / a / b).is_dir() and not (root / a / b).is_symlink())
    return out + [[f] for f in folders]


def test_the_shards_of_every_plan_partition_the_listing_exactly(tmp_path: Path) -> None:
    root = tmp_path / "src"
    make_tree(root)
    one_found, one_skipped, one_seen, _ = walk(root)
    assert sorted(one_found) == sorted(FILES)
    assert len(one_skipped) == 5  # the three links, the FIFO, the name that is not UTF-8
    for boundaries in plans(root):
        found: list[str] = []
        skipped: list[tuple[str, str]] = []
        seen: dict = {}
        for i in range(len(boundaries) + 1):
            lo, hi = shard_bounds(boundaries, i)
            f, s, sn, _ = walk(root, Shard(i, lo, hi))
            assert all(shard_of(boundaries, p) == i for p in f), (boundaries, i, f)
            found += f
            skipped += s
            assert not set(sn) & set(seen), "a folder reported by two shards"
            seen.update(sn)
        assert Counter(found) == Counter(one_found), boundaries  # each file once
        assert Counter(skipped) == Counter(one_skipped), boundaries
        assert set(seen) == set(one_seen), boundaries
        for folder, entry in one_seen.items():  # what the scan cache keeps, folder by folder
            assert sorted(seen[folder].subfolders) == sorted(entry.subfolders), (boundaries, folder)
            assert seen[folder].mtime_ns == entry.mtime_ns


def test_a_plan_cuts_between_folders_two_levels_down_and_leaves_out_what_it_cannot_use(tmp_path: Path) -> None:
    root = tmp_path / "src"
    make_tree(root)
    (root / "_packhorse" / "sub").mkdir(parents=True)  # packhorse's own folder: never a boundary
    boundaries = plan_shards(str(root), 3)
    assert boundaries is not None and len(boundaries) == 2 and boundaries == sorted(boundaries)
    assert all(b.count("/") == 2 and b.endswith("/") and not b.startswith("_packhorse") for b in boundaries)
    assert plan_shards(str(root), 1) is None  # one process: no plan
    flat = tmp_path / "flat"
    write(flat / "a" / "only", b"1")
    assert plan_shards(str(flat), 2) is None  # fewer than two folders to cut between
    assert plan_shards(str(tmp_path / "gone"), 2) is None  # the one-process scan reports the missing root


PATHS = ["A/x", "a/B/f", "a/b!", "a/b!/f", "a/b/f", "a/b/g/h", "a/b0/f", "a/bb/f", "a/z/f", "a/É/f", "a/é/f",
         "é/ü/f", "z/z/z"]


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = make_ctx(tmp_path / "site", settle_seconds=0)
    yield c
    c.db.dispose()


def insert_registrations(db, location_id: int, paths: list[str]) -> None:  # type: ignore[no-untyped-def]
    from packhorse.db.models import RawDataFile

    def add(s):  # type: ignore[no-untyped-def]
        for i, p in enumerate(paths):
            s.add(RawDataFile(location_id=location_id, relative_path=p, group_path=p.rpartition("/")[0], size=i,
                              sha256="0" * 64, mtime_ns=1000 + i))

    db.transact(add)


def check_ranges(db, location_id: int) -> None:  # type: ignore[no-untyped-def]
    """Every range cut at a registered path or a folder boundary holds exactly the paths
    Python puts in it."""
    cuts = sorted({*PATHS, *(p.rsplit("/", 1)[0] + "/" for p in PATHS)})
    for lo in ["", *cuts]:
        for hi in [None, *[c for c in cuts if c > lo]]:
            got = db.read(lambda s: registered_files(s.connection(), location_id, lo=lo, hi=hi))
            want = {p for p in PATHS if lo <= p and (hi is None or p < hi)}
            assert set(got) == want, (lo, hi)
    everything = db.read(lambda s: registered_files(s.connection(), location_id))
    assert everything == {p: (i, 1000 + i) for i, p in enumerate(PATHS)}


def test_a_range_of_registrations_is_the_paths_python_puts_in_it_sqlite(ctx) -> None:  # type: ignore[no-untyped-def]
    loc = ctx.topology.location_ids["fyst-source"]
    insert_registrations(ctx.db, loc, PATHS)
    check_ranges(ctx.db, loc)
