"""PostgreSQL and lease helpers shared by the store tests (a module of its own: a
test importing ``conftest`` would get another directory's conftest when the
whole suite runs)."""

from __future__ import annotations

import uuid
from typing import Optional


def libpq_dsn(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def limited_role(url: str, schema: Optional[str]) -> str:
    """A login role like Open WebUI's on PostgreSQL 15 or a managed database,
    on a database of its own: it may not create anything in ``public`` (as
    PostgreSQL 15 has it by default) and, when ``schema`` is given, may
    create in that schema only. Returns the async URL that logs in as it."""
    import psycopg

    name = "owui_" + uuid.uuid4().hex[:10]
    with psycopg.connect(libpq_dsn(url), autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}"')
    _, rest = url.split("://", 1)[1].split("@", 1)
    admin_url = f"postgresql+psycopg://{url.split('://', 1)[1].split('@', 1)[0]}@{rest.rsplit('/', 1)[0]}/{name}"
    pg_admin(admin_url, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    if schema:
        pg_admin(
            admin_url,
            f'CREATE SCHEMA IF NOT EXISTS "{schema}"',
            f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{name}"',
        )
    return f"postgresql+psycopg://{name}@{rest.rsplit('/', 1)[0]}/{name}"


def admin_url_of(role_url: str, admin_url: str) -> str:
    """The superuser's URL on the limited role's database."""
    role_db = role_url.rsplit("/", 1)[1]
    return admin_url.rsplit("/", 1)[0] + "/" + role_db


def pg_admin(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(libpq_dsn(url), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


async def lease_row(store, scope: str) -> Optional[dict]:
    """The lease row of ``scope`` as the database holds it (None: no lease),
    read through the store's own connection and tables."""
    sa, t = await store.table("lease")
    row = (await store.run(lambda conn: conn.execute(sa.select(t).where(t.c.scope == scope)))).mappings().first()
    return dict(row) if row else None
