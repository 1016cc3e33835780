"""indexes for every lookup the managers and stages make by foreign key or by status

Without them a manager cycle read whole tables that grow with the archive (every physical
copy ever made, every operation, every registered file): the deletion manager's "has this copy
a deletion operation?" scanned ``operations`` once per buffer copy, the packaging stage scanned
``raw_data_files`` once per package, and the packaging manager read the location's whole
backlog of unpackaged files once per group.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 08:05:00
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.drop_index('ix_raw_data_files_unpackaged')
        batch_op.create_index('ix_raw_data_files_unpackaged', ['location_id', 'raw_data_package_id', 'group_path'],
                              unique=False)
        batch_op.create_index('ix_raw_data_files_raw_data_package_id', ['raw_data_package_id'], unique=False)
    with op.batch_alter_table('physical_copies', schema=None) as batch_op:
        batch_op.drop_index('ix_physical_copies_location_id')
        batch_op.create_index('ix_physical_copies_location_status', ['location_id', 'status'], unique=False)
        batch_op.create_index('ix_physical_copies_raw_data_package_id', ['raw_data_package_id'], unique=False)
        batch_op.create_index('ix_physical_copies_data_transfer_package_id', ['data_transfer_package_id'],
                              unique=False)
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.create_index('ix_operations_physical_copy_id', ['physical_copy_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.drop_index('ix_operations_physical_copy_id')
    with op.batch_alter_table('physical_copies', schema=None) as batch_op:
        batch_op.drop_index('ix_physical_copies_data_transfer_package_id')
        batch_op.drop_index('ix_physical_copies_raw_data_package_id')
        batch_op.drop_index('ix_physical_copies_location_status')
        batch_op.create_index('ix_physical_copies_location_id', ['location_id'], unique=False)
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.drop_index('ix_raw_data_files_raw_data_package_id')
        batch_op.drop_index('ix_raw_data_files_unpackaged')
        batch_op.create_index('ix_raw_data_files_unpackaged', ['location_id', 'raw_data_package_id'], unique=False)
