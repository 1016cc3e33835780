"""Distributed-mode routing and Celery settings, without a broker: queue names per
(site, location, kind), the queues a site's worker consumes, and the reliability settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from packhorse.config import load_config
from packhorse.errors import ConfigError
from packhorse.executors.celery_app import make_app, queue_name, site_queues
from support import write_site_config


@pytest.fixture
def settings(tmp_path: Path):
    cfg = write_site_config(tmp_path, extra="")
    text = cfg.read_text().replace('kind = "local"', 'kind = "celery"\nbroker_url = "memory://"\n'
                                   'visibility_timeout_seconds = 7')
    cfg.write_text(text)
    return load_config(cfg)


def test_queue_names_follow_site_location_kind() -> None:
    assert queue_name("cologne", "cologne-lta", "long_term_archive") == "cologne_cologne-lta_long_term_archive"


def test_a_site_worker_consumes_only_its_own_site_queues(settings) -> None:
    cologne = site_queues(settings, "cologne")
    assert "cologne_cologne-lta_long_term_archive" in cologne
    assert "cologne_cologne-buffer_transfer" in cologne  # transfers are pulled by the destination
    assert all(q.startswith("cologne_cologne-") for q in cologne)
    fyst = site_queues(settings, "fyst")
    assert "fyst_fyst-source_scan" in fyst  # the scan of a source runs on its site
    assert not any(q.endswith("_scan") for q in cologne)
    assert set(site_queues(settings, "cologne", ["long_term_archive"])) == {
        "cologne_cologne-buffer_long_term_archive", "cologne_cologne-lta_long_term_archive"}


def test_unknown_site_or_kind_is_refused_by_name(settings) -> None:
    with pytest.raises(ConfigError, match="--site: unknown site 'koeln'"):
        site_queues(settings, "koeln")
    with pytest.raises(ConfigError, match="--kinds: unknown kind 'archive'"):
        site_queues(settings, "cologne", ["archive"])


def test_celery_runs_with_late_acks_no_prefetch_json_only_and_the_configured_visibility(settings) -> None:
    app = make_app(settings)
    c = app.conf
    assert c.task_acks_late and c.task_reject_on_worker_lost
    assert c.worker_prefetch_multiplier == 1
    assert c.task_serializer == "json" and list(c.accept_content) == ["json"]
    assert c.broker_transport_options["visibility_timeout"] == 7
    assert {q.name for q in c.task_queues} == {q for s in ("fyst", "cologne", "cornell") for q in site_queues(settings, s)}
    task = app.tasks["packhorse.run_operation"]
    assert task.acks_late and task.reject_on_worker_lost


def test_make_app_needs_celery_and_a_broker(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path)
    with pytest.raises(ConfigError, match="executor.kind"):
        make_app(load_config(cfg))




def test_workers_read_the_topology_that_init_wrote(settings, empty_db) -> None:
    from packhorse.errors import DatabaseNotInitializedError
    from packhorse.runtime.topology import load_topology, sync_topology

    with pytest.raises(DatabaseNotInitializedError, match="fyst.*packhorse init"):
        load_topology(empty_db, settings)
    written = sync_topology(empty_db, settings)
    assert load_topology(empty_db, settings) == written
