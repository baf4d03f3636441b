"""Alembic's environment for corral's store, run by alembic.command with the connection in
`config.attributes["connection"]` (corral.server.migrations); online only: no --sql."""

from __future__ import annotations

from alembic import context

from corral.server.store import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite alters most of a table only by copying it: batch operations do that.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
# Inside the caller's transaction (upgrade_to_head begins it, with its lock) this begins nothing.
with context.begin_transaction():
    context.run_migrations()
