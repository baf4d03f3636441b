"""jobs: held_by, array_id, array_index (hold/release and job arrays, issue 15)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 06:09:17.464957
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("held_by", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("array_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("array_index")
        batch_op.drop_column("array_id")
        batch_op.drop_column("held_by")
