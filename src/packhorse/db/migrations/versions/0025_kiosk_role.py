"""kiosk role: an API token that may read only the problem summary (a wallboard's)

A ``kiosk`` token opens ``/kiosk`` and reads ``GET /api/kiosk``: the problem lines, the
operation totals and which data locations are available; nothing else (no error text, no
paths, no actions).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05 23:40:00
"""
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_api_tokens_role'), type_='check')
        batch_op.create_check_constraint(op.f('ck_api_tokens_role'), "role IN ('kiosk', 'observer', 'admin')")


def downgrade() -> None:
    op.execute("DELETE FROM api_tokens WHERE role = 'kiosk'")
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_api_tokens_role'), type_='check')
        batch_op.create_check_constraint(op.f('ck_api_tokens_role'), "role IN ('observer', 'admin')")
