"""`HistoryCache`: the conversations of sessions this process ran lately, kept between runs.

A run reads its session's whole history before its first model call; on a long session that
read is most of what the run pays before the model starts (B5). With the history its
previous run ended with, a new run on the session asks the store only for the steps after
it (`StepStore.start_run`'s `since`), and the store checks in the run's start transaction
that the last cached step is still stored at its sequence. That check is enough: a stored
step never changes, deletes (Retry, DeleteSteps) only cut the end of the log, and a step id
is never reused, so when the last cached step is still there, so is every step before it.
A run on another replica, a retry or a deletion in between is thus seen, never served stale.

What goes in must be the stored log exactly: the loop hands its history over only when the
history was read while its run held the session and the run still held it at its end
(`StepStore.release_session` says so); a history read before the session was taken, or
extended while another holder rewrote the log, is never kept. Bounded by a total number of
steps (the least recently used sessions go first). Holds only whole histories (sequences
1..N). Never reads the store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from agio_grpc.domain import Step
from agio_grpc.store.protocol import HistoryMark, RunStart


@dataclass(frozen=True, slots=True)
class HeldHistory:
    """What the cache held for a session when a run started on it (possibly nothing)."""

    steps: tuple[Step, ...] = ()

    @property
    def mark(self) -> HistoryMark | None:
        """The last held step, for `StepStore.start_run(since=...)`."""
        if not self.steps:
            return None
        last = self.steps[-1]
        return HistoryMark(last.sequence, last.id)

    def join(self, started: RunStart) -> list[Step]:
        """The session's whole history: the held steps, then what `start_run` read after
        them; just what it read when it read from the start."""
        if started.history_start == 1:
            return started.history
        if not self.steps or self.steps[-1].sequence + 1 != started.history_start:
            # The store read after a mark this history did not give: joining would send the
            # model part of a conversation.
            raise ValueError(
                f"start_run read from sequence {started.history_start}, which does not "
                "follow the held history"
            )
        return [*self.steps, *started.history]


class HistoryCache:
    """Recent sessions' histories, at most `max_steps` steps in all (0: keep none)."""

    def __init__(self, max_steps: int) -> None:
        if max_steps < 0:
            raise ValueError(f"max_steps must be at least 0, got {max_steps}")
        self._max_steps = max_steps
        self._steps = 0
        self._histories: OrderedDict[str, tuple[Step, ...]] = OrderedDict()

    def __len__(self) -> int:
        """How many steps are held, over every session."""
        return self._steps

    def held(self, session_id: str) -> HeldHistory:
        """What is held for the session now (a snapshot: later changes do not touch it)."""
        steps = self._histories.get(session_id)
        if steps is None:
            return HeldHistory()
        self._histories.move_to_end(session_id)
        return HeldHistory(steps)

    def remember(self, session_id: str, history: Sequence[Step]) -> None:
        """Hold `history` as the session's, when it is whole (sequences 1..N, in order)."""
        self.forget(session_id)
        size = len(history)
        if not size or size > self._max_steps:
            return
        if history[0].sequence != 1 or history[-1].sequence != size:
            return  # not the whole log: a gap would go unnoticed by the store's check
        self._histories[session_id] = tuple(history)
        self._steps += size
        while self._steps > self._max_steps:
            _, evicted = self._histories.popitem(last=False)
            self._steps -= len(evicted)

    def forget(self, session_id: str) -> None:
        """Drop what is held for the session."""
        dropped = self._histories.pop(session_id, None)
        if dropped is not None:
            self._steps -= len(dropped)
