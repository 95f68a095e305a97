"""`auth.mode: api_key`: bearer keys made with `agio-grpc keys create`, checked against the
store's hashes.

A key is looked up by its id and its secret's SHA-256 compared in constant time. A key found
is remembered `auth.api_key.cache_s` (default 5 s), so a call costs a hash and a dictionary
look-up, not a database read; calls that find it stale while it is read again wait for that
one read. A revoked key is therefore refused at most `cache_s` after `agio-grpc keys revoke`,
on every server. Ids that name no key are not remembered (each costs a read by primary key).

A key's `last_used_time` is written in the background at most once a minute per key (the
statement itself skips a write another server made within the minute), never on a call's
path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from agio_grpc.config import AuthMode
from agio_grpc.domain import utc_now
from agio_grpc.service.errors import (
    CREDENTIALS_INVALID,
    KEY_REVOKED,
    unauthenticated,
)
from agio_grpc.service.identity import Caller
from agio_grpc.store.errors import StoreError
from agio_grpc.store.keys import USE_RECORD_INTERVAL, ApiKey, KeyStore, parse_api_key

log = logging.getLogger(__name__)

_RECORD_INTERVAL_S = USE_RECORD_INTERVAL.total_seconds()


@dataclass(slots=True)
class _Known:
    """A key as last read, and when to read it again and record its use next."""

    key: ApiKey
    fresh_until: float
    record_use_after: float


class ApiKeyVerifier:
    """Verifies `agio_<id>_<secret>` keys against a KeyStore."""

    mode: AuthMode = "api_key"

    def __init__(
        self, keys: KeyStore, cache_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._keys = keys
        self._cache_s = cache_s
        self._clock = clock
        self._known: dict[str, _Known] = {}
        self._reading: dict[str, asyncio.Task[_Known | None]] = {}
        self._recording: set[asyncio.Task[None]] = set()

    async def verify(self, token: str) -> Caller:
        parsed = parse_api_key(token)
        if parsed is None:
            raise unauthenticated(CREDENTIALS_INVALID, self.mode, "not an agio API key")
        key_id, secret = parsed
        known = await self._lookup(key_id)
        # The secret is checked first: only its holder learns that a key was revoked.
        if known is None or not known.key.matches(secret):
            raise unauthenticated(CREDENTIALS_INVALID, self.mode, "unknown key or wrong secret")
        if known.key.revoked:
            raise unauthenticated(KEY_REVOKED, self.mode, f"key {key_id}")
        self._record_use(known)
        return Caller(known.key.tenant, known.key.id, self.mode)

    async def close(self) -> None:
        """Wait for the use records being written."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)

    async def _lookup(self, key_id: str) -> _Known | None:
        known = self._known.get(key_id)
        if known is not None and self._clock() < known.fresh_until:
            return known
        reading = self._reading.get(key_id)
        if reading is None:
            reading = asyncio.create_task(self._read(key_id))
            self._reading[key_id] = reading
            reading.add_done_callback(lambda done: self._read_done(key_id, done))
        # Shielded: a caller that leaves does not cancel the read the others wait for.
        return await asyncio.shield(reading)

    async def _read(self, key_id: str) -> _Known | None:
        key = await self._keys.find(key_id)
        if key is None:
            self._known.pop(key_id, None)
            return None
        now = self._clock()
        previous = self._known.get(key_id)
        record_after = now
        if key.last_used_time is not None:
            since = (utc_now() - key.last_used_time).total_seconds()
            record_after = now + max(_RECORD_INTERVAL_S - since, 0.0)
        if previous is not None:
            record_after = max(record_after, previous.record_use_after)
        known = _Known(key, now + self._cache_s, record_after)
        self._known[key_id] = known
        return known

    def _read_done(self, key_id: str, done: asyncio.Task[_Known | None]) -> None:
        self._reading.pop(key_id, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have left

    def _record_use(self, known: _Known) -> None:
        now = self._clock()
        if now < known.record_use_after:
            return
        known.record_use_after = now + _RECORD_INTERVAL_S
        task = asyncio.create_task(self._write_use(known.key.id))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _write_use(self, key_id: str) -> None:
        try:
            await self._keys.record_use(key_id)
        except StoreError as error:
            log.warning("could not record the use of API key %s: %s", key_id, error)
