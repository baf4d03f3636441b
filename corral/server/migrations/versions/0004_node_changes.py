"""node_changes: every change of a node's state (issue 33: drain, resume; joined, left, ...)

A drained node stays drained over a restart: the manager takes its drains from this table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27 22:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("preempt", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_node_changes_node"), "node_changes", ["node"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_node_changes_node"), table_name="node_changes")
    op.drop_table("node_changes")
