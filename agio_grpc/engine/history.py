"""`HistoryCache`: the conversations of sessions this process ran lately, kept between runs.

A run reads its session's whole history before its first model call; on a long session that
read is most of what the run pays before the model starts (B5). With the history its
previous run ended with, a new run on the session asks the store only for the steps after
it (`RunLedger.start_run`'s `since`; SubmitToolOutputs and Retry use `get_history_since`),
and the store checks in the same read that the last cached step is still stored at its
sequence. That check is enough: a stored step never changes, deletes (Retry, DeleteSteps)
only cut the end of the log, and a step id is never reused, so when the last cached step is
still there, so is every step before it. A run on another replica, a retry or a deletion in
between is thus seen, never served stale.

What goes in must be the stored log exactly: the loop hands its history over only when the
history was read while its run held the session and the run still held it at its end
(`RunLedger.release_session` says so); a history read before the session was taken, or
extended while another holder rewrote the log, is never kept. Bounded by an estimate of the
memory the cached steps take (`step_bytes`; the least recently used sessions go first), so a
few sessions with long tool outputs cannot take more than a crowd of short ones. Holds only
whole histories (sequences 1..N). Reads the store only through the `SessionLog` a caller
hands it (`read_through`, `decide`).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from agio_grpc.domain import DEFAULT_TENANT, Step
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.store.errors import HistoryChangedError
from agio_grpc.store.log import SessionLog
from agio_grpc.store.records import HistoryMark

T = TypeVar("T")

# What a cached step costs besides its texts: the Step, its StepMetrics, ids and list
# (measured with tracemalloc on decoded history steps: ~400 B, plus the id strings).
STEP_OVERHEAD_BYTES: Final = 512
TOOL_CALL_OVERHEAD_BYTES: Final = 160


def step_bytes(step: Step) -> int:
    """About how much memory a cached step takes: its texts (as Python holds them, so a
    non-ASCII text counts up to 4 bytes a character) and a fixed overhead."""
    size = STEP_OVERHEAD_BYTES + sys.getsizeof(step.content)
    if step.reasoning_content:
        size += sys.getsizeof(step.reasoning_content)
    for call in step.tool_calls:
        size += TOOL_CALL_OVERHEAD_BYTES + sys.getsizeof(call.arguments)
    return size


@dataclass(frozen=True, slots=True)
class CachedHistory:
    """What the cache kept for a session when a run started on it (possibly nothing)."""

    steps: tuple[Step, ...] = ()

    @property
    def mark(self) -> HistoryMark | None:
        """The last cached step, for `RunLedger.start_run(since=...)`."""
        if not self.steps:
            return None
        last = self.steps[-1]
        return HistoryMark(last.sequence, last.id)

    def up_to(self, sequence: int) -> CachedHistory:
        """The cached steps up to `sequence` (what a retry from `sequence + 1` keeps)."""
        return CachedHistory(self.steps[: max(sequence, 0)]) if sequence < len(self.steps) else self

    def join(self, start: int, read: list[Step]) -> list[Step]:
        """The session's whole history: the cached steps, then what the store read after them
        from `start` (`RunStart.history_start`, `HistoryRead.start`); just what it read when
        it read from the start."""
        if start == 1:
            return read
        if not self.steps or self.steps[-1].sequence + 1 != start:
            # The store read after a mark this history did not give: joining would send the
            # model part of a conversation.
            raise ValueError(
                f"the store read from sequence {start}, which does not follow the cached history"
            )
        return [*self.steps, *read]


@dataclass(frozen=True, slots=True)
class _Entry:
    steps: tuple[Step, ...]
    size: int
    """The steps' `step_bytes`, summed."""
    tenant: str
    """The session's tenant (a session never changes tenant)."""


class HistoryCache:
    """Recent sessions' histories, about `max_bytes` of memory in all (0: keep none)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        self._max_bytes = max_bytes
        self._bytes = 0
        self._histories: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        """How many steps are cached, over every session."""
        return sum(len(entry.steps) for entry in self._histories.values())

    @property
    def size(self) -> int:
        """The estimated memory the cached steps take, in bytes (`step_bytes`)."""
        return self._bytes

    def cached(self, session_id: str, *, tenant: str | None = None) -> CachedHistory:
        """What is cached for the session now (a snapshot: later changes do not touch it);
        nothing for a session that is not `tenant`'s (when given)."""
        entry = self._histories.get(session_id)
        if entry is None or (tenant is not None and entry.tenant != tenant):
            return CachedHistory()
        self._histories.move_to_end(session_id)
        return CachedHistory(entry.steps)

    async def decide(
        self,
        store: SessionLog,
        session_id: str,
        decide: Callable[[list[Step], int], Awaitable[T]],
        *,
        tenant: str | None = None,
    ) -> T:
        """`decide(history, cached_steps)` on the session's history as this process last
        saw it (no read), and once more on the history as stored when what it decided was
        refused for a log that changed meanwhile: its write checks the log's last step
        (HistoryChangedError), and a request it found invalid is checked again against the
        stored log. With `tenant`, only on a session of that tenant: another's is read
        from the store, which finds it missing (NotFoundError) before anything is decided."""
        cached = self.cached(session_id, tenant=tenant)
        if cached.steps:
            try:
                return await decide(list(cached.steps), len(cached.steps))
            except (HistoryChangedError, InvalidInputError):
                self.forget(session_id)
        history, kept = await self.read_through(store, session_id, tenant=tenant)
        return await decide(history, kept)

    async def read_through(
        self, store: SessionLog, session_id: str, *, tenant: str | None = None
    ) -> tuple[list[Step], int]:
        """The session's whole history: what is cached, then the steps `store` has after it;
        with how many came from the cache. Raises NotFoundError (also for a session that
        is not `tenant`'s, when given)."""
        cached = self.cached(session_id, tenant=tenant)
        read = await store.get_history_since(session_id, cached.mark, tenant=tenant)
        history = cached.join(read.start, read.steps)
        return history, len(history) - len(read.steps)

    def remember(
        self, session_id: str, history: Sequence[Step], *, tenant: str = DEFAULT_TENANT
    ) -> None:
        """Hold `history` as the session's (of `tenant`), when it is whole (sequences 1..N,
        in order)."""
        previous = self._drop(session_id)
        count = len(history)
        if not count or history[0].sequence != 1 or history[-1].sequence != count:
            return  # not the whole log: a gap would go unnoticed by the store's check
        size = _extended_size(previous, history) if previous is not None else None
        if size is None:
            size = sum(step_bytes(step) for step in history)
        if size > self._max_bytes:
            return
        self._histories[session_id] = _Entry(tuple(history), size, tenant)
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, evicted = self._histories.popitem(last=False)
            self._bytes -= evicted.size

    def forget(self, session_id: str) -> None:
        """Drop what is cached for the session."""
        self._drop(session_id)

    def _drop(self, session_id: str) -> _Entry | None:
        dropped = self._histories.pop(session_id, None)
        if dropped is not None:
            self._bytes -= dropped.size
        return dropped


def _extended_size(previous: _Entry, history: Sequence[Step]) -> int | None:
    """The size of `history` when it extends what was cached (the runtime passes the cached
    steps themselves, then the run's new ones), measuring only the new steps; else None."""
    count = len(previous.steps)
    if len(history) < count or history[count - 1] is not previous.steps[-1]:
        return None
    return previous.size + sum(step_bytes(step) for step in history[count:])


def mark_of(history: Sequence[Step]) -> HistoryMark | None:
    """The last step of a history, for a write to check it is still the log's end."""
    return HistoryMark(history[-1].sequence, history[-1].id) if history else None
