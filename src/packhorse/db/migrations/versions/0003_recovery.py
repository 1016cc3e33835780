"""recovery: circuit breakers, service heartbeats, reconcile count

One circuit breaker per (kind, operation); one health heartbeat row per service process;
``operations.lifecycle.reconcile_count`` counts the reconciler's re-dispatches (never a retry).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 01:01:19.405378
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('service_heartbeats',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('service', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_seen', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_service_heartbeats')),
    sa.UniqueConstraint('service', name=op.f('uq_service_heartbeats_service'))
    )
    op.create_table('circuit_breakers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('operation_id', sa.Integer(), nullable=False),
    sa.Column('stall_count', sa.Integer(), nullable=False),
    sa.Column('last_stall_attempt', sa.Integer(), nullable=False),
    sa.Column('last_stall_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('opened_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('closes_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.CheckConstraint("kind IN ('raw_data_package', 'data_transfer_package', 'transfer', 'unpack', 'long_term_archive', 'staging', 'deletion', 'fixity_check')", name=op.f('ck_circuit_breakers_kind')),
    sa.ForeignKeyConstraint(['operation_id'], ['operations.id'], name=op.f('fk_circuit_breakers_operation_id_operations')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_circuit_breakers')),
    sa.UniqueConstraint('kind', 'operation_id', name=op.f('uq_circuit_breakers_kind'))
    )
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reconcile_count', sa.Integer(), server_default='0', nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('operations', schema=None) as batch_op:
        batch_op.drop_column('reconcile_count')

    op.drop_table('circuit_breakers')
    op.drop_table('service_heartbeats')
