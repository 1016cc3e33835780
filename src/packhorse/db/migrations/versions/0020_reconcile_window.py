"""reconcile window: the reconciler's give-up is per cool-down window, not for ever

``reconcile_window_at`` (UTC) is when the count of re-dispatches (``reconcile_count``) was last
reset: a claim since then (``started_at`` later) or ``packhorse retry`` starts a new window.
``reconcile_given_up_at`` (UTC) is when the reconciler gave up on the operation (its cap
reached in the window); after ``[recovery] reconcile_cooldown_seconds`` it tries once more
(half-open), and while it waits the operation is listed as blocked (``dispatch_lost``).
``NULL`` for every existing row: its count starts a window at its next re-dispatch.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 20:30:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('operations') as batch:
        batch.add_column(sa.Column('reconcile_window_at', packhorse.db.models.UTCDateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('reconcile_given_up_at', packhorse.db.models.UTCDateTime(timezone=True),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('operations') as batch:
        batch.drop_column('reconcile_given_up_at')
        batch.drop_column('reconcile_window_at')
