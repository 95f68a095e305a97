"""`RunChannel`: one run segment's in-memory event journal, replayed and followed by clients.

The producer (the run loop) publishes without ever waiting: `publish` appends to the
journal and wakes subscribers. Each subscriber reads the journal at its own pace from any
`after_seq`, then follows live until the terminal event. `seq` is assigned here, gapless,
starting after the run's `last_event_seq` so a continuation keeps counting.

Delta coalescing happens only while clients are behind: a new `StepDelta` is merged into
the journal's tail when the tail is a delta of the same step that no subscriber has taken
yet. Every subscriber therefore sees the same events under the same seqs, a client that
keeps up gets each delta as the producer publishes it, and no timer ever delays the first
one. (The model driver publishes the deltas of a chunk burst without a pause once the
first delta of its call is out, `taken_seq`; those are merged too.)

Durable events (engine/journal.py) go through `journal_for`: the events a store write
announces get their seqs before the write, are stored with it, and are published after it
under those seqs by `publish_journaled`; the `step_started` and `error` events published
since the last write ride along with the next one.

Never imports grpc; never blocks the producer on a slow consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from agio_grpc.domain import Run, Step, utc_now
from agio_grpc.engine.events import LIVE_ONLY, Event, SequencedEvent, StepDelta
from agio_grpc.engine.journal import record_of
from agio_grpc.store.records import Journal, JournalRecord

Announce = Callable[[Run | None, Sequence[Step]], list[Event]]
"""The events a store write announces, made from what it stored (as `Journal` is called)."""


class ChannelClosedError(RuntimeError):
    """Raised when publishing to a channel after its terminal event."""


class RunChannel:
    """The journal of one run segment: publish once, subscribe many times."""

    def __init__(self, run_id: str, session_id: str, start_after_seq: int = 0) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.first_seq = start_after_seq + 1
        self._journal: list[SequencedEvent] = []
        self._taken_seq = start_after_seq  # highest seq any subscriber has taken
        self._wakeup = asyncio.Event()
        self._closed = False
        # Published events a replay needs that no store write has journaled yet.
        self._unjournaled: list[SequencedEvent] = []
        # What the last `journal_for` write announced, to publish once it committed.
        self._announced: list[SequencedEvent] = []

    @property
    def last_seq(self) -> int:
        """The seq of the newest event (start_after_seq when nothing was published)."""
        return self.first_seq - 1 + len(self._journal)

    @property
    def taken_seq(self) -> int:
        """The highest seq a subscriber has taken (start_after_seq when none has)."""
        return self._taken_seq

    @property
    def closed(self) -> bool:
        """Whether the terminal event was published."""
        return self._closed

    def publish(self, event: Event) -> SequencedEvent:
        """Append `event` and wake subscribers, or merge a delta into an untaken tail delta:
        no new seq, and whoever waits was woken when the tail was published."""
        if self._closed:
            raise ChannelClosedError(f"run {self.run_id} already ended")
        tail = self._journal[-1] if self._journal else None
        if (
            isinstance(event, StepDelta)
            and tail is not None
            and isinstance(tail.event, StepDelta)
            and tail.event.step_id == event.step_id
            and tail.seq > self._taken_seq
        ):
            sequenced = SequencedEvent(
                self.run_id, self.session_id, tail.seq, tail.time, tail.event.merged(event)
            )
            self._journal[-1] = sequenced
            return sequenced
        sequenced = SequencedEvent(
            self.run_id, self.session_id, self.last_seq + 1, utc_now(), event
        )
        # Inline rather than `_append` and `_wake`: this runs for every delta.
        self._journal.append(sequenced)
        if not isinstance(event, LIVE_ONLY):
            self._closed = sequenced.is_terminal
            self._unjournaled.append(sequenced)
        self._wakeup.set()
        self._wakeup = asyncio.Event()
        return sequenced

    def journal_for(self, announce: Announce) -> Journal:
        """The journal of the next store write: the events published since the last one
        that a replay needs, then the events `announce` makes of what the write stored,
        under the seqs they get when `publish_journaled` publishes them after it. Nothing
        may be published between this call and that one (the run's task is writing)."""
        pending = list(self._unjournaled)
        first = self.last_seq + 1
        time = utc_now()

        def journal(run: Run | None, steps: Sequence[Step]) -> list[JournalRecord]:
            events = announce(run, steps)
            self._announced = [
                SequencedEvent(self.run_id, self.session_id, first + offset, time, event)
                for offset, event in enumerate(events)
            ]
            return [record_of(sequenced) for sequenced in (*pending, *self._announced)]

        self._announced = []
        return journal

    def publish_journaled(self) -> list[SequencedEvent]:
        """After the write of the last `journal_for` committed: publish what it announced;
        what was published before it is journaled now."""
        announced, self._announced = self._announced, []
        self._unjournaled.clear()
        if announced and announced[0].seq != self.last_seq + 1:
            raise RuntimeError(f"run {self.run_id}: an event was published during a write")
        for sequenced in announced:
            if self._closed:
                raise ChannelClosedError(f"run {self.run_id} already ended")
            self._append(sequenced)
        self._wake()
        return announced

    def _append(self, sequenced: SequencedEvent) -> None:
        self._journal.append(sequenced)
        self._closed = sequenced.is_terminal

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def events_after(self, after_seq: int) -> list[SequencedEvent]:
        """The events published so far with seq > after_seq (taken: no longer merged into)."""
        events = self._journal[max(0, after_seq - self.first_seq + 1) :]
        if events:
            self._taken_seq = max(self._taken_seq, events[-1].seq)
        return events

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once an event past `seq` is published (or the channel closed), or after
        `timeout` seconds."""
        if self.last_seq > seq or self._closed:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def subscribe(self, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """Replay events with seq > after_seq, then follow live; ends after the terminal event.

        An `after_seq` from before this segment replays the segment from its start.
        """
        index = max(0, after_seq - self.first_seq + 1)
        while True:
            if index < len(self._journal):
                sequenced = self._journal[index]
                index += 1
                self._taken_seq = max(self._taken_seq, sequenced.seq)
                yield sequenced
                if sequenced.is_terminal:
                    return
            elif self._closed:
                return
            else:
                await self._wakeup.wait()
