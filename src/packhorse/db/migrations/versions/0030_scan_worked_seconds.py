"""scan leases: how long the last completed scan worked

``scan_leases.worked_seconds``: how long the last completed scan of the location worked (s),
the time its holder could not reach the database left out. The next scan rests a multiple of
it; before, the rest went by ``completed_at − started_at``, so a scan held up by a site cut off
from the centre rested three times the cut after the link came back. ``None`` on rows of scans
completed before this revision.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06 22:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scan_leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('worked_seconds', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scan_leases', schema=None) as batch_op:
        batch_op.drop_column('worked_seconds')
