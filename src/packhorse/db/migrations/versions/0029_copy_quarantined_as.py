"""physical copies moved aside: where a bad copy's bytes went and when

``physical_copies.quarantined_as``: the key under the copy's data location
(``_packhorse/quarantine/<key>.<UTC stamp>-<random>``) its bytes were moved aside to by the
repair that replaced it; ``physical_copies.quarantined_at``: when (UTC, the database clock).
Both ``None`` on a copy never moved aside. Written in the transaction that records the repair.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06 05:50:00
"""
import sqlalchemy as sa
from alembic import op

import packhorse.db.models

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('physical_copies', schema=None) as batch_op:
        batch_op.add_column(sa.Column('quarantined_as', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('quarantined_at', packhorse.db.models.UTCDateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('physical_copies', schema=None) as batch_op:
        batch_op.drop_column('quarantined_at')
        batch_op.drop_column('quarantined_as')
