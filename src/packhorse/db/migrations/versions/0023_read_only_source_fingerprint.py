"""read-only source fingerprint: the identity of a source packhorse never writes to

A read-only source carries no identity marker; ``packhorse init`` records its identity in the
ops database instead (a uuid, the root's device and inode, a sample of its files with size
and mtime), so an unmounted or swapped read-only source is still told from the right one.
Every other location has none.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 20:50:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('data_locations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('fingerprint', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('data_locations', schema=None) as batch_op:
        batch_op.drop_column('fingerprint')
