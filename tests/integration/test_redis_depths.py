"""On Redis the reconciler's count of a queue includes the messages a worker took and has not
acknowledged (:func:`packhorse.executors.celery_app.queue_depths`): Redis gives back nothing
else (kombu's ``unacked`` hash is its only record of them), so a message in neither the queue
nor that hash is gone for good and its operation may be sent again without waiting the
visibility timeout (:attr:`packhorse.recovery.reconciler.BrokerView.counts_delivered`). The
shared Redis, in this test process's own database."""

from __future__ import annotations

from pathlib import Path

from distributed_support import redis_url
from packhorse.config import settings_from_dict
from packhorse.executors.celery_app import make_app, queue_depths, queue_name


def test_a_message_a_worker_took_and_did_not_acknowledge_is_counted_until_it_is(tmp_path: Path) -> None:
    settings = settings_from_dict({
        "executor": {"kind": "celery", "broker_url": redis_url()},
        "sites": [{"name": "depth-site"}, {"name": "depth-dest"}],
        "locations": [
            {"name": "depth-src", "site": "depth-site", "role": "source", "path": "src"},
            {"name": "depth-lta", "site": "depth-dest", "role": "long_term_archive", "path": "lta"},
        ],
    }, base_dir=tmp_path, environ={})
    app = make_app(settings)
    q = queue_name("depth-site", "depth-src", "scan")
    with app.connection_for_write() as conn:
        conn.SimpleQueue(q).put({"operation": 1}, routing_key=q)
    assert queue_depths(app, [q]) == {q: 1}  # waiting
    with app.connection_for_read() as conn:
        taken = conn.SimpleQueue(q, no_ack=False)
        message = taken.get(timeout=5)  # taken by a worker, not acknowledged: in kombu's unacked hash
        assert queue_depths(app, [q]) == {q: 1}
        message.ack()
        assert queue_depths(app, [q]) == {q: 0}
        taken.close()
