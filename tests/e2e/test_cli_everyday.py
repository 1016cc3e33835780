"""The command line as rsync and rclone users expect it: --version, run --dry-run writing
nothing, include/exclude patterns, a bandwidth limit per route, progress summary lines off a
terminal, tables not cut when piped, no-routes refusal, verify of staged copies, stage --again,
and demo naming its archives."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, Operation, RawDataFile
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from support import SRC, run_packhorse, write_settled, write_site_config

PROCESSING = ('[[locations]]\nname = "cologne-processing"\nsite = "cologne"\nrole = "processing"\n'
              'path = "sites/cologne/processing"\n')


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` except the ops database files: (size, mtime_ns)."""
    out = {}
    for p in root.rglob("*"):
        if p.name.startswith("packhorse.db"):
            continue
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def _db(cfg: Path) -> Database:
    return Database.from_settings(load_config(cfg))


def _files(root: Path, n: int = 3, size: int = 1000) -> None:
    for i in range(n):
        write_settled(root / "inst" / f"obs{i}" / f"frame{i}.fits", os.urandom(size))


def test_version_option_prints_the_version():
    r = run_packhorse("--version")
    assert r.returncode == 0 and r.stdout.startswith("packhorse ") and r.stdout.split()[1][0].isdigit()
    assert r.stdout.split()[1] == run_packhorse("version").stdout.strip()


_EVERY_HELP = """
import contextlib, io, json, re, runpy, sys
out, todo = {}, [[]]
while todo:
    args = todo.pop()
    sys.argv = ["packhorse", *args, "--help"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module("packhorse", run_name="__main__")
        except SystemExit:
            pass
    text = out[" ".join(args)] = buf.getvalue()
    listing = False
    for line in text.splitlines():
        if line.startswith("Commands:"):
            listing = True
        elif listing and re.match(r"  [a-z]", line):
            todo.append([*args, line.split()[0]])
        elif listing and not line.strip():
            listing = False
print(json.dumps(out))
"""


def test_no_help_shows_markup_or_type_placeholders():
    # found by an operator: --help printed "<bool>" beside every flag and RST markup
    # (``--show ID``). Every command's --help, through the entry point (python -m packhorse),
    # in one process: a process per command took minutes on a busy machine
    r = subprocess.run([sys.executable, "-c", _EVERY_HELP], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    helps = json.loads(r.stdout)
    for args, text in helps.items():
        assert "``" not in text and "<bool>" not in text, (args, text)
        assert text.startswith("Usage: "), (args, text)
    assert len(helps) > 25 and "quarantine purge" in helps, sorted(helps)  # every command was looked at


def test_a_configuration_without_routes_is_refused_naming_the_key(tmp_path):
    cfg = write_site_config(tmp_path / "site")
    text = cfg.read_text()
    start = text.index("[[routes]]")
    cfg.write_text(text[:start] + text[text.index("[packaging]"):])
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0  # init and status still work
    for args in (("run", "--until-idle"), ("run", "--dry-run")):
        r = run_packhorse(*args, "-c", str(cfg))
        assert r.returncode == 2, r.stderr
        assert ": routes:" in r.stderr and "nothing would ever be archived" in r.stderr and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"error: {cfg}")  # the file, then the key


def test_dry_run_writes_nothing_and_tells_what_would_happen(tmp_path):
    cfg = write_site_config(tmp_path / "site")
    site = cfg.parent
    _files(site / "source")
    before = _tree(site)
    r = run_packhorse("run", "--dry-run", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["database"] == "none yet"
    assert plan["totals"] == {"files": 3, "bytes": 3000, "packages": 3, "shipments": 6, "archive_copies": 6,
                              "deletions": 0}
    assert {p["name"] for p in plan["package"]} == {"inst/obs0", "inst/obs1", "inst/obs2"}
    assert plan["package"][0]["archive_at"] == ["cologne-lta", "cornell-lta"]
    assert _tree(site) == before and not (site / "packhorse.db").exists()  # no database created either

    # with a database: no registration, no operation, nothing in any location
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    before = _tree(site)
    r = run_packhorse("run", "--dry-run", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "would register fyst-source: 3 file(s), 3,000 bytes" in r.stdout and "inst/obs1" in r.stdout
    assert _tree(site) == before
    db = _db(cfg)
    assert db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataFile))) == 0
    assert db.read(lambda s: s.scalar(select(func.count()).select_from(Operation))) == 0

    # after a real run the dry run has nothing left to do
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    plan = json.loads(run_packhorse("run", "--dry-run", "--json", "-c", str(cfg)).stdout)
    assert plan["totals"]["files"] == 0 and plan["package"] == [] and all(not c["missing_at"] for c in plan["continue"])


