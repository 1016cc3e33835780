"""service clock offset: how far a service's host clock is from the database's

Every process times leases, heartbeats and ages by the database server's clock
(``packhorse.db.clock``); each service records with its heartbeat the offset it measured
(seconds, database minus host), which ``packhorse health`` shows and marks beyond
``[database] clock_offset_warn_seconds``. Existing rows have none until their next heartbeat.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05 23:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('clock_offset_seconds', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.drop_column('clock_offset_seconds')
