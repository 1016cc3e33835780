"""file confirmed mtime: the source mtime at which a scan last found a registration's bytes

Set when a scan hashes a registered file whose mtime changed and finds the registered bytes (a
``touch``, a copy that did not keep mtimes): the next scans take ``(size, confirmed_mtime_ns)``
as unchanged, so such a file is hashed once, not again at every full scan. ``mtime_ns`` stays
the mtime the package's tar holds (I3). ``NULL`` until a scan confirms one.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 18:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('raw_data_files') as batch:
        batch.add_column(sa.Column('confirmed_mtime_ns', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('raw_data_files') as batch:
        batch.drop_column('confirmed_mtime_ns')
