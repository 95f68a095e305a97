"""`Watching`: the one way to follow a run — live here, from the member running it, or
from the journal — for every watcher (WatchRun, a member's Follow, a queued run's caller).

`follow` yields a run's events with a seq above the cursor, up to and including the next
terminal event. A run with a segment live here is followed in its channel (with the deltas
of its step in progress). A run another member runs is followed live from that member
through `RemoteRuns` (engine/remote.py), its events relayed as it streamed them; when that
stream ends before the run's end (the member died or is shutting down), the follow goes on
from the journal after the last event relayed.

From the journal, the events are as it stored them (engine/journal.py). A run still
RUNNING with no live channel here runs elsewhere (another process or replica), and a QUEUED
run waits for its session: the journal is read again every `poll_s` (at once when a run
starts here), and whether its server died is asked as often as live servers renew their
leases (`Lifecycle.interrupt_abandoned` ends it INTERRUPTED, with its terminal
event journaled). Should a run start here meanwhile, the live channel takes over, with the
deltas of its step in progress.

A server that dies loses the events it streamed and had not stored yet (the deltas and
`step_started` of the step in progress); the take-over that ends its run journals the
terminal event `TAKEOVER_SEQ_GAP` past the last stored one, so a client's live cursor is
still before it. A cursor past a run's last terminal event gets that event all the same,
so every watch of an ended run ends. Never imports grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agio_grpc.domain import Run, RunStatus
from agio_grpc.engine.errors import RuntimeClosedError
from agio_grpc.engine.events import SequencedEvent, terminal_event
from agio_grpc.engine.journal import event_of
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.engine.live import LiveRuns
from agio_grpc.engine.remote import FollowedEvent, RemoteRuns
from agio_grpc.store.leases import SessionLeases
from agio_grpc.store.records import TERMINAL_KINDS
from agio_grpc.store.runs import RunRecords


class Watching:
    """Follows runs: live here, through the member running them, or from the journal."""

    def __init__(
        self,
        runs: RunRecords,
        lifecycle: Lifecycle,
        live: LiveRuns,
        poll_s: float,
        leases: SessionLeases | None = None,
        remote: RemoteRuns | None = None,
    ) -> None:
        """The journal is read again every `poll_s` while a run goes on elsewhere; `leases`
        finds its server dead; `remote` follows it live from its owner."""
        self._runs = runs
        self._lifecycle = lifecycle
        self._live = live
        self._poll_s = poll_s
        self._leases = leases
        self._remote = remote

    async def follow(self, run_id: str, after_seq: int) -> AsyncIterator[FollowedEvent]:
        """The run's events after `after_seq`, up to its next terminal event: live when a
        segment of it runs here, else live from the member running it (`RemoteRuns`), and
        then (or else) `follow_here` from the last event relayed. Raises NotFoundError for
        an unknown run, RuntimeClosedError when the runtime closes while the run goes on
        elsewhere."""
        cursor = after_seq
        if self._remote is not None and self._live.channel(run_id) is None:
            async for relayed in self._remote.follow(run_id, cursor):
                yield relayed
                cursor = relayed.seq
                if relayed.is_terminal:
                    return
        async for event in self.follow_here(run_id, cursor):
            yield event

    async def follow_here(self, run_id: str, after_seq: int) -> AsyncIterator[SequencedEvent]:
        """`follow` with what this process has: the live segment's channel when it holds
        every event after `after_seq`, else the journal (`_replay`). What a member's follow
        serves: it never relays another member's stream."""
        channel = self._live.channel(run_id)
        if channel is not None and after_seq >= channel.first_seq - 1:
            async for event in channel.subscribe(after_seq):
                yield event
            return
        async for event in self._replay(run_id, after_seq):
            yield event

    async def _replay(self, run_id: str, after_seq: int) -> AsyncIterator[SequencedEvent]:
        """The run's events from the journal after `after_seq`, polled while it goes on
        elsewhere, and live once it runs here (module docstring)."""
        store = self._runs
        loop = asyncio.get_running_loop()
        check_every = self._leases.session_lease_s / 3 if self._leases is not None else 0.0
        next_check = loop.time() + check_every
        cursor = after_seq
        while True:
            # The run is read before its journal: a run found ended has its end journaled.
            run = await store.get_run(run_id)
            records = await store.read_journal(run_id, cursor)
            spawned = self._live.spawned  # before the look: a start after it sets this one
            # A segment live here (since before the read, or started during it) holds its
            # events with their deltas, which the journal has not: the journal only up to it.
            live = self._live.channel(run_id)
            for record in records:
                if live is not None and record.seq >= live.first_seq:
                    break
                yield event_of(run.id, run.session_id, record)
                cursor = record.seq
                if record.kind in TERMINAL_KINDS:
                    return
            if live is not None:  # it runs here (again): follow it live
                async for event in live.subscribe(cursor):
                    yield event
                return
            if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
                end = await _end_after(store, run, cursor)
                if end is not None:
                    yield end
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(spawned.wait(), self._poll_s)
            if self._live.closing:
                raise RuntimeClosedError(
                    "the server is shutting down: watch the run again through another one"
                )
            if (
                run.status is RunStatus.RUNNING
                and self._leases is not None
                and loop.time() >= next_check
            ):
                next_check = loop.time() + check_every
                await self._lifecycle.interrupt_abandoned(run_id)


async def _end_after(store: RunRecords, run: Run, cursor: int) -> SequencedEvent | None:
    """The terminal event a watch from `cursor` still gets when the journal has nothing
    after it and the run is not running: the last one when the cursor is past it (see the
    module docstring); for a run that ended before the journal existed, its end as the run
    row has it; None when the cursor is at its end."""
    terminals = [
        record for record in await store.read_journal(run.id) if record.kind in TERMINAL_KINDS
    ]
    if terminals:
        last = terminals[-1]
        return event_of(run.id, run.session_id, last) if cursor > last.seq else None
    seq = max(run.last_event_seq, 1)
    if cursor >= seq:
        return None
    time = run.end_time or run.create_time
    return SequencedEvent(run.id, run.session_id, seq, time, terminal_event(run))
