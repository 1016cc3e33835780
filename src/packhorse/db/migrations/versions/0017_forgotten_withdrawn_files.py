"""forgotten withdrawn files: an operator says a file gone before packaging is gone for good

``withdrawn_files`` rows stay listed by ``packhorse status`` (skipped) until the scan registers
the path again. ``packhorse skipped forget`` records who said the file is gone for good, when
and why (``forgotten_by``, ``forgotten_at``, ``forgotten_reason``); such a row is no longer
listed. Existing rows are untouched (none is forgotten).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 22:20:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('withdrawn_files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('forgotten_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('forgotten_by', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('forgotten_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('withdrawn_files', schema=None) as batch_op:
        batch_op.drop_column('forgotten_reason')
        batch_op.drop_column('forgotten_by')
        batch_op.drop_column('forgotten_at')
