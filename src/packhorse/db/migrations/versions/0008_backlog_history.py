"""backlog history for the dashboard's charts; indexes for its time windows

``backlog_samples`` holds, per operation kind and sampling interval, how many operations were
waiting, running and failed (bounded: rows older than ``[api] history_keep_days`` are deleted
at each sample). Throughput and failures over time are read from ``operations.lifecycle.finished_at``
and ``failure_events.created_at``, which get indexes so a window is an index range, not a scan;
"where is my file?" finds a folder's files and packages by ``group_path`` (two more indexes).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 11:20:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

KINDS = ("'raw_data_package', 'data_transfer_package', 'transfer', 'unpack', 'long_term_archive', "
         "'staging', 'deletion', 'fixity_check'")


def upgrade() -> None:
    op.create_table('backlog_samples',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('measured_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('waiting', sa.Integer(), nullable=False),
    sa.Column('running', sa.Integer(), nullable=False),
    sa.Column('failed', sa.Integer(), nullable=False),
    sa.CheckConstraint(f"kind IN ({KINDS})", name=op.f('ck_backlog_samples_kind')),
    sa.CheckConstraint('waiting >= 0 AND running >= 0 AND failed >= 0', name=op.f('ck_backlog_samples_counts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_backlog_samples')),
    sa.UniqueConstraint('measured_at', 'kind', name=op.f('uq_backlog_samples_measured_at'))
    )
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.create_index('ix_operations_status_finished', ['status', 'finished_at'], unique=False)
    with op.batch_alter_table('failure_events', schema=None) as batch_op:
        batch_op.create_index('ix_failure_events_created_at', ['created_at'], unique=False)
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.create_index('ix_raw_data_files_location_group', ['location_id', 'group_path'], unique=False)
    with op.batch_alter_table('raw_data_packages', schema=None) as batch_op:
        batch_op.create_index('ix_raw_data_packages_group_path', ['group_path'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('raw_data_packages', schema=None) as batch_op:
        batch_op.drop_index('ix_raw_data_packages_group_path')
    with op.batch_alter_table('raw_data_files', schema=None) as batch_op:
        batch_op.drop_index('ix_raw_data_files_location_group')
    with op.batch_alter_table('failure_events', schema=None) as batch_op:
        batch_op.drop_index('ix_failure_events_created_at')
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.drop_index('ix_operations_status_finished')
    op.drop_table('backlog_samples')
