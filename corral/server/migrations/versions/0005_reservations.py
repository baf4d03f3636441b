"""reservations: GPUs claimed over a time window for some users or VCs (issue 33)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 01:55:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("start", sa.Double(), nullable=False),
        sa.Column("duration", sa.Double(), nullable=False),
        sa.Column("gpus", sa.Text(), nullable=False),
        sa.Column("users", sa.Text(), nullable=False),
        sa.Column("vcs", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("reservations")
