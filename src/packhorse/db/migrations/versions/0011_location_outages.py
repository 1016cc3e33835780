"""location outages: data locations whose root or identity marker is missing

One row per unavailable data location while the outage lasts (reason, since, last seen):
operations touching it wait instead of failing, ``status`` lists it as blocked, and the row
is deleted when the location is back (DESIGN.md "Architecture": storage that is absent is not
empty).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 14:00:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('location_outages',
    sa.Column('location_id', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('marker_only', sa.Boolean(), nullable=False),
    sa.Column('since', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('checked_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['location_id'], ['data_locations.id'],
                            name=op.f('fk_location_outages_location_id_data_locations')),
    sa.PrimaryKeyConstraint('location_id', name=op.f('pk_location_outages'))
    )


def downgrade() -> None:
    op.drop_table('location_outages')
