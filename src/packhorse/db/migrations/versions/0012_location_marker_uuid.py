"""location marker uuid: the identity marker a data location's root must carry

The ``uuid`` of the marker ``packhorse init`` found or wrote at each location's root. A root
whose marker names the location but carries another uuid (a disk of another installation, a
marker copied onto blank storage) is unavailable, not written into (DESIGN.md "Storage that is
absent is not empty"). ``NULL`` for locations marked before this revision: the next ``packhorse
init`` records it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 12:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('data_locations') as batch:
        batch.add_column(sa.Column('marker_uuid', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('data_locations') as batch:
        batch.drop_column('marker_uuid')
