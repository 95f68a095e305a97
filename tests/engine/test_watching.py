"""A watch that reads the journal while the run starts here switches to the live segment at
its first event, so it keeps the deltas the journal never had.

The interleaving (a queued run starting in this process while a watcher reads its journal)
is set up exactly: the journal read below is the moment the segment starts.
"""

from __future__ import annotations

from typing import cast

from agio_grpc.domain import Role, Run, RunStatus, Step
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.control import RunControl
from agio_grpc.engine.events import (
    RunCompleted,
    RunStarted,
    StepCompleted,
    StepDelta,
    StepStarted,
)
from agio_grpc.engine.journal import record_of
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.engine.live import LiveRuns, LiveSegment
from agio_grpc.engine.watching import Watching
from agio_grpc.store.records import JournalRecord
from agio_grpc.store.runs import RunRecords


class StartsDuringTheRead:
    """The run's records: its run row, and a journal whose read is when the run's segment
    starts here (its events then published and journaled, as the run's task would)."""

    def __init__(self, run: Run, live: LiveRuns) -> None:
        self.run = run
        self.live = live
        self.journal: list[JournalRecord] = []
        # Queued: its run_started is journaled while it waits.
        queued = RunChannel(run.id, run.session_id)
        self.journal.append(record_of(queued.publish(RunStarted(run))))

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        return self.run

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        if len(self.journal) == 1:  # the first read: the segment starts and streams now
            self.start_segment()
        return [record for record in self.journal if record.seq > after_seq]

    def start_segment(self) -> None:
        channel = RunChannel(self.run.id, self.run.session_id, start_after_seq=1)
        self.live.add(self.run.id, LiveSegment(self.run.session_id, "", channel, RunControl()))
        step = Step(self.run.session_id, self.run.id, Role.ASSISTANT, content="Hello world")
        published = [
            channel.publish(RunStarted(self.run)),
            channel.publish(StepStarted(step_id=step.id, role=Role.ASSISTANT)),
            channel.publish(StepDelta(step_id=step.id, content="Hello world")),
            channel.publish(StepCompleted(step)),
            channel.publish(RunCompleted(self.run)),
        ]
        # The store journals every event but the delta.
        self.journal += [
            record_of(event) for event in published if not isinstance(event.event, StepDelta)
        ]


async def test_a_watch_reading_the_journal_as_the_run_starts_here_follows_it_live() -> None:
    live = LiveRuns()
    run = Run(session_id="sess_w", agent="assistant", status=RunStatus.RUNNING)
    records = StartsDuringTheRead(run, live)
    watching = Watching(cast(RunRecords, records), cast(Lifecycle, None), live, poll_s=60)

    watched = [event async for event in watching.follow_here(run.id, 0)]

    # The journal held 1, 2, 3, 5 and 6 by the time it was read: 1 from it, then the
    # segment live from 2, its delta (4) included.
    assert [event.seq for event in watched] == [1, 2, 3, 4, 5, 6]
    assert isinstance(watched[3].event, StepDelta)
    assert watched[-1].is_terminal
