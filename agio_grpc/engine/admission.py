"""`RunSlots`: how many run segments this process runs at once, and the wait for a slot.

A process that takes every run it is asked for shares its event loop and its store among
all of them: past its capacity every run slows down together, until none ends before its
caller's deadline (2,000 simultaneous runs on SQLite: 48 finished in 12 s, the rest ran
out of time with nothing to say why). With slots, a run starts only when one is free; the
others wait in arrival order, each for at most the shorter of half the time to its caller's
deadline and `wait_s`, and are then refused with `ServerBusyError` (RESOURCE_EXHAUSTED).
A run that started ends in its own stop signal (TIMEOUT included), in time.

Each live segment holds one slot, given back when its task ends. A slot is handed straight
to the longest waiter, so a newcomer never overtakes the queue. Runs a session's queue
starts (already accepted) take one without waiting, past the limit if need be. Never
imports grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType

from agio_grpc.engine.errors import ServerBusyError

_WAIT_SHARE = 0.5
"""The part of the time to its deadline a run may spend waiting for a slot: the rest is
its to run in (admitted at the last moment, it would only time out)."""


class Slot:
    """A slot taken for a segment about to start: the segment keeps it (`keep`), or it is
    given back when the `with` block around the start ends."""

    def __init__(self, slots: RunSlots) -> None:
        self._slots: RunSlots | None = slots
        self.kept = False

    def keep(self) -> None:
        """The segment took the slot: it gives it back (`give`) when its task ends."""
        self.kept = True

    def give(self) -> None:
        """Free the slot (once; later calls do nothing)."""
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.give()

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.kept:
            self.give()  # no segment started (refused, queued, or failed): free it


class RunSlots:
    """At most `limit` live segments (None: no limit); waiters served first come first."""

    def __init__(self, limit: int | None, wait_s: float) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self.taken = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def take(self, deadline_at: float | None) -> Slot:
        """A slot, once one is free: waits for half the time to `deadline_at` (event loop
        time) or `wait_s`, whichever is shorter, then raises ServerBusyError."""
        if self.limit is None or (self.taken < self.limit and not self._waiting):
            self.taken += 1
            return Slot(self)
        loop = asyncio.get_running_loop()
        now = loop.time()
        until = now + self.wait_s
        if deadline_at is not None:
            until = min(until, now + (deadline_at - now) * _WAIT_SHARE)
        handed: asyncio.Future[None] = loop.create_future()
        self._waiting.append(handed)
        try:
            async with asyncio.timeout_at(until):
                await handed
        except BaseException as error:
            if handed.done() and not handed.cancelled():
                self.give()  # handed a slot just as it gave up: pass it on
            else:
                with contextlib.suppress(ValueError):  # a hand-over may have skipped it
                    self._waiting.remove(handed)
            if isinstance(error, TimeoutError):
                raise ServerBusyError(self.taken, self.limit or 0, len(self._waiting)) from None
            raise
        return Slot(self)

    def take_now(self) -> Slot:
        """A slot now, past the limit if need be (a run already accepted)."""
        self.taken += 1
        return Slot(self)

    def give(self) -> None:
        """Hand a freed slot to the longest waiter, or free it."""
        while self._waiting:
            handed = self._waiting.popleft()
            if not handed.done():
                handed.set_result(None)
                return
        self.taken -= 1
