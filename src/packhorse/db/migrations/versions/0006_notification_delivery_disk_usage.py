"""notification delivery records and outbox claims (fencing), disk usage samples

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 01:01:51.439310
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('disk_usage_samples',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('location_id', sa.Integer(), nullable=False),
    sa.Column('measured_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('used_bytes', sa.BigInteger(), nullable=False),
    sa.Column('free_bytes', sa.BigInteger(), nullable=False),
    sa.Column('percent', sa.Float(), nullable=False),
    sa.Column('level', sa.String(length=16), nullable=False),
    sa.Column('alert_level', sa.String(length=16), nullable=False),
    sa.CheckConstraint("alert_level IN ('normal', 'warning', 'critical', 'emergency')", name=op.f('ck_disk_usage_samples_alert_level')),
    sa.CheckConstraint("level IN ('normal', 'warning', 'critical', 'emergency')", name=op.f('ck_disk_usage_samples_level')),
    sa.CheckConstraint('total_bytes >= 0 AND used_bytes >= 0 AND free_bytes >= 0', name=op.f('ck_disk_usage_samples_bytes')),
    sa.ForeignKeyConstraint(['location_id'], ['data_locations.id'], name=op.f('fk_disk_usage_samples_location_id_data_locations')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_disk_usage_samples'))
    )
    with op.batch_alter_table('disk_usage_samples', schema=None) as batch_op:
        batch_op.create_index('ix_disk_usage_samples_location_time', ['location_id', 'measured_at'], unique=False)

    op.create_table('notification_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('notification_id', sa.Integer(), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('message_id', sa.String(length=300), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('delivered_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['notification_id'], ['notification_outbox.id'], name=op.f('fk_notification_deliveries_notification_id_notification_outbox')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_deliveries')),
    sa.UniqueConstraint('notification_id', 'channel', name=op.f('uq_notification_deliveries_notification_id'))
    )
    with op.batch_alter_table('notification_outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('claim_token', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch_op.add_column(sa.Column('lease_owner', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('lease_expires_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('notification_outbox', schema=None) as batch_op:
        batch_op.drop_column('lease_expires_at')
        batch_op.drop_column('lease_owner')
        batch_op.drop_column('claim_token')

    op.drop_table('notification_deliveries')
    with op.batch_alter_table('disk_usage_samples', schema=None) as batch_op:
        batch_op.drop_index('ix_disk_usage_samples_location_time')

    op.drop_table('disk_usage_samples')
