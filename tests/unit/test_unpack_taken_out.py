"""An unpack of a bundle copy that still carries a package taken out of the bundle since it
was built (shipped again in a bundle of its own, :mod:`packhorse.rules.convergence` step 5): that
package is read past, nothing of it written; any other stranger in the bundle is refused as
before."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hostile_tars import FakeWork, good_bag_members, good_package, tar_of
from packhorse.bags.extraction import ExtractionLimits
from packhorse.errors import VerificationError
from packhorse.stages.unpack import unpack_bundle
from packhorse.storage.disk import DiskBackend


def _bundle() -> bytes:
    data, _ = good_package()
    return tar_of(good_bag_members("bundle", {"pkg.tar": data, "moved.tar": data}))


def _unpack(target: Path, taken_out: object) -> list[tuple[int, str, int, str]]:
    target.mkdir(parents=True, exist_ok=True)
    return unpack_bundle(FakeWork(), io.BytesIO(_bundle()), buf=DiskBackend("buffer", target),  # type: ignore[arg-type]
                         source="buffer:bundles/bundle.tar", packages={"pkg.tar": good_package()[1]},
                         limits=ExtractionLimits(), taken_out=taken_out)  # type: ignore[arg-type]


def test_a_package_taken_out_of_the_bundle_is_read_past(tmp_path: Path) -> None:
    done = _unpack(tmp_path / "buf", lambda path: path == "moved.tar")
    assert [d[1] for d in done] == ["raw/pkg.tar"]
    assert sorted(p.name for p in (tmp_path / "buf").rglob("*") if p.is_file()) == ["pkg.tar"]


@pytest.mark.parametrize("taken_out", [None, lambda path: False], ids=["not split", "split, not that one"])
def test_any_other_package_the_bundle_carries_is_refused(tmp_path: Path, taken_out: object) -> None:
    with pytest.raises(VerificationError, match="'moved.tar', which is not one of its packages"):
        _unpack(tmp_path / "buf", taken_out)
