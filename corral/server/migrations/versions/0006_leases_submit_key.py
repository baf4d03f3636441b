"""leases: one manager leads a shared database; jobs.submit_key: a submission repeated is one job

`leases` holds one row per leadership (the manager's: name "manager"): who holds it, its epoch
(the fencing token every write of the leader checks) and until when (the database's clock).
`jobs.submit_key` is the client's idempotency key: a submission retried across a failover is
found again instead of stored twice (docs/ha.md).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 01:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    leases = op.create_table(
        "leases",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("renewed_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.bulk_insert(
        leases,
        [
            {
                "name": "manager",
                "holder": "",
                "address": "",
                "epoch": 0,
                "renewed_at": 0.0,
                "expires_at": 0.0,
            }
        ],
    )
    op.add_column("jobs", sa.Column("submit_key", sa.String(), nullable=True))
    op.create_index(op.f("ix_jobs_submit_key"), "jobs", ["submit_key"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_submit_key"), table_name="jobs")
    op.drop_column("jobs", "submit_key")
    op.drop_table("leases")
