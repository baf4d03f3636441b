"""Fixtures shared by the server's tests: a real PostgreSQL server (see tests/server/postgres.py)."""

from tests.server.postgres import postgres_server, postgres_url  # noqa: F401
