"""The unit tests keep to their rule (README, "Development"): no unit test starts a subprocess
or sleeps; time is injected. Slower tests live in tests/integration or tests/e2e."""

from __future__ import annotations

import re
from pathlib import Path

UNIT = Path(__file__).parent
FORBIDDEN = re.compile(r"\btime\.sleep\(|\bsubprocess\b|\brun_packhorse\b|\bPopen\(")


def test_no_unit_test_starts_a_subprocess_or_sleeps() -> None:
    offenders = [f"{p.name}:{n}: {line.strip()}" for p in sorted(UNIT.glob("test_*.py")) if p != Path(__file__)
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if FORBIDDEN.search(line) and not line.lstrip().startswith("#")]
    assert offenders == []
