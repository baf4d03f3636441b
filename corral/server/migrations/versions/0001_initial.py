"""The store's tables as corral made them before Alembic (schema_version "1", commit b2db32f).

Written out column by column, not taken from corral.server.store's metadata: what 0001 makes must
not change when the tables in store.py do (a later change is a later revision).

A database made before Alembic has no alembic_version, so it starts here too: a table it has is
kept, and what an older version's table lacks is added (the legacy step, the additive migration
that earlier versions ran at every start): a missing nullable column, empty, and a missing index.
A missing NOT NULL column cannot be added so, and stops the upgrade.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from corral.server.migrations import SchemaError

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def tables() -> list[tuple[str, list[Any]]]:
    """Each table's columns and constraints, made anew on each call (a Column joins one table)."""
    return [
        (
            "jobs",
            [
                sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
                sa.Column("name", sa.String(), nullable=False),
                sa.Column("user", sa.String(), nullable=False),
                sa.Column("vc", sa.String(), nullable=False),
                sa.Column("priority", sa.String(), nullable=False),
                sa.Column("gpus", sa.Integer(), nullable=False),
                sa.Column("spec", sa.Text(), nullable=False),
                sa.Column("status", sa.String(), nullable=False),
                sa.Column("reason", sa.Text(), nullable=False),
                sa.Column("submitted_at", sa.Double(), nullable=False),
                sa.Column("started_at", sa.Double(), nullable=True),
                sa.Column("finished_at", sa.Double(), nullable=True),
                sa.Column("attempts", sa.Integer(), nullable=False),
                sa.Column("failures", sa.Integer(), nullable=False),
                sa.Column("preemptions", sa.Integer(), nullable=False),
                sa.Column("attained_gpu_s", sa.Double(), nullable=False),
                sa.Column("executed_s", sa.Double(), nullable=False),
                sa.Column("exit_code", sa.Integer(), nullable=True),
                sa.Column("unix_user", sa.String(), nullable=True),
                sa.Column("workers", sa.Integer(), nullable=True),
                sa.Column("step", sa.Double(), nullable=True),
                sa.Column("total_steps", sa.Double(), nullable=True),
                sa.Column("steps_per_s", sa.Double(), nullable=True),
                sa.Column("loss", sa.Double(), nullable=True),
                sa.Column("progress_at", sa.Double(), nullable=True),
                sa.PrimaryKeyConstraint("id"),
            ],
        ),
        (
            "attempts",
            [
                sa.Column("job_id", sa.Integer(), nullable=False),
                sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
                sa.Column("gpus", sa.Text(), nullable=False),
                sa.Column("started_at", sa.Double(), nullable=False),
                sa.Column("ended_at", sa.Double(), nullable=True),
                sa.Column("state", sa.String(), nullable=False),
                sa.Column("outcome", sa.String(), nullable=True),
                sa.Column("exit_code", sa.Integer(), nullable=True),
                sa.Column("reason", sa.Text(), nullable=False),
                sa.Column("prerun", sa.Boolean(), nullable=True),
                sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
                sa.PrimaryKeyConstraint("job_id", "number"),
            ],
        ),
        (
            "events",
            [
                sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
                sa.Column("job_id", sa.Integer(), nullable=True),
                sa.Column("at", sa.Double(), nullable=False),
                sa.Column("kind", sa.String(), nullable=False),
                sa.Column("message", sa.Text(), nullable=False),
                sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
                sa.PrimaryKeyConstraint("id"),
            ],
        ),
        (
            "tokens",
            [
                sa.Column("sha256", sa.String(length=64), nullable=False),
                sa.Column("user", sa.String(), nullable=False),
                sa.Column("vc", sa.String(), nullable=True),
                sa.Column("admin", sa.Boolean(), nullable=False),
                sa.Column("created_at", sa.Double(), nullable=False),
                sa.Column("name", sa.String(), nullable=True),
                sa.Column("expires_at", sa.Double(), nullable=True),
                sa.Column("revoked_at", sa.Double(), nullable=True),
                sa.Column("unix_user", sa.String(), nullable=True),
                sa.PrimaryKeyConstraint("sha256"),
            ],
        ),
        (
            "progress",
            [
                sa.Column("job_id", sa.Integer(), nullable=False),
                sa.Column("attempt", sa.Integer(), autoincrement=False, nullable=False),
                sa.Column("at", sa.Double(), nullable=False),
                sa.Column("step", sa.Double(), nullable=False),
                sa.Column("loss", sa.Double(), nullable=True),
                sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
                sa.PrimaryKeyConstraint("job_id", "attempt", "at"),
            ],
        ),
        (
            "profiles",
            [
                sa.Column("model", sa.String(), nullable=False),
                sa.Column("gpu_type", sa.String(), nullable=False),
                sa.Column("gpus", sa.Integer(), autoincrement=False, nullable=False),
                sa.Column("nodes", sa.Integer(), autoincrement=False, nullable=False),
                sa.Column("colocated", sa.String(), nullable=False),
                sa.Column("steps_per_s", sa.Double(), nullable=False),
                sa.Column("samples_per_s", sa.Double(), nullable=True),
                sa.Column("seconds", sa.Double(), nullable=False),
                sa.Column("runs", sa.Integer(), nullable=False),
                sa.Column("updated_at", sa.Double(), nullable=False),
                sa.PrimaryKeyConstraint("model", "gpu_type", "gpus", "nodes", "colocated"),
            ],
        ),
        (
            "meta",
            [
                sa.Column("key", sa.String(), nullable=False),
                sa.Column("value", sa.Text(), nullable=False),
                sa.PrimaryKeyConstraint("key"),
            ],
        ),
    ]


#: (name, table, columns) of each index.
INDEXES = [
    ("ix_jobs_user", "jobs", ["user"]),
    ("ix_jobs_vc", "jobs", ["vc"]),
    ("ix_jobs_status", "jobs", ["status"]),
    ("ix_events_job_id", "events", ["job_id"]),
]


def upgrade() -> None:
    bind = op.get_bind()
    for name, items in tables():
        if not sa.inspect(bind).has_table(name):
            op.create_table(name, *items)
            continue
        # The legacy step: a table of a database made before Alembic.
        present = {column["name"] for column in sa.inspect(bind).get_columns(name)}
        for column in items:
            if not isinstance(column, sa.Column) or column.name in present:
                continue
            if not column.nullable:
                raise SchemaError(f"table {name} lacks column {column.name} (NOT NULL)")
            op.add_column(name, column)
    for index, table, columns in INDEXES:
        if index not in {found["name"] for found in sa.inspect(bind).get_indexes(table)}:
            op.create_index(index, table, columns)


def downgrade() -> None:
    for name, _ in reversed(tables()):
        op.drop_table(name)
