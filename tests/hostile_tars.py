"""Test support (importable as ``hostile_tars``): hostile tar archives, the extraction paths
they are fed to, and a snapshot of a folder tree to prove nothing outside a target changed.

The paths are every way packhorse turns a tar read from storage into files or objects:

- ``extract``: :func:`packhorse.bags.extraction.extract_tar`, the extraction routine itself;
- ``staging``: :func:`packhorse.stages.staging.extract_archive_copy` (check pass, then
  extraction) from an archive copy whose sha256 is the package's (the package is hostile);
- ``unpack-package``: :func:`packhorse.stages.unpack.unpack_bundle` of a well-formed bundle
  carrying the hostile tar as a raw data package, published into a disk buffer;
- ``unpack-bundle``: the same with the hostile tar as the bundle itself.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from packhorse.bags.extraction import ExtractionLimits, extract_tar
from packhorse.bags.packaging import PayloadFile, write_bag_tar
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages.staging import ArchiveCopy, extract_archive_copy
from packhorse.stages.unpack import unpack_bundle
from packhorse.storage.disk import DiskBackend

MTIME = 1_700_000_000
Member = tuple[tarfile.TarInfo, bytes | None]


def reg(name: str, data: bytes = b"x") -> Member:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), MTIME
    return ti, data


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    """A member of type ``kind`` (``tarfile.SYMTYPE``, ``LNKTYPE``, ``DIRTYPE``, ``CHRTYPE``,
    ``BLKTYPE``, ``FIFOTYPE``) without data."""
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mtime = kind, linkname, MTIME
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, None


def tar_of(members: list[Member]) -> bytes:
    """A PAX tar of ``members``, in that order (duplicates and all)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def good_bag_members(bag_dir: str = "pkg", payload: dict[str, bytes] | None = None) -> list[Member]:
    """The members of a well-formed packhorse bag tar."""
    payload = payload if payload is not None else {"a.txt": b"alpha", "dir/b.txt": b"beta"}
    files = [PayloadFile(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest(), mtime=MTIME,
                         open=(lambda d=d: io.BytesIO(d))) for p, d in payload.items()]
    out = io.BytesIO()
    write_bag_tar(out, bag_dir=bag_dir, files=files, bag_info={}, bagging_date="2024-05-06",
                  external_identifier=bag_dir, tag_mtime=MTIME)
    members: list[Member] = []
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            members.append((m, f.read() if f else None))
    return members


def cve_2025_4517_chain(outside: str, *, levels: int = 16, prefix: str = "") -> list[Member]:
    """The symlink chain of CVE-2025-4517 (cpython#135034): folders of 247-character names,
    a one-letter symlink to each, so that the resolved path of ``a/b/c/.../l...l`` exceeds
    PATH_MAX and ``os.path.realpath`` stops resolving; a link ``escape`` through that chain
    then points to ``outside`` (an absolute folder) and a file is written through it. Every
    name starts with ``prefix`` (e.g. a bag folder, ``"pkg/"``)."""
    comp = "d" * 247
    steps = "abcdefghijklmnopqrstuvwxyz"[:levels]
    members: list[Member] = []
    path = step_path = ""
    for s in steps:
        members.append(special(os.path.join(path, comp), tarfile.DIRTYPE))
        members.append(special(os.path.join(step_path, s), tarfile.SYMTYPE, comp))
        path, step_path = os.path.join(path, comp), os.path.join(step_path, s)
    link = os.path.join(*steps, "l" * 254)
    members.append(special(link, tarfile.SYMTYPE, "../" * len(steps)))
    depth = outside.count("/") + 8
    members.append(special("escape", tarfile.SYMTYPE, link + "/" + "../" * depth + outside.lstrip("/")))
    members.append(reg("escape/evil.txt", b"written outside the target"))
    for ti, _ in members:
        ti.name = prefix + ti.name
    return members


# ------------------------------------------------------------------------------ snapshots


