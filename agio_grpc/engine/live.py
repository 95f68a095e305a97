"""`LiveRuns`: what the runtime's parts share about the runs of this process.

The parts of `Runtime` (engine/runtime.py) each hold this one object instead of callbacks
into one another or into the runtime: the spawner (engine/segments.py) adds the segments it
starts, and the queues (engine/queues.py), the stops (engine/stopping.py), the lease keeper
(engine/leases.py) and the follow (engine/watching.py) read them. It holds:

- the live segments: each one's session, tenant, channel, control and loop task, from its
  spawn until its task ends (a later watch replays the run from the journal);
- `starting`: the queued runs this process is starting (their callers follow their
  channels), and `spawned`, set whenever a segment starts (a watch waiting for a run to
  start here looks again at once);
- `closing`: the runtime shuts down (nothing starts; follows of runs elsewhere end);
- the hook of a session that frees (`session_freed`): the lifecycle calls it after each
  transition that frees a session with a queue, the keeper for the queues a crash left;
  the queues start the session's next run.

Never imports grpc; never touches the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agio_grpc.domain import Run, StopSignal
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.control import RunControl


@dataclass(slots=True)
class LiveSegment:
    """A run segment this process runs."""

    session_id: str
    tenant: str
    channel: RunChannel
    control: RunControl
    task: asyncio.Task[Run] | None = None


class LiveRuns:
    """The runs live in this process, and what the runtime's parts share about them."""

    def __init__(self) -> None:
        self.closing = False
        """The runtime shuts down: no run starts here, and follows of runs elsewhere end."""
        self.starting: set[str] = set()
        """Queued runs this process is starting: their callers follow their channels."""
        self.spawned = asyncio.Event()
        """Set (and replaced) whenever a segment starts here."""
        self._segments: dict[str, LiveSegment] = {}
        self._start_next: Callable[[str], None] | None = None

    # -- sessions that free -----------------------------------------------------------------

    def when_session_frees(self, start_next: Callable[[str], None]) -> None:
        """`start_next(session_id)` starts the session's next queued run (the queues')."""
        self._start_next = start_next

    def session_freed(self, session_id: str) -> None:
        """The session is free and may have a queue: its next run starts (module docstring)."""
        if self._start_next is not None:
            self._start_next(session_id)

    # -- segments ---------------------------------------------------------------------------

    def add(self, run_id: str, segment: LiveSegment) -> None:
        """A segment started here (it replaces the run's previous one, if still listed)."""
        self._segments[run_id] = segment
        self.spawned.set()
        self.spawned = asyncio.Event()

    def remove(self, run_id: str, segment: LiveSegment) -> None:
        """The segment's task ended (a continuation that replaced it stays)."""
        if self._segments.get(run_id) is segment:
            del self._segments[run_id]

    def starts_here(self, run_id: str) -> bool:
        """Whether the run runs here, or is being started here (queued before)."""
        return run_id in self._segments or run_id in self.starting

    def channel(self, run_id: str) -> RunChannel | None:
        """The channel of the run's segment here, while its task runs (or finishes)."""
        segment = self._segments.get(run_id)
        return segment.channel if segment is not None else None

    def control(self, run_id: str) -> RunControl | None:
        """The control of the run's segment here, while its task runs."""
        segment = self._live(run_id)
        return segment.control if segment is not None else None

    def controls(self) -> Mapping[str, tuple[str, RunControl]]:
        """The runs live here: run id -> (session id, control)."""
        return {
            run_id: (segment.session_id, segment.control)
            for run_id in list(self._segments)
            if (segment := self._live(run_id)) is not None
        }

    def running(self) -> set[asyncio.Task[Run]]:
        """The loop tasks still running."""
        return {s.task for s in self._segments.values() if s.task and not s.task.done()}

    async def stop(
        self, run_id: str, signal: StopSignal, wait_s: float, *, tenant: str | None = None
    ) -> bool:
        """Stop the run's segment running here and wait (up to `wait_s`) for its end to be
        recorded; False when none runs here, or not one of `tenant`'s (when given)."""
        segment = self._live(run_id)
        if segment is None or segment.task is None:
            return False
        if tenant is not None and segment.tenant != tenant:
            return False
        segment.control.request_stop(signal.copied())
        await asyncio.wait({segment.task}, timeout=wait_s)
        return True

    def stop_all(self, tasks: set[asyncio.Task[Run]], signal: StopSignal) -> None:
        """Ask the segments running `tasks` to stop with `signal`."""
        for segment in list(self._segments.values()):
            if segment.task in tasks:
                segment.control.request_stop(signal.copied())

    def _live(self, run_id: str) -> LiveSegment | None:
        segment = self._segments.get(run_id)
        if segment is None or segment.task is None or segment.task.done():
            return None
        return segment