def test_include_and_exclude_patterns_decide_what_is_registered_and_status_shows_them(tmp_path):
    cfg = write_site_config(tmp_path / "site")
    cfg.write_text(cfg.read_text().replace('role = "source"\n',
                                           'role = "source"\ninclude = ["*.fits", "logs/*.txt"]\n'
                                           'exclude = ["scratch", "inst/obs1/*"]\n', 1))
    src = cfg.parent / "source"
    for rel in ("inst/obs0/a.fits", "inst/obs0/a.tmp", "inst/obs1/b.fits", "inst/obs2/scratch/c.fits",
                "inst/obs2/d.fits", "logs/run.txt", "logs/deep/x.txt"):
        write_settled(src / rel, rel.encode() * 100)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "--until-idle", "-q", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    db = _db(cfg)
    registered = set(db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))
    assert registered == {"inst/obs0/a.fits", "inst/obs2/d.fits", "logs/run.txt"}
    archived = {p.relative_to(cfg.parent / "sites/cologne/archive").as_posix()
                for p in (cfg.parent / "sites/cologne/archive").rglob("*") if p.is_file()}
    assert not any("a.tmp" in a or "b.fits" in a or "c.fits" in a for a in archived)
    st = json.loads(run_packhorse("status", "--json", "-c", str(cfg)).stdout)
    assert st["source_filters"] == {"fyst-source": {"include": ["*.fits", "logs/*.txt"],
                                                    "exclude": ["scratch", "inst/obs1/*"]}}
    assert st["skipped"] == []  # left out on purpose is not "skipped"
    nbytes = sum((src / p).stat().st_size for p in registered)
    # the source location holds raw files, not package copies: its registrations are shown
    assert st["source_files"] == {"fyst-source": {"count": 3, "bytes": nbytes}}, st["source_files"]
    assert st["copies"]["fyst-source"]["count"] == 0  # (no package copy there)
    text = run_packhorse("status", "-c", str(cfg)).stdout
    assert "*.fits, logs/*.txt" in text and "scratch, inst/obs1/*" in text
    assert re.search(rf"fyst-source\s+│\s+source: 3 files registered\s+│\s+{nbytes:,}", text), text

    bad = cfg.read_text().replace('exclude = ["scratch", "inst/obs1/*"]', 'exclude = ["../x"]')
    cfg.write_text(bad)
    r = run_packhorse("status", "-c", str(cfg))
    assert r.returncode == 2 and "locations[0]" in r.stderr and "'../x'" in r.stderr


