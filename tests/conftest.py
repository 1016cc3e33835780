"""Shared fixtures (helpers live in ``tests/support.py``, importable as ``support``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import structlog

from azurite_support import AzuriteServer, shared_azurite
from packhorse.db.session import Database
from s3_support import start_or_skip
from seaweedfs_support import SeaweedServer, shared_seaweedfs
from shared_service import run_folder
from support import run_packhorse, write_site_config

_CHAOS = Path(__file__).parent / "chaos"
#: every packhorse process a test starts (and its worker processes) loads the test-side fault
#: hooks (packhorse.runtime.hooks, ``[hooks] module``); they do nothing unless a test sets a plan
HOOKS_MODULE = str(Path(__file__).parent / "fault_hooks.py")
os.environ.setdefault("PACKHORSE_HOOKS__MODULE", HOOKS_MODULE)


_E2E = Path(__file__).parent / "e2e"
#: End-to-end modules whose tests take several seconds each (real ``packhorse`` processes
#: running a pipeline to idle, a browser, an S3 server): marked ``long``, so the default
#: selection stays under five minutes on a 2-core machine; ``.ci/run`` runs them.
_LONG_E2E = frozenset({
    "test_pipeline.py", "test_cli_everyday.py", "test_fixity.py", "test_stop_signal.py",
    "test_recovery_cli.py", "test_staging.py", "test_runtime_settings.py", "test_disk_pressure.py",
    "test_reset.py", "test_s3_archive.py", "test_source_deletion.py", "test_dashboard_views.py",
    "test_dashboard.py", "test_operator_api.py", "test_file_versions.py", "test_convergence.py",
    "test_unavailable_location.py", "test_startup_errors.py", "test_disk_usage_commands.py", "test_api_command.py",
    "test_missing_source.py", "test_sftp_transfer.py", "test_read_only_source.py", "test_read_only_storage.py",
    "test_cli_short_options.py", "test_source_audit.py", "test_quarantine_commands.py",
    "test_convergence_distributed.py", "test_distributed_versions.py", "test_unavailable_distributed.py",
    "test_distributed_breaker.py", "test_three_archives.py", "test_azure_cold.py",
    "test_influx_metrics.py", "test_clock_offset.py", "test_site_unreachable.py", "test_validate_command.py",
})


#: The slowest tests of the chaos, long and multi-site selection, seconds each (setup and
#: teardown included) as a run of that selection measured them on 2 cores with four test
#: processes (2026-12-07; the order is what counts). Only the order tests start in depends on
#: it: with ``--dist load --maxschedchunk 1`` (how ``.ci/run`` runs that selection) the longest
#: start first and the four processes finish together, instead of one running a 150 s test
#: alone at the end. A test missing here keeps its place after them. The multi-site tests come
#: first whatever they took: they mostly wait (on links cut for 30 s, a link flapping for a
#: minute), so they overlap the tests that keep both cores busy; and each module's two share
#: one test bed (a module fixture): listed as pairs, they go to one process together (the first
#: chunk of each process is two tests), which builds that bed once.
_SLOWEST = {
    "tests/multisite/test_across_sites.py::test_sites_that_share_no_file_system_archive_a_tree_and_heal_a_source_site_cut_off_from_the_centre": 1001,
    "tests/multisite/test_across_sites.py::test_a_transfer_cut_mid_stream_and_a_flapping_link_lose_nothing": 1000,
    "tests/multisite/test_clock_and_outages.py::test_sites_whose_clocks_run_5_minutes_ahead_archive_everything": 999,
    "tests/multisite/test_clock_and_outages.py::test_a_site_archive_disk_away_and_back_ends_its_outage_by_itself": 998,
    "tests/chaos/test_chaos_harness.py::test_harness_fails_when_fencing_is_switched_off": 120,
    "tests/chaos/test_chaos_harness.py::test_short_chaos_run_keeps_every_invariant": 120,
    "tests/chaos/test_resumable_transfer.py::test_copy_transfer_killed_at_60_percent_resumes": 70,
    "tests/e2e/test_distributed_breaker.py::test_the_monitor_lets_one_attempt_through_after_the_cool_down": 65,
    "tests/chaos/test_dispatch_lost.py::test_a_dispatch_lost_beyond_the_cap_is_listed_and_retried_after_the_cool_down": 62,
    "tests/chaos/test_broker_restart.py::test_redis_restart_under_running_workers": 60,
    "tests/chaos/test_broker_restart.py::test_rabbitmq_restart_under_running_workers": 49,
    "tests/chaos/test_scan_lease_paused_holder.py::test_a_paused_scan_holder_loses_the_lease_to_another_worker_of_the_site": 48,
    "tests/chaos/test_resumable_transfer.py::test_rsync_command_transfer_killed_at_60_percent_resumes": 47,
    "tests/chaos/test_resumable_transfer.py::test_s3_multipart_archive_killed_at_60_percent_resumes": 46,
    "tests/chaos/test_database_outage_keeps_leases.py::test_a_database_restart_costs_no_lease_and_no_stall": 43,
    "tests/chaos/test_distributed_chaos.py::test_postgres_restart_in_the_middle_of_a_run": 42,
    "tests/chaos/test_queued_not_lost.py::test_messages_queued_behind_a_busy_worker_are_not_reconciled": 42,
    "tests/e2e/test_file_versions.py::test_a_file_gone_for_good_is_forgotten_by_an_operator_and_no_longer_listed": 41,
    "tests/e2e/test_convergence.py::test_every_copy_bad_and_the_source_gone_is_the_one_loud_dead_end": 41,
    "tests/e2e/test_distributed.py::test_pipeline_on_postgres_with_a_worker_per_site": 40,
    "tests/e2e/test_convergence.py::test_no_good_source_released_by_a_good_copy_put_back_is_recognised_by_verify": 39,
    "tests/e2e/test_convergence.py::test_no_good_source_released_by_a_good_copy_put_back_converges_on_a_plain_run": 38,
    "tests/chaos/test_distributed_chaos.py::test_every_task_published_twice_has_one_effect": 37,
    "tests/e2e/test_unavailable_location.py::test_an_empty_mount_point_blocks_writes_and_init_adopts_an_unmarked_root_with_data": 37,
    "tests/chaos/test_distributed_chaos.py::test_flushall_in_the_middle_of_a_run_is_recovered_by_the_reconciler": 35,
    "tests/e2e/test_clock_offset.py::test_a_killed_worker_an_hour_ahead_is_handed_back_within_the_lease": 35,
    "tests/e2e/test_convergence_distributed.py::test_every_copy_bad_and_the_source_gone_is_the_one_loud_dead_end": 35,
    "tests/chaos/test_distributed_chaos.py::test_a_task_outliving_the_visibility_timeout_is_not_run_twice": 35,
    "tests/chaos/test_distributed_chaos.py::test_sigkill_of_a_pool_child_in_the_middle_of_an_archive_write": 35,
    "tests/e2e/test_clock_offset.py::test_a_monitor_two_hours_ahead_leaves_a_live_lease_alone": 34,
    "tests/e2e/test_staging.py::test_stage_from_cold_archive_waits_for_the_restore_then_extracts_verified": 34,
    "tests/e2e/test_one_pipeline.py::test_same_scenario_same_operations_embedded_and_with_two_managers_and_two_monitors": 33,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under ``tests/chaos`` carries the ``chaos`` marker, every test of the
    :data:`_LONG_E2E` modules the ``long`` one (both left out of the default selection, run by
    ``pytest -m "chaos or long"`` and by ``.ci/run``). Run in test processes (pytest-xdist),
    the tests of :data:`_SLOWEST` start first, longest first (the order of the others is kept).
    The order is what each test process collects (the scheduler hands out its indexes), and
    pytest-xdist sets ``dist`` to ``"no"`` in them: a check of ``dist`` alone never sorted,
    and the multi-site tests ran last, one alone for minutes at the end of every CI run."""
    for item in items:
        path = Path(str(item.fspath))
        if _CHAOS in path.parents:
            item.add_marker(pytest.mark.chaos)
        elif path.parent == _E2E and path.name in _LONG_E2E:
            item.add_marker(pytest.mark.long)
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "no":
        items.sort(key=lambda item: -_SLOWEST.get(item.nodeid.split("[")[0], 0))


