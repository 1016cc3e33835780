"""service pid namespace: which process namespace a service's pid belongs to

``packhorse health`` takes a service of this host whose process no longer runs for dead at
once. A container with the same hostname has pids of its own: ``pid_namespace`` (the kernel
boot and pid namespace, ``packhorse.operations.identity.process_namespace``) says whose pids a row's
are; a row of another namespace is judged by the age of its heartbeat alone. Existing rows
have none and are judged as before (their next heartbeat records it).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 22:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pid_namespace', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('service_heartbeats', schema=None) as batch_op:
        batch_op.drop_column('pid_namespace')
