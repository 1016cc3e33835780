"""What reading a tar of deep members costs: time per member against path depth.

A bag tar is built in memory with ``write_bag_tar``: ``--members`` payload files of 16 bytes,
each at ``data/d/d/…/d/k<i>/f.dat`` (``--depth`` folders, the last one different for every
member, so no member's folder was met before it: the reader's worst case, as in a tar made to
be expensive). Timed, the faster of ``--repeat`` runs each (the machine is shared):

* ``members``: :func:`packhorse.bags.extraction.iter_members`, the one tar reader and its refusal
  rules, nothing written;
* ``validate``: :func:`packhorse.bags.validation.validate_path` of the tar, what ``packhorse
  validate`` and the check passes of unpack and staging run (the tar reader and the bag
  validator);
* ``extract``: :func:`packhorse.bags.extraction.extract_tar` into a temporary folder (removed
  afterwards), staging's extraction pass.

Linear cost means the milliseconds per member grow in proportion to the depth (each member's
name is that long), not to its square. Prints one JSON line per depth.

    PYTHONPATH=src python benchmarks/deep_tar.py --members 300 --depth 475 950 1900
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from packhorse.bags.extraction import extract_tar, iter_members
from packhorse.bags.packaging import PayloadFile, write_bag_tar
from packhorse.bags.validation import validate_path
from packhorse.storage.disk import remove_tree


def deep_bag_tar(members: int, depth: int) -> bytes:
    """The bytes of a bag tar of ``members`` 16-byte files, each ``depth`` folders deep under
    ``data/`` in a folder of its own."""
    data = b"sixteen bytes..\n"
    sha = hashlib.sha256(data).hexdigest()
    prefix = "d/" * (depth - 1)
    files = [PayloadFile(path=f"{prefix}k{i}/f.dat", size=len(data), sha256=sha, mtime=1_700_000_000,
                         open=lambda: io.BytesIO(data)) for i in range(members)]
    out = io.BytesIO()
    write_bag_tar(out, bag_dir="deep", files=files, bag_info={}, bagging_date="2026-01-01",
                  external_identifier="deep", tag_mtime=1_700_000_000)
    return out.getvalue()


def best(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=300)
    ap.add_argument("--depth", type=int, nargs="+", default=[475, 950, 1900])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-extract", action="store_true", help="time the reading only")
    args = ap.parse_args()
    for depth in args.depth:
        blob = deep_bag_tar(args.members, depth)
        with tempfile.TemporaryDirectory(prefix="ph", dir="/tmp") as tmp:
            tar_path = Path(tmp) / "deep.tar"
            tar_path.write_bytes(blob)

            def members() -> None:
                for _ in iter_members(io.BytesIO(blob), source="deep.tar"):
                    pass

            def validate() -> None:
                report = validate_path(tar_path)
                assert report.valid, report.problems[:3]

            def extract() -> None:
                target = Path(tmp) / "x"
                with open(tar_path, "rb") as f:
                    extract_tar(f, target, source="deep.tar")
                fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    remove_tree(fd, "x")
                finally:
                    os.close(fd)

            row: dict[str, object] = {"members": args.members, "depth": depth, "tar_bytes": len(blob)}
            steps = [("members", members), ("validate", validate)] + ([] if args.no_extract else [("extract", extract)])
            for label, fn in steps:
                s = best(args.repeat, fn)
                row[f"{label}_s"] = round(s, 3)
                row[f"{label}_ms_per_member"] = round(1000 * s / args.members, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
