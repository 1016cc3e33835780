"""operator surface: api tokens, audit log, runtime settings, live checks

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 01:02:25.905415
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('last_used_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role IN ('observer', 'admin')", name=op.f('ck_api_tokens_role')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('name', name=op.f('uq_api_tokens_name')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=100), nullable=False),
    sa.Column('target', sa.Text(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=True),
    sa.Column('result', sa.String(length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=True),
    sa.CheckConstraint("result IN ('ok', 'refused', 'error')", name=op.f('ck_audit_log_result')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_at'), ['at'], unique=False)

    op.create_table('live_checks',
    sa.Column('correlation_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('operation_id', sa.Integer(), nullable=False),
    sa.Column('requested_by', sa.String(length=200), nullable=False),
    sa.Column('requested_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.CheckConstraint("kind IN ('raw_data_package', 'data_transfer_package', 'transfer', 'unpack', 'long_term_archive', 'staging', 'deletion', 'fixity_check')", name=op.f('ck_live_checks_kind')),
    sa.CheckConstraint("state IN ('pending', 'done', 'failed')", name=op.f('ck_live_checks_state')),
    sa.PrimaryKeyConstraint('correlation_id', name=op.f('pk_live_checks'))
    )
    with op.batch_alter_table('live_checks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_live_checks_expires_at'), ['expires_at'], unique=False)

    op.create_table('runtime_settings',
    sa.Column('key', sa.String(length=100), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('updated_at', packhorse.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_by', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_runtime_settings'))
    )


def downgrade() -> None:
    op.drop_table('runtime_settings')
    with op.batch_alter_table('live_checks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_live_checks_expires_at'))

    op.drop_table('live_checks')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_at'))

    op.drop_table('audit_log')
    op.drop_table('api_tokens')