def test_dry_run_verbose_lists_every_file_with_its_decision(tmp_path):
    # an operator checks include / exclude patterns file by file before the first real run
    cfg = write_site_config(tmp_path / "site", settle_seconds=30)
    cfg.write_text(cfg.read_text().replace('role = "source"\n',
                                           'role = "source"\ninclude = ["*.fits", "logs/*.txt"]\n'
                                           'exclude = ["scratch"]\n', 1))
    src = cfg.parent / "source"
    for rel in ("inst/obs0/a.fits", "inst/obs0/a.tmp", "inst/obs2/scratch/c.fits", "logs/run.txt"):
        write_settled(src / rel, rel.encode() * 100)
    (src / "inst/obs0/new.fits").write_bytes(b"just written")  # still settling
    os.symlink("a.fits", src / "inst/obs0/link.fits")
    os.mkfifo(src / "inst/obs0/pipe.fits")
    r = run_packhorse("run", "--dry-run", "--json", "-v", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    (loc,) = json.loads(r.stdout)["register"]
    got = {d["path"]: (d["decision"], d["reason"], d["package"]) for d in loc["decisions"]}
    assert [d["path"] for d in loc["decisions"]] == sorted(got)
    assert got["inst/obs0/a.fits"] == ("register", None, "inst/obs0")
    assert got["logs/run.txt"] == ("register", None, "logs")
    assert got["inst/obs0/a.tmp"] == ("excluded", "matches no include pattern ('*.fits', 'logs/*.txt')", None)
    assert got["inst/obs2/scratch/c.fits"] == ("excluded", "excluded by pattern 'scratch'", None)
    assert got["inst/obs0/link.fits"][:2] == ("skipped", "symbolic link (not followed)")
    assert got["inst/obs0/pipe.fits"][:2] == ("skipped", "not a regular file")
    assert got["inst/obs0/new.fits"][0] == "settling" and "settled after 30 s" in got["inst/obs0/new.fits"][1]
    assert len(got) == 7

    text = run_packhorse("run", "--dry-run", "-v", "-c", str(cfg))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(re.search(r"register\s+fyst-source:inst/obs0/a\.fits\s+\(package inst/obs0\)", x) for x in lines), lines
    assert any(re.search(r"excluded\s+fyst-source:inst/obs2/scratch/c\.fits\s+\(excluded by pattern 'scratch'\)", x)
               for x in lines), lines
    assert any(re.search(r"skipped\s+fyst-source:inst/obs0/link\.fits\s+\(symbolic link", x) for x in lines), lines

    # without -v: the counts as before, no per-file list
    quiet = run_packhorse("run", "--dry-run", "-c", str(cfg))
    assert "a.tmp" not in quiet.stdout and "c.fits" not in quiet.stdout and "would skip" in quiet.stdout
    assert "decisions" not in json.loads(run_packhorse("run", "--dry-run", "--json", "-c", str(cfg)).stdout)["register"][0]


def test_bandwidth_limit_of_a_route_holds_within_20_percent(tmp_path):
    limit = 2 * 1024**2
    cfg = write_site_config(tmp_path / "site", route_extra=f"bandwidth_limit_bytes_per_second = {limit}")
    write_settled(cfg.parent / "source" / "inst" / "obs0" / "big.fits", os.urandom(5 * 1024**2))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "--until-idle", "-q", "-c", str(cfg), timeout=600)
    assert r.returncode == 0, r.stderr
    db = _db(cfg)
    size = db.read(lambda s: s.scalar(select(DataTransferPackage.size)))
    spans = db.read(lambda s: [(o.started_at, o.finished_at, o.attempt, o.stall_count) for o in s.scalars(
        select(Operation).where(Operation.kind == OperationKind.TRANSFER.value))])
    assert len(spans) == 2  # to cologne and to cornell, sharing the route's limit
    seconds = (max(f for _, f, *_ in spans) - min(s for s, *_ in spans)).total_seconds()
    rate = 2 * size / seconds
    print(f"measured {rate / limit:.3f} of the limit over {seconds:.2f} s")
    # (attempt, stall count) of each: a repeated attempt's started_at hides its first reads
    assert 0.8 * limit <= rate <= 1.2 * limit, (rate / limit, seconds, [a[2:] for a in spans])


