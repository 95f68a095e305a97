"""`agio-grpc keys create|list|revoke` on the store of AGIO_DATABASE_URL (SQLite and
PostgreSQL), and a server in `auth.mode: api_key` taking and refusing the keys they make."""

from __future__ import annotations

import json

import pytest

from agio_grpc.testing import FakeModelServer
from tests.cli.conftest import Cli
from tests.service.auth_helpers import (
    auth_settings,
    bearer,
    refusal,
    serving,
    unauthenticated,
    whoami,
)


@pytest.fixture
def keys_cli(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    """`agio-grpc ...` with AGIO_DATABASE_URL naming the store under test."""
    monkeypatch.setenv("AGIO_DATABASE_URL", store_url)
    for name in ("AGIO_CONFIG", "AGIO_AUTH"):
        monkeypatch.delenv(name, raising=False)
    return Cli("", capsys, monkeypatch)


async def test_a_created_key_is_the_last_line_and_the_server_takes_it(
    keys_cli: Cli, store_url: str, fake_model: FakeModelServer
) -> None:
    made = await keys_cli("keys", "create", "--tenant", "acme", "--name", "ci", address=False)
    assert made.code == 0, made.err
    token = made.last_line
    assert token.startswith("agio_")
    key_id = token.split("_")[1]
    assert made.out.splitlines()[0].startswith(f"{key_id}  tenant acme  created ")
    assert "shown this once" in made.err

    auth = {"mode": "api_key", "api_key": {"cache_s": 0}}
    async with serving(auth_settings(store_url, fake_model.base_url, auth=auth)) as app:
        assert await whoami(app.address, bearer(token)) == f"acme|{key_id}|api_key"

        revoked = await keys_cli("keys", "revoke", key_id, address=False)
        assert revoked.code == 0, revoked.err
        assert "REVOKED" in revoked.out
        assert unauthenticated(await refusal(app.address, bearer(token))) == "KEY_REVOKED"


async def test_keys_are_listed_newest_first_by_tenant_and_as_json(keys_cli: Cli) -> None:
    first = await keys_cli("keys", "create", "--tenant", "acme", address=False)
    second = await keys_cli("keys", "create", "--tenant", "globex", "--json", address=False)
    assert second.code == 0, second.err
    document = json.loads(second.last_line)
    assert document["key"].startswith(f"agio_{document['api_key']['id']}_")
    assert document["api_key"]["tenant"] == "globex"
    assert document["api_key"]["revoke_time"] is None
    assert "secret_hash" not in document["api_key"]

    listed = await keys_cli("keys", "list", address=False)
    assert listed.code == 0, listed.err
    ids = [line.split()[0] for line in listed.out.splitlines()]
    assert ids == [document["api_key"]["id"], first.last_line.split("_")[1]]
    assert first.last_line not in listed.out  # the secret is never shown again

    acme = json.loads(
        (await keys_cli("keys", "list", "--tenant", "acme", "--json", address=False)).out
    )
    assert [key["tenant"] for key in acme["api_keys"]] == ["acme"]
    assert acme["api_keys"][0]["create_time"].endswith("Z")


async def test_revoking_an_unknown_key_fails(keys_cli: Cli) -> None:
    result = await keys_cli("keys", "revoke", "0123456789ab", address=False)
    assert result.code == 1
    assert result.err.strip() == "agio-grpc: no API key '0123456789ab'"


@pytest.mark.parametrize(
    "args",
    [("keys", "create"), ("keys", "create", "--tenant", " padded"), ("keys",)],
    ids=["no-tenant", "bad-tenant", "no-action"],
)
async def test_a_usage_error_exits_2(keys_cli: Cli, args: tuple[str, ...]) -> None:
    assert (await keys_cli(*args, address=False)).code == 2


async def test_a_store_that_cannot_open_is_one_line(
    keys_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGIO_DATABASE_URL", "sqlite+aiosqlite:////no/such/directory/agio.db")
    result = await keys_cli("keys", "list", address=False)
    assert result.code == 1
    [line] = result.err.splitlines()
    assert line.startswith("agio-grpc: cannot open the store: cannot open the SQLite database")
