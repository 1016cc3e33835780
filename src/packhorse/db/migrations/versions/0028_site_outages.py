"""site outages: a site the centre cannot reach (every worker's heartbeat dead), one row per cut

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06 00:35:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'site_outages',
        sa.Column('site', sa.String(length=100), nullable=False),
        sa.Column('since', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('noticed_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('site', name=op.f('pk_site_outages')),
    )


def downgrade() -> None:
    op.drop_table('site_outages')
