"""installation: the identity of this packhorse installation (its ops database)

One row, written by the first ``packhorse init``: a uuid that every identity marker this
installation writes carries (``installation``), so a fresh database never takes over a root
another installation marked (its archive, its source): ``packhorse init`` refuses such a root
unless ``--adopt LOCATION`` says this database replaces that installation's.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 14:50:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'installation',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('uuid', sa.String(length=64), nullable=False),
        sa.Column('created_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_installation')),
    )


def downgrade() -> None:
    op.drop_table('installation')