@pytest.fixture
def broker_url(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The URL of the broker the test is parametrized with (``broker``): ``"redis"`` a database
    of the shared Redis, ``"rabbitmq"`` a private vhost of the shared RabbitMQ (deleted afterwards)."""
    from distributed_support import rabbitmq_vhost, redis_url

    if request.node.callspec.params["broker"] == "redis":
        yield redis_url()
        return
    url, delete = rabbitmq_vhost()
    try:
        yield url
    finally:
        delete()


@pytest.fixture(autouse=True)
def _structlog_restored():
    """Every test leaves structlog's configuration as it found it: a test that runs
    ``packhorse.logs.configure`` in-process (at WARNING, say) would otherwise decide what a later
    test of the same process can capture (an INFO event went missing that way in CI)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def site_config(tmp_path: Path):
    """Factory: ``site_config(**overrides) -> Path`` of a three-site config in ``tmp_path / "site"``."""

    def make(**overrides: Any) -> Path:
        return write_site_config(tmp_path / "site", **overrides)

    return make


@pytest.fixture
def cli():
    """Run ``packhorse`` in a subprocess: ``cli(*args, env=None) -> CompletedProcess``."""
    return run_packhorse


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server on a free loopback port for the whole session (see ``s3_support``)."""
    server = start_or_skip()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory):
    """SeaweedFS's S3 server, one for the whole run, shared by the xdist workers (``seaweedfs_support``)."""
    service = shared_seaweedfs(run_folder(tmp_path_factory))
    info = service.acquire()
    yield SeaweedServer(info["endpoint_url"])
    service.release()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory):
    """Azurite's blob service, one for the whole run, shared by the xdist workers (``azurite_support``)."""
    service = shared_azurite(run_folder(tmp_path_factory))
    info = service.acquire()
    yield AzuriteServer(info["account_url"], info["connection_string"])
    service.release()


@pytest.fixture(scope="session", params=["moto", "seaweedfs"])
def s3_server(request: pytest.FixtureRequest):
    """An S3 server: every test taking it runs against moto (a mock) and SeaweedFS (a real S3
    implementation); both have ``endpoint_url``, ``client()`` and ``new_bucket()``."""
    return request.getfixturevalue("moto_s3" if request.param == "moto" else "seaweedfs")


@pytest.fixture(scope="session")
def migrated_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file migrated once per test run (copied for each test: upgrade is the slow part)."""
    path = tmp_path_factory.mktemp("template") / "t.db"
    d = Database(f"sqlite:///{path}")
    d.upgrade()
    d.dispose()  # the last connection closing checkpoints the WAL into the file
    return path


@pytest.fixture
def empty_db(tmp_path: Path, migrated_file: Path) -> Database:
    """A fresh copy of the migrated database, for this test alone."""
    shutil.copyfile(migrated_file, tmp_path / "t.db")
    d = Database(f"sqlite:///{tmp_path}/t.db")
    yield d
    d.dispose()
