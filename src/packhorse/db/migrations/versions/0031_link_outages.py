"""link outages: a link between sites cut (transfers waiting on a lost SSH connection), one row per cut

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07 08:00:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'link_outages',
        sa.Column('source', sa.String(length=100), nullable=False),
        sa.Column('destination', sa.String(length=100), nullable=False),
        sa.Column('host', sa.String(length=300), nullable=True),
        sa.Column('since', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('noticed_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('source', 'destination', name=op.f('pk_link_outages')),
    )


def downgrade() -> None:
    op.drop_table('link_outages')
