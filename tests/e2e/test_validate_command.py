"""``packhorse validate PATH [--json]`` as a user runs it: a bag folder or a bag tar, exit 0 when
valid, 1 when not, every problem listed."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import bagit
import pytest

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


def _foreign_bag(root: Path, *, version: str = "1.0", alg: str = "sha256", nl: str = "\n", final: bool = True,
                 dot: bool = False, bag_info: list[str] | None = None) -> Path:
    """A bag as other tools write them (line ends, algorithms, versions, spacing)."""
    import hashlib

    payload = {"data/a.txt": b"alpha\n", "data/sub/b.txt": b"beta\n"}
    for rel, data in payload.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)

    def text(lines: list[str]) -> bytes:
        return (nl.join(lines) + (nl if final else "")).encode()

    (root / "bagit.txt").write_bytes(text([f"BagIt-Version: {version}", "Tag-File-Character-Encoding: UTF-8"]))
    (root / f"manifest-{alg}.txt").write_bytes(
        text([f"{hashlib.new(alg, d).hexdigest()}  {'./' if dot else ''}{p}" for p, d in payload.items()]))
    if bag_info is not None:
        (root / "bag-info.txt").write_bytes(text(bag_info))
    return root


@pytest.mark.parametrize("kind, options, warning", [
    ("CRLF line ends", dict(nl="\r\n"), None),
    ("CR line ends", dict(nl="\r"), None),
    ("no final line end", dict(final=False), "bag-declaration-unterminated"),
    ("./ paths in 0.97", dict(version="0.97", dot=True), "manifest-path-dot-prefix"),
    ("sha224", dict(alg="sha224"), None),
    ("sha384", dict(alg="sha384"), None),
    ("space before a colon", dict(bag_info=["Source-Organization : Somewhere", "Payload-Oxum: 11.2"]),
     "bag-info-label-whitespace"),
    ("BagIt 0.93", dict(version="0.93"), "old-version"),
    ("BagIt 0.96", dict(version="0.96"), "old-version"),
])
def test_bags_from_other_tools_are_valid_with_warnings_listed(tmp_path: Path, kind: str, options: dict,
                                                              warning: str | None) -> None:
    root = _foreign_bag(tmp_path / "bag", **options)
    r = run_packhorse("validate", str(root))
    assert r.returncode == 0, kind + ": " + r.stdout + r.stderr
    assert r.stdout.startswith(f"VALID {root}")
    warned = re.findall(r"^  warning \[([a-z-]+)\]", r.stdout, re.M)
    assert set(warned) == ({warning} if warning else set()), r.stdout
    out = json.loads(run_packhorse("validate", "--json", str(root)).stdout)
    assert out["valid"] is True and {w["code"] for w in out["warnings"]} == ({warning} if warning else set())
    assert bagit.Bag(str(root)).is_valid(), kind  # the reference library agrees


def _with_fetch(root: Path, *, fetched: bool) -> Path:
    """A bagit-python bag one of whose payload files is listed in fetch.txt (and present or not)."""
    bag = _bag(root.parent)
    (bag / "fetch.txt").write_text("https://example.org/obs/a.fits 5 data/obs/a.fits\n")
    b = bagit.Bag(str(bag))
    b.save(manifests=True)  # fetch.txt into the tag manifest
    if not fetched:
        (bag / "data" / "obs" / "a.fits").unlink()
    return bag


def test_a_bag_with_a_fetch_txt_is_valid_but_incomplete_until_its_files_are_there(tmp_path: Path) -> None:
    bag = _with_fetch(tmp_path / "bag", fetched=False)
    r = run_packhorse("validate", str(bag))
    assert r.returncode == 5, r.stdout + r.stderr  # valid, incomplete
    assert r.stdout.startswith(f"INCOMPLETE {bag}: valid, but 1 payload file(s) listed in fetch.txt"), r.stdout
    assert "  to fetch: data/obs/a.fits" in r.stdout
    out = json.loads(run_packhorse("validate", "--json", str(bag)).stdout)
    assert (out["valid"], out["complete"], out["fetch_pending"], out["problems"]) == (
        True, False, ["data/obs/a.fits"], [])
    (bag / "data" / "obs" / "a.fits").write_bytes(b"alpha")  # fetched
    r = run_packhorse("validate", str(bag))
    assert r.returncode == 0 and r.stdout.startswith(f"VALID {bag}"), r.stdout
    (bag / "data" / "obs" / "a.fits").write_bytes(b"ALPHA")  # fetched, wrong bytes: invalid
    r = run_packhorse("validate", str(bag))
    assert r.returncode == 1 and "[checksum-mismatch]" in r.stdout, r.stdout


def test_validate_takes_a_configuration_and_applies_its_extraction_limits(tmp_path: Path) -> None:
    # "every command takes --config/-c": validate refused it ("No such option: -c")
    from support import write_site_config

    root = _bag(tmp_path)
    with tarfile.open(tmp_path / "bag.tar", "w") as tar:
        tar.add(str(root), arcname="bag")
    cfg = write_site_config(tmp_path / "site", extra="[extraction]\nmax_members = 5")
    assert run_packhorse("validate", "-c", str(cfg), str(root)).returncode == 0
    # the tar has 9 members (folders, tag files, payload): more than the configuration allows
    r = run_packhorse("validate", "-c", str(cfg), str(tmp_path / "bag.tar"))
    assert r.returncode == 1 and "5" in r.stdout, r.stdout + r.stderr
    assert run_packhorse("validate", str(tmp_path / "bag.tar")).returncode == 0  # default limits
