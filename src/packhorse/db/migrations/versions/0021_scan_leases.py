"""scan leases: the scan's exclusion is a lease with heartbeats, not a session advisory lock

One row per source data location whose scan ran in distributed mode: the holder, the fencing
``token``, ``expires_at`` (renewed by heartbeats), and when the last scan started and
completed (UTC), so a holder that stops renewing loses the lease and a scan that has not
completed for long is listed by ``status`` and ``health``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 20:50:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('scan_leases',
    sa.Column('location', sa.String(length=200), nullable=False),
    sa.Column('holder', sa.String(length=200), nullable=True),
    sa.Column('token', sa.Integer(), nullable=False),
    sa.Column('expires_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('started_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('completed_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('location', name=op.f('pk_scan_leases'))
    )


def downgrade() -> None:
    op.drop_table('scan_leases')
