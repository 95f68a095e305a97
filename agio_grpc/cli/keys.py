"""`agio-grpc keys create|list|revoke`: the API keys of `auth.mode: api_key`.

The commands work on the store itself, as `serve` opens it (AGIO_DATABASE_URL, or the
`database_url` of AGIO_CONFIG; migrated to head first), not through a server: whoever can
reach the database manages the keys. `create` prints the new key as the last line of stdout,
the only time it is ever shown (the store keeps its hash). Exit codes: 0 done, 1 the store
could not be opened or the key does not exist, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agio_grpc.store.errors import NotFoundError

if TYPE_CHECKING:
    from agio_grpc.config import Settings
    from agio_grpc.store.keys import ApiKey, KeyStore

KeysCommand = Callable[["KeyStore", argparse.Namespace], Awaitable[int]]


def add_keys_parser(top: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`keys create|list|revoke` under the top-level parser."""
    keys = top.add_parser(
        "keys",
        help="create, list or revoke API keys (auth.mode api_key; uses AGIO_DATABASE_URL)",
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="one JSON document on stdout")

    create = keys.add_parser(
        "create",
        parents=[as_json],
        help="make a key for a tenant; prints it as the last line (the only time it is shown)",
    )
    create.add_argument("--tenant", required=True, help="the tenant every call with it is in")
    create.add_argument("--name", default="", help="what the key is for (shown in listings)")
    create.set_defaults(keys_command=create_key)

    listed = keys.add_parser("list", parents=[as_json], help="every key, newest first")
    listed.add_argument("--tenant", default=None, help="only this tenant's keys")
    listed.set_defaults(keys_command=list_keys)

    revoke = keys.add_parser(
        "revoke", parents=[as_json], help="refuse a key from now on (servers: within cache_s)"
    )
    revoke.add_argument("key_id", metavar="ID", help="the key's id (agio_<ID>_...)")
    revoke.set_defaults(keys_command=revoke_key)


def cmd_keys(args: argparse.Namespace) -> int:
    """Run one `keys` command on the configured store."""
    # Imported here: the other commands never need the store or the settings.
    from pydantic import ValidationError

    from agio_grpc.cli.serve import configuration_lines
    from agio_grpc.config import Settings
    from agio_grpc.service.startup import StartupError, one_line
    from agio_grpc.store.errors import StoreError

    try:
        settings = Settings()
    except ValidationError as error:
        _say(*configuration_lines(error))
        return 2
    except (FileNotFoundError, ValueError) as error:
        _say(f"invalid configuration: {one_line(error)}")
        return 2
    command: KeysCommand = args.keys_command
    try:
        return asyncio.run(_on_store(settings, command, args))
    except StartupError as error:
        _say(f"cannot open the store: {error}")
        return 1
    except StoreError as error:
        _say(one_line(error))
        return 1


async def _on_store(settings: Settings, command: KeysCommand, args: argparse.Namespace) -> int:
    from agio_grpc.service.startup import opening_store
    from agio_grpc.store.sql import open_store

    with opening_store(settings.database_url):
        store = await open_store(
            settings.database_url, sqlite_synchronous=settings.sqlite_synchronous
        )
    try:
        return await command(store.keys(), args)
    finally:
        await store.close()


async def create_key(keys: KeyStore, args: argparse.Namespace) -> int:
    try:
        issued = await keys.create(args.tenant, args.name)
    except ValueError as error:
        _say(str(error))
        return 2
    if args.json:
        _json({"api_key": _key_dict(issued.key), "key": issued.token})
    else:
        print(_key_line(issued.key))
        print(issued.token, flush=True)
    _say(
        "the key is shown this once: keep it secret "
        f"(revoke it with `agio-grpc keys revoke {issued.key.id}`)"
    )
    return 0


async def list_keys(keys: KeyStore, args: argparse.Namespace) -> int:
    found = await keys.list_keys(args.tenant)
    if args.json:
        _json({"api_keys": [_key_dict(key) for key in found]})
    else:
        for key in found:
            print(_key_line(key))
    return 0


async def revoke_key(keys: KeyStore, args: argparse.Namespace) -> int:
    try:
        key = await keys.revoke(args.key_id)
    except NotFoundError:
        _say(f"no API key {args.key_id!r}")
        return 1
    if args.json:
        _json({"api_key": _key_dict(key)})
    else:
        print(_key_line(key))
    return 0


def _key_line(key: ApiKey) -> str:
    used = _shown(key.last_used_time) if key.last_used_time else "never"
    parts = [key.id, f"tenant {key.tenant}", f"created {_shown(key.create_time)}"]
    parts.append(f"used {used}")
    if key.revoke_time is not None:
        parts.append(f"REVOKED {_shown(key.revoke_time)}")
    if key.name:
        parts.append(key.name)
    return "  ".join(parts)


def _shown(time: datetime) -> str:
    """UTC, to the second, as the other commands show times."""
    return time.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="seconds")


def _key_dict(key: ApiKey) -> dict[str, Any]:
    """A key as JSON: everything but its secret's hash."""
    return {
        "id": key.id,
        "tenant": key.tenant,
        "name": key.name,
        "create_time": _rfc3339(key.create_time),
        "last_used_time": _rfc3339(key.last_used_time),
        "revoke_time": _rfc3339(key.revoke_time),
    }


def _rfc3339(time: datetime | None) -> str | None:
    if time is None:
        return None
    return time.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _json(document: dict[str, Any]) -> None:
    print(json.dumps(document, ensure_ascii=False), flush=True)


def _say(*lines: str) -> None:
    for line in lines:
        print(f"agio-grpc: {line}", file=sys.stderr)
