"""source audits: re-hashing the files still at a source location, a pass at a time

One row per source data location that was audited (its pass: when it started and completed
(UTC), the path it reached, files and bytes checked, files changed behind an unchanged size and
mtime, files gone), and ``raw_data_files.found_by``: ``"source_audit"`` on a version the audit
registered (``None``: the scan).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05 23:40:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('source_audits',
    sa.Column('location', sa.String(length=200), nullable=False),
    sa.Column('started_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('completed_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('cursor', sa.Text(), nullable=True),
    sa.Column('files_checked', sa.Integer(), nullable=False),
    sa.Column('bytes_checked', sa.BigInteger(), nullable=False),
    sa.Column('changed', sa.Integer(), nullable=False),
    sa.Column('gone', sa.Integer(), nullable=False),
    sa.Column('changed_total', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('location', name=op.f('pk_source_audits'))
    )
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('found_by', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.drop_column('found_by')
    op.drop_table('source_audits')
