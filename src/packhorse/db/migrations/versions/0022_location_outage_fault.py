"""location outage fault: a location whose storage refuses writes (EROFS, EIO, EACCES, AccessDenied)

An outage whose root and identity marker are there but where writing fails records the fault
(an errno name or an object store's error code); it ends only when a write there succeeds
again. Existing rows (missing roots or markers) have none.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 20:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('location_outages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('fault', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('location_outages', schema=None) as batch_op:
        batch_op.drop_column('fault')
