"""quarantined bytes: what a data location's quarantine holds, measured with its disk usage

Every disk usage sample records the bytes under the location's ``_packhorse/quarantine/``
(bad copies and foreign objects moved aside, never deleted), for ``/metrics``
(``packhorse_quarantined_bytes``). Older samples have none.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 21:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('disk_usage_samples', schema=None) as batch_op:
        batch_op.add_column(sa.Column('quarantined_bytes', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('disk_usage_samples', schema=None) as batch_op:
        batch_op.drop_column('quarantined_bytes')
