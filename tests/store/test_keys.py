"""API keys in the store (`KeyStore`), on SQLite and PostgreSQL: only the hash of a secret is
written; keys are found by id, listed newest first, revoked once; use is recorded at most
once a minute."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import select

from agio_grpc.domain import utc_now
from agio_grpc.store.errors import NotFoundError
from agio_grpc.store.keys import KeyStore, parse_api_key
from agio_grpc.store.tables import api_keys
from tests.roles import StoreRoles


@pytest.fixture
def keys(store: StoreRoles) -> KeyStore:
    return store.keys()


async def stored_rows(store: StoreRoles) -> list[dict[str, object]]:
    """Every column of every `api_keys` row, as the database holds it."""
    rows = await store._read(lambda conn: conn.execute(select(api_keys)).mappings().all())
    return [dict(row) for row in rows]


async def test_a_new_key_is_stored_as_the_hash_of_its_secret_only(
    store: StoreRoles, keys: KeyStore
) -> None:
    issued = await keys.create("acme", "ci")

    parsed = parse_api_key(issued.token)
    assert parsed is not None
    key_id, secret = parsed
    assert issued.token == f"agio_{key_id}_{secret}"
    assert key_id == issued.key.id
    assert len(secret) >= 43  # 32 random bytes
    [row] = await stored_rows(store)
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert not any(secret in str(value) for value in row.values())
    assert (row["tenant"], row["name"], row["last_used_time"], row["revoke_time"]) == (
        "acme",
        "ci",
        None,
        None,
    )

    found = await keys.find(key_id)
    assert found == issued.key
    assert found.matches(secret)
    assert not found.matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    assert await keys.find("0123456789ab") is None


async def test_keys_are_listed_newest_first_and_by_tenant(keys: KeyStore) -> None:
    first = await keys.create("acme")
    second = await keys.create("globex", "deploys")
    third = await keys.create("acme", "laptop")

    assert [key.id for key in await keys.list_keys()] == [
        third.key.id,
        second.key.id,
        first.key.id,
    ]
    assert [key.id for key in await keys.list_keys("acme")] == [third.key.id, first.key.id]
    assert await keys.list_keys("nobody") == []


async def test_a_revoked_key_keeps_its_first_revoke_time(keys: KeyStore) -> None:
    issued = await keys.create("acme")
    revoked = await keys.revoke(issued.key.id)
    assert revoked.revoked
    assert revoked.revoke_time is not None
    assert revoked.revoke_time >= issued.key.create_time

    again = await keys.revoke(issued.key.id)
    assert again.revoke_time == revoked.revoke_time
    assert await keys.find(issued.key.id) == revoked
    with pytest.raises(NotFoundError):
        await keys.revoke("0123456789ab")


async def test_use_is_recorded_at_most_once_a_minute(keys: KeyStore) -> None:
    issued = await keys.create("acme")
    now = utc_now()

    assert await keys.record_use(issued.key.id, now)
    assert not await keys.record_use(issued.key.id, now + timedelta(seconds=59))
    found = await keys.find(issued.key.id)
    assert found is not None
    assert found.last_used_time == now

    later = now + timedelta(seconds=61)
    assert await keys.record_use(issued.key.id, later)
    found = await keys.find(issued.key.id)
    assert found is not None
    assert found.last_used_time == later


@pytest.mark.parametrize("tenant", ["", " acme", "ac\x00me", "a\nb", "x" * 257])
async def test_a_tenant_that_cannot_name_one_is_refused(keys: KeyStore, tenant: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        await keys.create(tenant)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "agio",
        "agio_",
        "agio_0123456789ab",
        "agio_0123456789ab_",
        "agio_0123456789AB_secret",
        "agio_0123456789a_secret",
        "sk_0123456789ab_secret",
        "agio_0123456789ab_" + "s" * 129,
    ],
)
def test_a_token_not_shaped_like_a_key_does_not_parse(token: str) -> None:
    assert parse_api_key(token) is None


def test_a_secret_may_hold_underscores() -> None:
    assert parse_api_key("agio_0123456789ab_a_b-c") == ("0123456789ab", "a_b-c")
