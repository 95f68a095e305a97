"""`Segments`: the run segments this process runs, each a loop task with its channel.

A segment is spawned from a `RunPlan` (where it starts: its history, and tool calls to run
before the model) once the lifecycle has stored its start, and forgotten when its task
ends: a later watch replays the run from the journal. `spawned` is set whenever a segment
starts, so that a watch waiting for a run to start here looks again at once. Never
imports grpc; never touches the store.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from agio_grpc.domain import Role, Run, Step, StopSignal, ToolCall
from agio_grpc.engine.admission import RunSlots, Slot
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import open_tool_calls
from agio_grpc.engine.control import RunControl
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.loop import LoopServices, RunLoop, RunSegment
from agio_grpc.engine.tracing import RunTrace

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RunHandle:
    """A started (or queued) run segment: its id, session and event stream."""

    run: Run
    """The run as it started, RUNNING or QUEUED (a snapshot)."""
    follow: Callable[[int], AsyncIterator[SequencedEvent]]

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def session_id(self) -> str:
        return self.run.session_id

    def events(self, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """The segment's events after `after_seq`, live; ends after the terminal event (a
        queued run's: from its queueing through its start to its end)."""
        return self.follow(after_seq)


@dataclass(slots=True)
class RunPlan:
    """Where a segment starts: the history, and tool calls to run before the model."""

    history: list[Step]
    """As `SessionLog.get_history` reads it: the conversation, not the metrics; the stored
    log exactly (every transition checks the log it was decided on)."""
    resume_calls: list[ToolCall] = field(default_factory=list)
    kept_steps: int = 0
    """How many steps of `history` came from the history cache rather than the store."""


@dataclass(slots=True)
class _Segment:
    session_id: str
    tenant: str
    channel: RunChannel
    control: RunControl
    task: asyncio.Task[Run] | None = None


class Segments:
    """The live run segments of this process."""

    def __init__(
        self, services: LoopServices, on_spawn: Callable[[], None], slots: RunSlots
    ) -> None:
        """`on_spawn` runs at each spawn (the runtime starts its lease keeper); each segment
        holds one of `slots` while its task runs."""
        self._services = services
        self._on_spawn = on_spawn
        self._slots = slots
        self._segments: dict[str, _Segment] = {}
        self.starting: set[str] = set()
        """Queued runs this process is starting: their callers follow their channels."""
        self.spawned = asyncio.Event()
        """Set (and replaced) whenever a segment starts here."""

    def spawn(
        self,
        run: Run,
        settings: RunSettings,
        plan: RunPlan,
        channel: RunChannel,
        deadline_at: float | None,
        trace: RunTrace,
        model_calls: int = 0,
        slot: Slot | None = None,
    ) -> RunHandle:
        """Start the segment's loop task (its opening events are published). It keeps
        `slot` (`admit`), or takes one past the limit (a queued run, accepted before)."""
        trace.history_loaded(plan.kept_steps, len(plan.history) - plan.kept_steps)
        control = RunControl()
        segment = _Segment(run.session_id, run.tenant, channel, control)
        loop = RunLoop(
            self._services,
            RunSegment(
                run=run,
                settings=settings,
                history=plan.history,
                channel=channel,
                control=control,
                model_calls=model_calls,
                resume_calls=plan.resume_calls,
                deadline_at=deadline_at,
                trace=trace,
                history_is_log=True,
            ),
        )
        started = run.snapshot()
        segment.task = asyncio.create_task(loop.run(), name=f"agio run {run.id}")
        slot = slot or self._slots.take_now()
        slot.keep()
        segment.task.add_done_callback(lambda _: slot.give())
        segment.task.add_done_callback(lambda task: self._ended(run.id, segment, task))
        # The loop ends its trace; this ends it too if the task never got to run.
        segment.task.add_done_callback(lambda _: trace.end(loop.run_row))
        self._segments[run.id] = segment
        self._on_spawn()
        self.spawned.set()
        self.spawned = asyncio.Event()
        return RunHandle(started, channel.subscribe)

    async def admit(self, deadline_at: float | None) -> Slot:
        """A slot for a segment about to start (engine/admission.py): `with` it around the
        start, and hand it to `spawn`. Raises ServerBusyError when none frees in time."""
        return await self._slots.take(deadline_at)

    def _ended(self, run_id: str, segment: _Segment, task: asyncio.Task[Run]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("run loop task failed", exc_info=task.exception())
        if self._segments.get(run_id) is segment:  # not a segment a continuation replaced
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
        segment.control.request_stop(copy.deepcopy(signal))
        await asyncio.wait({segment.task}, timeout=wait_s)
        return True

    def stop_all(self, tasks: set[asyncio.Task[Run]], signal: StopSignal) -> None:
        """Ask the segments running `tasks` to stop with `signal`."""
        for segment in list(self._segments.values()):
            if segment.task in tasks:
                segment.control.request_stop(copy.deepcopy(signal))

    def _live(self, run_id: str) -> _Segment | None:
        segment = self._segments.get(run_id)
        if segment is None or segment.task is None or segment.task.done():
            return None
        return segment


def retry_plan(history: list[Step], sequence: int) -> RunPlan:
    """Where a retry run starts, given the steps that remain (see `Runtime.retry`)."""
    # A summary step stands for earlier steps: the turn to go on from is the last other one.
    last = next((step for step in reversed(history) if step.role is not Role.SUMMARY), history[-1])
    if last.role is Role.ASSISTANT and not last.tool_calls:
        raise InvalidInputError(
            "sequence",
            f"step {last.sequence} before sequence {sequence} is a final assistant reply: "
            f"nothing to regenerate (retry from {last.sequence} to regenerate that reply)",
        )
    if last.role in (Role.ASSISTANT, Role.TOOL):
        _, open_calls = open_tool_calls(history)
        return RunPlan(history, resume_calls=open_calls)
    return RunPlan(history)
