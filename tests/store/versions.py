"""Reading and setting a database's schema version row directly (as another release of
agio-grpc would leave it), for the tests of what the store does with it."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from agio_grpc.store.migrations import VERSION_TABLE


async def set_version(url: str, revision: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(f'UPDATE "{VERSION_TABLE}" SET version_num = :revision'),
                {"revision": revision},
            )
    finally:
        await engine.dispose()


async def versions_of(url: str) -> list[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text(f'SELECT version_num FROM "{VERSION_TABLE}"'))
            return [str(revision) for (revision,) in rows]
    finally:
        await engine.dispose()
