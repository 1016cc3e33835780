"""azure storage type: data locations may be Azure Blob containers (``storage = "azure"``)

The check constraint on ``data_locations.storage_type`` admits ``'azure'`` beside ``'disk'``
and ``'s3'`` (:class:`packhorse.domain.StorageType`). No row changes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 20:20:00
"""
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('data_locations', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_data_locations_storage_type'), type_='check')
        batch_op.create_check_constraint(op.f('ck_data_locations_storage_type'),
                                         "storage_type IN ('disk', 's3', 'azure')")


def downgrade() -> None:
    with op.batch_alter_table('data_locations', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_data_locations_storage_type'), type_='check')
        batch_op.create_check_constraint(op.f('ck_data_locations_storage_type'), "storage_type IN ('disk', 's3')")
