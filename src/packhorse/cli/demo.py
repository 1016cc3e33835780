"""``packhorse demo``: a three-site configuration (fyst → cologne, cornell) and observatory-like data.

The generated data set is reproducible (seeded): instruments / observation units / files of
varied sizes (empty files included), with spaces and non-ASCII characters in names.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

DEMO_CONFIG = """\
# packhorse demo: raw data at fyst (the telescope) archived at cologne and cornell.
[database]
url = "sqlite:///packhorse.db"

[executor]
kind = "local"
workers = {workers}

[[sites]]
name = "fyst"
[[sites]]
name = "cologne"
[[sites]]
name = "cornell"

[[locations]]
name = "fyst-source"
site = "fyst"
role = "source"
storage = "disk"
path = "{source}"

[[locations]]
name = "fyst-buffer"
site = "fyst"
role = "buffer"
path = "data/fyst/buffer"
retention_seconds = 0

[[locations]]
name = "cologne-buffer"
site = "cologne"
role = "buffer"
path = "data/cologne/buffer"
retention_seconds = 0

[[locations]]
name = "cologne-lta"
site = "cologne"
role = "long_term_archive"
path = "data/cologne/archive"

[[locations]]
name = "cornell-buffer"
site = "cornell"
role = "buffer"
path = "data/cornell/buffer"
retention_seconds = 0

[[locations]]
name = "cornell-lta"
site = "cornell"
role = "long_term_archive"
path = "data/cornell/archive"

[[routes]]
source_site = "fyst"
destination_sites = ["cologne", "cornell"]

[packaging]
group_depth = 2
max_package_bytes = 10737418240
settle_seconds = 0
bundle_target_bytes = 1073741824
bundle_max_wait_seconds = 300

[managers]
poll_interval_seconds = 5

[recovery]
lease_timeout_seconds = 60
heartbeat_interval_seconds = 10
monitor_interval_seconds = 10
"""


def write_demo_config(workdir: Path, source: str, workers: int = 4) -> Path:
    """Write ``<workdir>/packhorse.toml`` for the demo; ``source`` is the source folder (TOML-escaped)."""
    escaped = source.replace("\\", "\\\\").replace('"', '\\"')
    path = workdir / "packhorse.toml"
    path.write_text(DEMO_CONFIG.format(source=escaped, workers=workers), encoding="utf-8")
    return path


INSTRUMENTS = ["chai", "prime-cam", "mod-cam"]
NAMES = ["scan", "calib", "hk", "Ångström calib", "スペクトル", "dark frame", "flat_ß", "pointing"]


def generate_observatory_data(root: Path, *, seed: int = 2026, units_per_instrument: int = 4,
                              files_per_unit: int = 12, max_file_bytes: int = 4 << 20) -> tuple[int, int]:
    """Fill ``root`` with a reproducible observatory-like tree; returns ``(files, bytes)``.

    Layout: ``<instrument>/<observation unit>/<file>`` plus a few top-level notes files
    (which form packages of their own folder). Sizes are log-uniform up to ``max_file_bytes``
    with some empty files.
    """
    rng = random.Random(seed)
    nfiles = nbytes = 0
    root.mkdir(parents=True, exist_ok=True)
    for inst in INSTRUMENTS:
        for u in range(units_per_instrument):
            unit = root / inst / f"obs_2026-11-{10 + u:02d}T0{u}-00-00_{u + 1:04d}"
            unit.mkdir(parents=True, exist_ok=True)
            for i in range(files_per_unit):
                name = f"{rng.choice(NAMES)}_{i:03d}.{rng.choice(['fits', 'dat', 'h5', 'txt'])}"
                roll = rng.random()
                size = 0 if roll < 0.08 else int(2 ** rng.uniform(4, max(5, max_file_bytes.bit_length() - 1)))
                size = min(size, max_file_bytes)
                (unit / name).write_bytes(rng.randbytes(size))
                nfiles += 1
                nbytes += size
        notes = root / inst / "README observing log.txt"
        text = f"Observing log for {inst}, Fred Young Submillimeter Telescope, Cerro Chajnantor.\n"
        notes.write_text(text, encoding="utf-8")
        nfiles += 1
        nbytes += len(text.encode())
    past = 1_700_000_000
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (past, past))
    return nfiles, nbytes
