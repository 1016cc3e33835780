"""versions of source files and packages; registrations withdrawn before packaging

A file whose bytes change after its package was built is registered again as a new version
(``raw_data_files.version``; the unique key becomes (location, path, version)) and packaged
into a package of that version (``raw_data_packages.version``, name ``<group>+v<k>``).
A registration whose bytes changed or vanished before its package was built is moved to
``withdrawn_files`` with the reason, and the package is built from its other files.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 14:00:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('withdrawn_files',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('location_id', sa.Integer(), nullable=False),
    sa.Column('relative_path', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('mtime_ns', sa.BigInteger(), nullable=False),
    sa.Column('registered_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('package_name', sa.Text(), nullable=False),
    sa.Column('cause', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('withdrawn_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('resolved_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.CheckConstraint("cause IN ('changed', 'vanished')", name=op.f('ck_withdrawn_files_cause')),
    sa.ForeignKeyConstraint(['location_id'], ['data_locations.id'],
                            name=op.f('fk_withdrawn_files_location_id_data_locations')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_withdrawn_files'))
    )
    with op.batch_alter_table('withdrawn_files', schema=None) as batch_op:
        batch_op.create_index('ix_withdrawn_files_location_resolved', ['location_id', 'resolved_at'], unique=False)
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False))
        batch_op.drop_constraint('uq_raw_data_files_location_id', type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_raw_data_files_location_id'),
                                          ['location_id', 'relative_path', 'version'])
    with op.batch_alter_table('raw_data_packages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('raw_data_packages', schema=None) as batch_op:
        batch_op.drop_column('version')
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.drop_constraint('uq_raw_data_files_location_id', type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_raw_data_files_location_id'),
                                          ['location_id', 'relative_path'])
        batch_op.drop_column('version')
    with op.batch_alter_table('withdrawn_files', schema=None) as batch_op:
        batch_op.drop_index('ix_withdrawn_files_location_resolved')
    op.drop_table('withdrawn_files')
