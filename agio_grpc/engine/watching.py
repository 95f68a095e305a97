"""Following a run from the journal: replays after a cursor, and runs another process runs.

`follow` yields a run's events with a seq above the cursor, as the journal stored them
(engine/journal.py), up to and including the next terminal event. A run still RUNNING with
no live channel here runs elsewhere (another process or replica), and a QUEUED run waits
for its session: the journal is read again every `poll_s` (at once when a run starts
here), and whether its server died is asked as often as live servers renew their
leases (`Lifecycle.interrupt_abandoned` ends it INTERRUPTED, with its terminal
event journaled). Should a run start here meanwhile, the live channel takes over
(`live`), with the deltas of its step in progress.

A server that dies loses the events it streamed and had not stored yet (the deltas and
`step_started` of the step in progress); the take-over that ends its run journals the
terminal event `TAKEOVER_SEQ_GAP` past the last stored one, so a client's live cursor is
still before it. A cursor past a run's last terminal event gets that event all the same,
so every watch of an ended run ends. Never imports grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from agio_grpc.domain import Run, RunStatus
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.errors import RuntimeClosedError
from agio_grpc.engine.events import SequencedEvent, terminal_event
from agio_grpc.engine.journal import event_of
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.store.records import TERMINAL_KINDS
from agio_grpc.store.runs import RunRecords


@dataclass(frozen=True, slots=True)
class Watching:
    """What `follow` reads from: the runs and their journals, the lifecycle (to end the runs
    of dead servers, checked every `lease_s / 3`; never when 0), the live channels of this
    process, and whether the runtime is closing."""

    runs: RunRecords
    lifecycle: Lifecycle
    lease_s: float
    live: Callable[[str], RunChannel | None]
    closing: Callable[[], bool]
    poll_s: float
    spawned: Callable[[], asyncio.Event]
    """Set when a segment starts in this process: a watch waiting for a run to start here
    (a queued one) looks again at once rather than at its next poll."""


async def follow(watching: Watching, run_id: str, after_seq: int) -> AsyncIterator[SequencedEvent]:
    """The run's events after `after_seq`, up to its next terminal event (module docstring).
    Raises NotFoundError for an unknown run, RuntimeClosedError when the runtime closes
    while the run goes on elsewhere."""
    store = watching.runs
    loop = asyncio.get_running_loop()
    check_every = watching.lease_s / 3
    next_check = loop.time() + check_every
    cursor = after_seq
    while True:
        # The run is read before its journal: a run found ended has its end journaled.
        run = await store.get_run(run_id)
        for record in await store.read_journal(run_id, cursor):
            yield event_of(run.id, run.session_id, record)
            cursor = record.seq
            if record.kind in TERMINAL_KINDS:
                return
        if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
            end = await _end_after(store, run, cursor)
            if end is not None:
                yield end
            return
        spawned = watching.spawned()  # before the look: a start after it sets this one
        channel = watching.live(run_id)
        if channel is not None:  # it runs here (again): follow it live
            async for event in channel.subscribe(cursor):
                yield event
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(spawned.wait(), watching.poll_s)
        if watching.closing():
            raise RuntimeClosedError(
                "the server is shutting down: watch the run again through another one"
            )
        if run.status is RunStatus.RUNNING and check_every > 0 and loop.time() >= next_check:
            next_check = loop.time() + check_every
            await watching.lifecycle.interrupt_abandoned(run_id)


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