def snapshot(root: Path, *, skip: Path | None = None) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root`` (not following links), except ``skip`` and what is below it:
    relative path → (type, mode, size, mtime_ns, inode, links, sha256 or link target).
    Walks with directory descriptors, so trees deeper than PATH_MAX are read too."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        here = Path(dirpath)
        if skip is not None:
            dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in [*dirnames, *filenames]:
            if skip is not None and here / name == skip:
                continue
            st = os.lstat(name, dir_fd=dirfd)
            if stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
                with os.fdopen(fd, "rb") as f:
                    extra: Any = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                extra = os.readlink(name, dir_fd=dirfd)
            else:
                extra = None
            is_dir = stat.S_ISDIR(st.st_mode)
            out[str((here / name).relative_to(root))] = (
                stat.S_IFMT(st.st_mode), st.st_mode, None if is_dir else st.st_size,
                None if is_dir else st.st_mtime_ns, st.st_ino, st.st_nlink, extra)
    return out


def make_parent(parent: Path) -> None:
    """Fill ``parent`` with sentinels a hostile tar would like to reach: files, folders, a
    symlink to a folder, a file with the names the tars use."""
    (parent / "outside").mkdir(parents=True)
    (parent / "outside" / "sentinel.txt").write_bytes(b"keep me")
    (parent / "evil.txt").write_bytes(b"original")
    (parent / "x").write_bytes(b"original x")
    (parent / "outside-link").symlink_to(parent / "outside")
    for p in parent.rglob("*"):
        if not p.is_symlink():
            os.utime(p, (MTIME, MTIME))


# ------------------------------------------------------------------------------ the paths


class FakeWork:
    """What the stage functions ask of a claimed operation: lease checks, progress, and the
    context's (no-op) fault hooks."""

    def __init__(self) -> None:
        self.bytes = 0
        self.ctx = SimpleNamespace(hooks=NO_HOOKS)

    def check(self) -> None:
        pass

    def progress(self, n: int) -> None:
        self.bytes += n


@dataclass
class Package:
    id: int
    name: str
    size: int
    sha256: str


def run_extract(data: bytes, target: Path, limits: ExtractionLimits) -> None:
    extract_tar(io.BytesIO(data), target, source="lta:raw/pkg.tar", limits=limits)


def run_staging(data: bytes, target: Path, limits: ExtractionLimits) -> None:
    copy = ArchiveCopy(open=lambda: io.BytesIO(data), size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                       host="lta", key="raw/pkg.tar")
    extract_archive_copy(copy, target, limits=limits)


def run_unpack_package(data: bytes, target: Path, limits: ExtractionLimits) -> None:
    """``data`` as the raw package ``pkg`` carried by a well-formed bundle ``bundle``."""
    payload = {"pkg.tar": data}
    bundle = tar_of(good_bag_members("bundle", payload))
    pkg = Package(1, "pkg", len(data), hashlib.sha256(data).hexdigest())
    target.mkdir(parents=True, exist_ok=True)  # a location root: made by `packhorse init`, never by a backend
    unpack_bundle(FakeWork(), io.BytesIO(bundle), buf=DiskBackend("buffer", target),  # type: ignore[arg-type]
                  source="buffer:bundles/bundle.tar", packages={"pkg.tar": pkg}, limits=limits)


def good_package() -> tuple[bytes, Package]:
    """The well-formed raw package ``pkg`` (its tar and its record)."""
    data = tar_of(good_bag_members())
    return data, Package(1, "pkg", len(data), hashlib.sha256(data).hexdigest())


def run_unpack_bundle(data: bytes, target: Path, limits: ExtractionLimits) -> None:
    """``data`` as the bundle itself, said to carry the well-formed raw package ``pkg``."""
    target.mkdir(parents=True, exist_ok=True)  # a location root: made by `packhorse init`, never by a backend
    unpack_bundle(FakeWork(), io.BytesIO(data), buf=DiskBackend("buffer", target),  # type: ignore[arg-type]
                  source="buffer:bundles/bundle.tar", packages={"pkg.tar": good_package()[1]}, limits=limits)


PATHS: dict[str, Callable[[bytes, Path, ExtractionLimits], None]] = {
    "extract": run_extract,
    "staging": run_staging,
    "unpack-package": run_unpack_package,
    "unpack-bundle": run_unpack_bundle,
}
#: The paths that turn members into files in a folder (the others publish objects).
FOLDER_PATHS = ("extract", "staging")
