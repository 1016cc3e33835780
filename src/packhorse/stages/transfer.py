"""``transfer``: move a bundle from the source site's buffer to a destination site's buffer.

Run by the destination site's workers (they pull). Methods (per route):

* ``copy``: stream through the storage backends (local or mounted disks).
* ``command``: run the route's ``command`` template (e.g. ``rsync -a {source} {destination}``)
  with ``{source}`` = the bundle's local path and ``{destination}`` = a partial file beside the
  final name at the destination; the arguments are split like a shell line and never passed to
  a shell. The lease is checked while the command runs; the command is killed if it is lost.

Either way the result is hashed and compared with the bundle's sha256 before it is published,
then re-read and verified (I4).
"""

from __future__ import annotations

import shlex
import subprocess
import time

from sqlalchemy.orm import Session

from ..db.models import DataTransferPackage
from ..domain import TransferMethod
from ..errors import ConfigError, TransferCommandError
from ..topology import bundle_key
from .base import Recorder, Work, already_there, clear_partials, copy_object, publish_verified, record_copy


def command_args(template: str, source: str, destination: str) -> list[str]:
    """Split ``template`` like a shell line and fill ``{source}``/``{destination}`` in each arg."""
    return [a.replace("{source}", source).replace("{destination}", destination) for a in shlex.split(template)]


def run(work: Work) -> Recorder:
    """Copy and verify the bundle at the destination buffer; record the copy there."""
    ctx = work.ctx
    dtp = ctx.db.read(lambda s: s.get(DataTransferPackage, work.op.data_transfer_package_id))
    assert dtp is not None and dtp.size is not None and dtp.sha256 is not None
    src_name = ctx.location_name(work.op.source_location_id)
    dst_name = ctx.location_name(work.op.destination_location_id)
    src, dst = ctx.backend(src_name), ctx.backend(dst_name)
    key = bundle_key(dtp.name)
    work.info.update(bundle=dtp.name, source=src_name, destination=dst_name, key=key)
    route = ctx.settings.route_from(ctx.topology.site_name(dtp.source_site_id))
    method = route.method if route else TransferMethod.COPY

    if method is TransferMethod.COPY:
        copy_object(work, src, key, dst, key, size=dtp.size, sha256=dtp.sha256, point="transfer")
    elif not already_there(dst, key, dtp.size, dtp.sha256):
        assert route is not None and route.command is not None
        src_path = src.local_path(key)
        if src_path is None:
            raise ConfigError(f"routes: method 'command' needs disk locations ({src_name} is not)")
        clear_partials(dst, key)
        with dst.open_write(key) as w:
            if w.local_path is None:
                raise ConfigError(f"routes: method 'command' needs disk locations ({dst_name} is not)")
            args = command_args(route.command, str(src_path), str(w.local_path))
            _run_command(work, args, key)
            w.adopt_local_file()
            publish_verified(work, w, dst, expected_sha256=dtp.sha256, point="transfer")
    location_id = ctx.topology.location_ids[dst_name]
    size, sha, dtp_id = dtp.size, dtp.sha256, dtp.id

    def record(s: Session) -> None:
        record_copy(s, location_id=location_id, key=key, size=size, sha256=sha, data_transfer_package_id=dtp_id)

    return record


def _run_command(work: Work, args: list[str], key: str) -> None:
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as e:
        raise TransferCommandError(f"transfer command {args[0]!r} could not start: {e.strerror}",
                                   step="transfer", path=key) from None
    try:
        while proc.poll() is None:
            work.check()
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")[-2000:]
    if proc.returncode != 0:
        raise TransferCommandError(f"transfer command {shlex.join(args)} exited {proc.returncode}: {err.strip()}",
                                   step="transfer", side="destination", path=key)