def test_off_a_terminal_progress_is_summary_lines_not_a_line_per_operation(tmp_path):
    cfg = write_site_config(tmp_path / "site")
    _files(cfg.parent / "source", n=6)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "--until-idle", "--progress-interval", "0.5", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    summaries = [l for l in lines if l.startswith("packhorse run: ") and "finished in" not in l]
    assert summaries, r.stderr
    assert "registered 6/6 files" in summaries[-1] or "registered 6 files" in summaries[-1]
    assert "archived 12/12 copies" in summaries[-1]  # 6 packages x 2 archives: archive copies, this run only
    assert not [l for l in lines if l.startswith("{")]  # no JSON line per finished operation
    assert len(lines) < 40

    _files(cfg.parent / "source" / "more", n=2)  # one package (group more/inst): this run counts only its own work
    r = run_packhorse("--log-format", "json", "run", "--until-idle", "--progress-interval", "0.5", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    events = [json.loads(l) for l in r.stderr.splitlines() if l.startswith("{")]
    assert any(e["event"] == "operation_completed" for e in events)  # asked for: one per operation
    progress = [e for e in events if e["event"] == "run_progress"]
    assert progress, r.stderr
    stages = progress[-1]["stages"]
    assert stages["registered"]["done"] == 2
    assert stages["packaged"]["done"] == 1 == stages["packaged"]["total"]
    assert stages["archived"]["done"] == 2 == stages["archived"]["total"]


def test_tables_are_not_cut_at_80_columns_when_piped(tmp_path):
    cfg = write_site_config(tmp_path / "site")
    long_name = "a-rather-long-folder-name-for-an-observation-unit/" * 2 + "link-that-is-not-followed.fits"
    target = cfg.parent / "source" / long_name
    target.parent.mkdir(parents=True)
    target.symlink_to("/etc/hostname")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    r = run_packhorse("status", "--skipped", "-c", str(cfg), env={"COLUMNS": ""})
    assert r.returncode == 0, r.stderr
    row = [l for l in r.stdout.splitlines() if long_name in l]
    assert row and "symbolic link (not followed)" in row[0], r.stdout
    assert max(len(l) for l in r.stdout.splitlines()) > 80


def test_verify_checks_staged_copies_and_stage_again_restores_a_removed_one(tmp_path):
    cfg = write_site_config(tmp_path / "site", extra=PROCESSING)
    _files(cfg.parent / "source", n=1, size=5000)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    r = run_packhorse("stage", "obs0", "--to", "cologne-processing", "-c", str(cfg))
    assert r.returncode == 0 and "created" in r.stdout, r.stderr
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    staged = cfg.parent / "sites/cologne/processing/inst/obs0"
    payload = staged / "data" / "inst" / "obs0" / "frame0.fits"
    good = payload.read_bytes()
    v = run_packhorse("verify", "--json", "-c", str(cfg))
    assert v.returncode == 0, v.stdout
    assert [(x["path"], x["status"]) for x in json.loads(v.stdout)["staged"]] == [("inst/obs0", "ok")]

    payload.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])  # damaged by processing (a random first byte may be any)
    v = run_packhorse("verify", "-c", str(cfg))
    assert v.returncode == 1 and "STAGED CORRUPT cologne-processing:inst/obs0" in v.stdout

    shutil.rmtree(staged)
    v = run_packhorse("verify", "-c", str(cfg))
    assert v.returncode == 1 and "STAGED MISSING cologne-processing:inst/obs0" in v.stdout and "--again" in v.stdout
    plain = run_packhorse("stage", "obs0", "--to", "cologne-processing", "-c", str(cfg))
    assert plain.returncode == 0 and "already requested" in plain.stdout and "--again" in plain.stdout
    again = run_packhorse("stage", "obs0", "--to", "cologne-processing", "--again", "-c", str(cfg))
    assert again.returncode == 0 and "created" in again.stdout, again.stdout + again.stderr
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    assert payload.read_bytes() == good
    assert run_packhorse("verify", "-c", str(cfg)).returncode == 0
    twice = run_packhorse("stage", "obs0", "--to", "cologne-processing", "--again", "-c", str(cfg))
    assert "already requested" in twice.stdout  # the new staged copy verifies: nothing to redo


def test_stage_again_records_where_the_damaged_staged_folder_went(tmp_path):
    # the staged folder moved aside by `stage --again` was named only in the notification of an
    # attempt that completed: `locate` never showed it, and a failed attempt left it unrecorded
    cfg = write_site_config(tmp_path / "site", extra=PROCESSING)
    _files(cfg.parent / "source", n=1, size=5000)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    assert run_packhorse("stage", "obs0", "--to", "cologne-processing", "-c", str(cfg)).returncode == 0
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    payload = cfg.parent / "sites/cologne/processing/inst/obs0/data/inst/obs0/frame0.fits"
    good = payload.read_bytes()
    payload.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])  # damaged by processing (a random first byte may be any)
    assert run_packhorse("verify", "-c", str(cfg)).returncode == 1
    again = run_packhorse("stage", "obs0", "--to", "cologne-processing", "--again", "-c", str(cfg))
    assert again.returncode == 0 and "created" in again.stdout, again.stdout + again.stderr
    assert run_packhorse("run", "--until-idle", "-q", "-c", str(cfg)).returncode == 0
    assert payload.read_bytes() == good

    where = json.loads(run_packhorse("locate", "inst/obs0", "--json", "-c", str(cfg)).stdout)["packages"][0]
    staged = [c for c in where["copies"] if c["location"] == "cologne-processing"]
    moved = [c["quarantined_as"] for c in staged if c["quarantined_as"]]
    assert len(staged) == 2 and len(moved) == 1, staged
    aside = cfg.parent / "sites/cologne/processing" / moved[0]
    assert (aside / "data/inst/obs0/frame0.fits").read_bytes() == bytes([good[0] ^ 0xFF]) + good[1:]  # kept as it was
    assert [e["location"] for e in where["timeline"] if e["event"] == "quarantined"] == ["cologne-processing"]


def _debug_or_info_lines(stderr: str) -> list[str]:
    """Log lines below WARNING (console or JSON rendering)."""
    return [line for line in stderr.splitlines()
            if "[debug" in line or "[info" in line or '"level": "debug"' in line or '"level": "info"' in line]


