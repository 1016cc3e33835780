"""copy found bad at: when a physical copy was last found corrupt or missing

Set (UTC) whenever a copy's status becomes ``corrupt`` or ``missing`` (a fixity check,
``packhorse verify``, a read that found it gone, a location replaced by empty storage), so
``status`` says since when a package with no good source left has been blocked, not when its
copies were written. ``NULL`` for copies found bad before this revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 14:30:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('physical_copies') as batch:
        batch.add_column(sa.Column('found_bad_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('physical_copies') as batch:
        batch.drop_column('found_bad_at')
