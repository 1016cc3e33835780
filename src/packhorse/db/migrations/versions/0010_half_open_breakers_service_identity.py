"""half-open circuit breakers; service health keyed by identity, not by process

``circuit_breakers`` gets an explicit ``state`` (closed / open / half_open), ``half_open_at``
(when the one attempt after the cool-down was let through) and ``trips`` (openings since it last
closed: the cool-down doubles with each); ``closes_at`` becomes ``next_attempt_at`` (an open
breaker no longer closes by itself: it lets one attempt through then). Open breakers keep their
time as the next attempt.

``service_heartbeats`` gets ``site``, ``instance`` and ``restarts``: a service is who it is
(kind, site, host, instance), so a restarted one takes over its dead predecessor's row.
Existing rows (named ``kind@host:pid``) are left to expire.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 13:50:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('circuit_breakers', schema=None) as batch_op:
        batch_op.alter_column('closes_at', new_column_name='next_attempt_at')
        batch_op.add_column(sa.Column('state', sa.String(length=16), server_default='closed', nullable=False))
        batch_op.add_column(sa.Column('half_open_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('trips', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch_op.create_check_constraint(op.f('ck_circuit_breakers_state'),
                                         "state IN ('closed', 'open', 'half_open')")
    op.execute("UPDATE circuit_breakers SET state = 'open', trips = 1 WHERE opened_at IS NOT NULL")
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('site', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('instance', sa.String(length=64), server_default='', nullable=False))
        batch_op.add_column(sa.Column('restarts', sa.Integer(), server_default=sa.text('0'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.drop_column('restarts')
        batch_op.drop_column('instance')
        batch_op.drop_column('site')
    with op.batch_alter_table('circuit_breakers', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_circuit_breakers_state'), type_='check')
        batch_op.drop_column('trips')
        batch_op.drop_column('half_open_at')
        batch_op.drop_column('state')
        batch_op.alter_column('next_attempt_at', new_column_name='closes_at')