def test_init_prints_what_it_did_and_no_debug_log_lines(tmp_path):
    # found by a new-user trial: init (and demo) logged every marker write at debug level, on
    # stdout (structlog's default before any configuration), where scripts read results
    cfg = write_site_config(tmp_path / "site")
    r = run_packhorse("init", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "created and marked" in r.stdout and not _debug_or_info_lines(r.stderr + r.stdout), (r.stdout, r.stderr)
    # what it did is its result, on stdout; stderr is for warnings and errors (none here)
    assert r.stdout.startswith("database sqlite:///") and ": created (migration " in r.stdout, r.stdout
    assert r.stderr == "", r.stderr
    loud = run_packhorse("init", "-c", str(cfg), env={"PACKHORSE_LOG_LEVEL": "debug"})
    assert loud.returncode == 0  # a level asked for still applies


def test_an_operation_id_beyond_the_databases_integers_is_a_usage_error(tmp_path):
    """An id SQLite and PostgreSQL cannot hold is refused by the command line (exit 2, one line),
    not passed to the database (a trial got a 254-line OverflowError traceback)."""
    cfg = write_site_config(tmp_path / "site")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    for args in (("diagnose", "transfer"), ("retry", "transfer"), ("reset", "transfer"), ("run-operation", "transfer")):
        r = run_packhorse(*args, "99999999999999999999", "-c", str(cfg))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-500:])
    r = run_packhorse("diagnose", "transfer", "9223372036854775807", "-c", str(cfg))
    assert r.returncode == 1 and "no transfer operation with id 9223372036854775807" in r.stderr, r.stderr


def test_demo_prints_where_the_archives_are(tmp_path):
    data = tmp_path / "mydata"
    write_settled(data / "inst" / "obs1" / "f.fits", os.urandom(2000))
    for i in range(3):  # the package the demo names is the largest (a bag with several files)
        write_settled(data / "inst" / "obs2" / f"g{i}.fits", os.urandom(3000))
    r = run_packhorse("demo", "--source", str(data), "--workdir", str(tmp_path / "demo"), "-q", timeout=600)
    assert r.returncode == 0, r.stderr
    assert not _debug_or_info_lines(r.stderr + r.stdout), (r.stdout, r.stderr)  # -q: errors only
    lines = [l for l in r.stdout.splitlines() if l.strip().startswith("archive:")]
    assert len(lines) == 2, r.stdout
    for line in lines:
        folder = Path(line.rsplit(": ", 1)[1])
        assert folder.is_dir() and any(p.is_file() and p.name.endswith(".tar") for p in folder.rglob("*")), line
    # and one package's tar, with the command that checks it: that command works as printed
    [shown] = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("packhorse validate ")]
    tar = Path(shlex.split(shown)[2])
    assert tar.is_file() and tar.suffix == ".tar" and any(Path(l.rsplit(": ", 1)[1]) in tar.parents for l in lines)
    assert tar.name == "obs2.tar", tar
    checked = run_packhorse(*shlex.split(shown)[1:3])
    assert checked.returncode == 0 and checked.stdout.startswith("VALID "), checked.stdout


def test_quiet_leaves_only_errors_and_the_count_of_what_was_not_archived(tmp_path):
    # --quiet: no progress, no "finished" or "still queued" lines (found by a new-user trial);
    # the count of skipped source paths stays, they are files not archived (I1)
    cfg = write_site_config(tmp_path / "site")
    _files(cfg.parent / "source", n=2)
    (cfg.parent / "source" / "inst" / "obs0" / "link").symlink_to("/etc/hostname")  # skipped with a reason
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "--until-idle", "--quiet", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["packhorse run: 1 source path(s) skipped and not archived (unreadable, "
                                     "symbolic links, names not allowed, gone before they were packaged); see "
                                     "`packhorse status`"], r.stderr
    loud = run_packhorse("status", "--json", "-c", str(cfg))
    assert "link" in loud.stdout  # the skipped path is still listed where an operator looks
    # "where is my file?" says it was skipped, why and since when: not "nothing matches", exit 1
    where = run_packhorse("locate", "inst/obs0/link", "-c", str(cfg))
    assert where.returncode == 1, where
    assert where.stdout.startswith("SKIPPED fyst-source:inst/obs0/link: ") and "never archived" in where.stdout
    assert "nothing registered" not in where.stdout
    doc = json.loads(run_packhorse("locate", "inst/obs0/link", "--json", "-c", str(cfg)).stdout)
    assert doc["matched"] == "skipped" and [k["path"] for k in doc["skipped"]] == ["inst/obs0/link"]
