"""object leases: per-object leases for S3 locations without conditional writes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 01:02:10.518377
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('object_leases',
    sa.Column('location', sa.String(length=200), nullable=False),
    sa.Column('key', sa.String(length=1024), nullable=False),
    sa.Column('holder', sa.String(length=64), nullable=False),
    sa.Column('expires_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('location', 'key', name=op.f('pk_object_leases'))
    )


def downgrade() -> None:
    op.drop_table('object_leases')
