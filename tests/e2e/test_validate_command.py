"""``packhorse validate PATH [--json]`` as a user runs it: a bag folder or a bag tar, exit 0 when
valid, 1 when not, every problem listed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import bagit

from support import run_packhorse


def _bag(tmp_path: Path) -> Path:
    root = tmp_path / "bag"
    (root / "obs").mkdir(parents=True)
    (root / "obs" / "a.fits").write_bytes(b"alpha")
    (root / "b.txt").write_bytes(b"beta")
    bagit.make_bag(str(root), checksums=["sha512"])
    return root


def test_validate_a_good_folder_and_tar(tmp_path: Path) -> None:
    root = _bag(tmp_path)
    with tarfile.open(tmp_path / "bag.tar", "w") as tar:
        tar.add(str(root), arcname="bag")
    for path in (root, tmp_path / "bag.tar"):
        r = run_packhorse("validate", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith(f"VALID {path} (BagIt 0.97; payload manifests: sha512;")
    r = run_packhorse("validate", "--json", str(tmp_path / "bag.tar"))
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert (out["valid"], out["payload_algorithms"], out["payload_files"], out["payload_bytes"], out["problems"]) == \
        (True, ["sha512"], 2, 9, [])


def test_validate_lists_every_problem_and_exits_1(tmp_path: Path) -> None:
    root = _bag(tmp_path)
    (root / "data" / "b.txt").write_bytes(b"BETA")
    (root / "data" / "extra.txt").write_bytes(b"x")
    (root / "bagit.txt").write_bytes(b"BagIt-Version : 1.0\nTag-File-Character-Encoding: UTF-8\n")
    r = run_packhorse("validate", str(root))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"INVALID {root}: ")
    assert any("[checksum-mismatch]" in x and "'data/b.txt'" in x for x in lines)
    assert any("[payload-not-in-manifest]" in x and "'data/extra.txt'" in x for x in lines)
    assert any("[bag-declaration-invalid]" in x for x in lines)
    r = run_packhorse("validate", "--json", str(root))
    assert r.returncode == 1
    problems = json.loads(r.stdout)["problems"]
    assert {(p["code"], p["path"]) for p in problems} >= {("checksum-mismatch", "data/b.txt"),
                                                          ("payload-not-in-manifest", "data/extra.txt"),
                                                          ("bag-declaration-invalid", "bagit.txt")}
    r = run_packhorse("validate", str(tmp_path / "missing"))
    assert r.returncode == 1 and "[unreadable]" in r.stdout


def test_validate_several_bags_in_one_call_exits_1_if_any_is_invalid(tmp_path: Path) -> None:
    """A whole archive's bags in one call (a process start-up each was most of the time): each
    reported in the order given, exit 1 when one of them is invalid, ``--json`` a list."""
    good = _bag(tmp_path / "one")
    bad = _bag(tmp_path / "two")
    (bad / "data" / "b.txt").write_bytes(b"BETA")
    r = run_packhorse("validate", str(good), str(good))
    assert r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(("VALID", "INVALID"))] \
        == ["VALID", "VALID"], r.stdout
    r = run_packhorse("validate", "--json", str(good), str(bad))
    assert r.returncode == 1
    assert [(x["bag"], x["valid"]) for x in json.loads(r.stdout)] == [(str(good), True), (str(bad), False)]


def test_a_tar_without_a_bag_folder_and_a_folder_holding_a_bag_are_named_for_what_they_are(tmp_path: Path) -> None:
    """A tar of a bag's contents without its folder was reported as "member 'manifest-sha256.txt'
    is outside the bag folder 'bagit.txt'" (a file taken for the folder), and the folder an
    extracted tar went into as "no bagit.txt" without a word of the bag inside (found by a trial)."""
    root = _bag(tmp_path)
    flat = tmp_path / "flat.tar"
    with tarfile.open(flat, "w") as tar:
        for p in sorted(root.rglob("*")):
            tar.add(str(p), arcname=str(p.relative_to(root)), recursive=False)
    r = run_packhorse("validate", str(flat))
    assert r.returncode == 1
    assert "member 'bagit.txt' is at the top of the tar, not inside a bag folder" in r.stdout, r.stdout
    assert "outside the bag folder 'bagit.txt'" not in r.stdout, r.stdout
    parent = tmp_path  # holds the folder "bag" (and flat.tar)
    r = run_packhorse("validate", str(parent))
    assert r.returncode == 1
    assert "has no bagit.txt: it is not a bag but holds 1 (bag)" in r.stdout, r.stdout
    assert f"packhorse validate {root}" in r.stdout, r.stdout


def test_a_bag_tar_made_with_a_leading_dot_slash_validates(tmp_path: Path) -> None:
    """`tar cf x.tar ./bag` (members ./bag/…) and `tar -C bag -cf y.tar .` (./, ./bagit.txt, …)
    were refused member by member as "an empty or '.' path component" (found by a trial): a
    leading ./ is the same path. The first is a valid bag; the second has no bag folder."""
    import subprocess

    _bag(tmp_path)
    subprocess.run(["tar", "cf", str(tmp_path / "dotted.tar"), "./bag"], cwd=tmp_path, check=True)
    r = run_packhorse("validate", str(tmp_path / "dotted.tar"))
    assert r.returncode == 0 and r.stdout.startswith("VALID "), r.stdout
    subprocess.run(["tar", "-C", str(tmp_path / "bag"), "-cf", str(tmp_path / "flat.tar"), "."], check=True)
    r = run_packhorse("validate", str(tmp_path / "flat.tar"))
    assert r.returncode == 1 and "member 'bagit.txt' is at the top of the tar" in r.stdout, r.stdout
    assert "path component" not in r.stdout, r.stdout
    # and what a leading ./ must not hide: a way out of the target folder
    with tarfile.open(tmp_path / "escape.tar", "w") as tar:
        info = tarfile.TarInfo("./../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    r = run_packhorse("validate", str(tmp_path / "escape.tar"))
    assert r.returncode == 1 and "'..'" in r.stdout, r.stdout
