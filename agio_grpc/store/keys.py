"""API keys of `auth.mode: api_key`: how a key is made, written and read back.

A key is `agio_<id>_<secret>`: a random 12-hex-digit id, which names the key in listings and
logs, and a secret of 32 random bytes (URL-safe base64). The store keeps the SHA-256 of the
secret (hex), never the secret itself: the caller is shown the whole key once, when it is
made. Random secrets of this size need no slow password hash; a verifier looks the key up by
its id and compares hashes in constant time.

`KeyStore` runs on the store's `Database` (`SqlStore.keys()`), one transaction per
operation, and raises only `StoreError` subclasses (NotFoundError for an unknown id), or
ValueError for a tenant or name it cannot store. Never imports grpc or the engine.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, insert, or_, select, update

from agio_grpc.domain import is_tenant_name, utc_now
from agio_grpc.store.database import Database
from agio_grpc.store.errors import NotFoundError
from agio_grpc.store.tables import api_keys as key_table

KEY_PREFIX: Final = "agio"
KEY_ID_HEX_DIGITS: Final = 12
SECRET_BYTES: Final = 32
MAX_SECRET_CHARS: Final = 128
MAX_NAME_CHARS: Final = 256
USE_RECORD_INTERVAL: Final = timedelta(minutes=1)
"""A key's `last_used_time` is written at most this often: not once per call."""

_KEY_ID = re.compile(rf"[0-9a-f]{{{KEY_ID_HEX_DIGITS}}}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key: everything but its secret."""

    id: str
    tenant: str
    """The tenant every call made with the key is in."""
    name: str
    """What the key is for, as its maker said ("" when unnamed)."""
    secret_hash: str
    """SHA-256 of the secret, hex."""
    create_time: datetime
    last_used_time: datetime | None
    """When a call last used it (to about a minute), None when never."""
    revoke_time: datetime | None
    """When it was revoked; None while it is valid."""

    @property
    def revoked(self) -> bool:
        return self.revoke_time is not None

    def matches(self, secret: str) -> bool:
        """Whether `secret` is this key's, compared in constant time."""
        return hmac.compare_digest(self.secret_hash, hash_secret(secret))


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A key just made, with the one copy of its secret there will ever be."""

    key: ApiKey
    token: str
    """`agio_<id>_<secret>`: what the caller sends as `authorization: Bearer <token>`."""


def hash_secret(secret: str) -> str:
    """The hex SHA-256 of a key's secret, as stored."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_api_key(token: str) -> tuple[str, str] | None:
    """A key's id and secret, or None when `token` is not shaped like a key."""
    prefix, _, rest = token.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or not _KEY_ID.fullmatch(key_id):
        return None
    if not 0 < len(secret) <= MAX_SECRET_CHARS:
        return None
    return key_id, secret


def _new_token() -> tuple[str, str, str]:
    key_id = secrets.token_hex(KEY_ID_HEX_DIGITS // 2)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return key_id, secret, f"{KEY_PREFIX}_{key_id}_{secret}"


def _key_from_row(row: Any) -> ApiKey:
    return ApiKey(
        id=row.id,
        tenant=row.tenant,
        name=row.name,
        secret_hash=row.secret_hash,
        create_time=row.create_time,
        last_used_time=row.last_used_time,
        revoke_time=row.revoke_time,
    )


class KeyStore:
    """The `api_keys` table. Get one from an opened store: `store.key_store()`."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def create(self, tenant: str, name: str = "") -> IssuedKey:
        """Make a key for `tenant`; the returned token is the only copy of its secret."""
        if not is_tenant_name(tenant):
            raise ValueError(
                f"a tenant is 1 to 256 printable characters without spaces at the ends, "
                f"got {tenant!r}"
            )
        if len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise ValueError(f"a key's name is at most {MAX_NAME_CHARS} printable characters")
        key_id, secret, token = _new_token()
        key = ApiKey(key_id, tenant, name, hash_secret(secret), utc_now(), None, None)

        def work(conn: Connection) -> None:
            conn.execute(
                insert(key_table),
                {
                    "id": key.id,
                    "tenant": key.tenant,
                    "name": key.name,
                    "secret_hash": key.secret_hash,
                    "create_time": key.create_time,
                },
            )

        await self._database.run(work, write=True)
        return IssuedKey(key, token)

    async def find(self, key_id: str) -> ApiKey | None:
        """The key with this id, revoked or not; None when there is none."""
        query = select(key_table).where(key_table.c.id == key_id)
        row = await self._database.run(lambda conn: conn.execute(query).first(), write=False)
        return None if row is None else _key_from_row(row)

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key (of `tenant` when given), newest first, revoked ones included."""
        query = select(key_table).order_by(key_table.c.create_time.desc(), key_table.c.id.desc())
        if tenant is not None:
            query = query.where(key_table.c.tenant == tenant)
        rows = await self._database.run(lambda conn: conn.execute(query).all(), write=False)
        return [_key_from_row(row) for row in rows]

    async def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key from now on; a key revoked already keeps its first revoke time.
        Raises NotFoundError for an unknown id."""
        now = utc_now()

        def work(conn: Connection) -> Any:
            conn.execute(
                update(key_table)
                .where(key_table.c.id == key_id, key_table.c.revoke_time.is_(None))
                .values(revoke_time=now)
            )
            return conn.execute(select(key_table).where(key_table.c.id == key_id)).first()

        row = await self._database.run(work, write=True)
        if row is None:
            raise NotFoundError("api key", key_id)
        return _key_from_row(row)

    async def record_use(self, key_id: str, now: datetime | None = None) -> bool:
        """Set the key's `last_used_time` to `now`, unless it was set less than
        USE_RECORD_INTERVAL before (by this server or another); whether it was written."""
        now = now or utc_now()
        statement = (
            update(key_table)
            .where(
                key_table.c.id == key_id,
                or_(
                    key_table.c.last_used_time.is_(None),
                    key_table.c.last_used_time <= now - USE_RECORD_INTERVAL,
                ),
            )
            .values(last_used_time=now)
        )

        def work(conn: Connection) -> bool:
            return bool(conn.execute(statement).rowcount)

        return await self._database.run(work, write=True)
