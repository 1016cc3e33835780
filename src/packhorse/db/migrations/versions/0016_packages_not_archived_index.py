"""packages not archived index: a partial index of raw_data_packages WHERE archived_at IS NULL

The archive manager looks for packages with a present buffer copy that are not archived yet
at every cycle; on PostgreSQL, with 100,000 archived packages, the planner read the whole
table for it (a Seq Scan). The partial index holds only the packages still on their way, so
an idle cycle reads none of the archive's.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 18:45:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_raw_data_packages_not_archived', 'raw_data_packages', ['id'],
                    sqlite_where=sa.text('archived_at IS NULL'), postgresql_where=sa.text('archived_at IS NULL'))


def downgrade() -> None:
    op.drop_index('ix_raw_data_packages_not_archived', table_name='raw_data_packages')
