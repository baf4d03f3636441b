"""profiles: vc (each VC's measurements its own); shared_models (issue 30)

A measurement belongs to the VC whose jobs made it, so `vc` joins the profiles' primary key. The
rows already there were measured before corral told VCs apart: they keep `vc` "" (no VC's), which
every VC reads where it measured nothing itself. `shared_models` lists the models an admin marked
shared (every VC reads every VC's measurements of them).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27 13:18:16.245609
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_KEY = ["model", "gpu_type", "gpus", "nodes", "colocated"]
NEW_KEY = [*OLD_KEY, "vc"]
VALUES = ["steps_per_s", "samples_per_s", "seconds", "runs", "updated_at"]


def _columns(key: list[str]) -> list[Any]:
    """The profiles table's columns with primary key `key`."""
    columns = [
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("gpu_type", sa.String(), nullable=False),
        sa.Column("gpus", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("nodes", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("colocated", sa.String(), nullable=False),
    ]
    if "vc" in key:
        columns.append(sa.Column("vc", sa.String(), server_default="", nullable=False))
    return [
        *columns,
        sa.Column("steps_per_s", sa.Double(), nullable=False),
        sa.Column("samples_per_s", sa.Double(), nullable=True),
        sa.Column("seconds", sa.Double(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
    ]


def _primary_key(key: list[str]) -> None:
    """Give `profiles` the primary key `key`, with the column `vc` where the key has it."""
    if op.get_bind().dialect.name == "sqlite":  # SQLite changes a key only by copying the table
        op.create_table("_profiles_new", *_columns(key), sa.PrimaryKeyConstraint(*key))
        kept = ", ".join(OLD_KEY + VALUES)
        op.execute(sa.text(f"INSERT INTO _profiles_new ({kept}) SELECT {kept} FROM profiles"))
        op.drop_table("profiles")
        op.rename_table("_profiles_new", "profiles")
        return
    op.drop_constraint("profiles_pkey", "profiles", type_="primary")
    if "vc" in key:
        op.add_column("profiles", sa.Column("vc", sa.String(), server_default="", nullable=False))
    else:
        op.drop_column("profiles", "vc")
    op.create_primary_key("profiles_pkey", "profiles", key)


def upgrade() -> None:
    op.create_table(
        "shared_models",
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("marked_by", sa.String(), nullable=False),
        sa.Column("marked_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("model"),
    )
    _primary_key(NEW_KEY)


def downgrade() -> None:
    # The old key holds one row per shape: each VC's own measurements go, those of no VC stay.
    op.execute(sa.text("DELETE FROM profiles WHERE vc <> ''"))
    _primary_key(OLD_KEY)
    op.drop_table("shared_models")
