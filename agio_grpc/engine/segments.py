"""`Segments`: how a run segment starts in this process, a loop task with its channel.

A segment is spawned from a `RunPlan` (where it starts: its history, and tool calls to run
before the model) once the lifecycle has stored its start: `spawn_started` for a new run,
direct (`Runtime.start_run`) or queued (engine/queues.py), both alike; `spawn` itself for a
continued run (SubmitToolOutputs) and a Retry. The segment is live (engine/live.py) until
its task ends: a later watch replays the run from the journal. Never imports grpc; touches
the store only through the lifecycle, to abandon a start it cannot run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from agio_grpc.domain import ApprovalDecision, Role, Run, Step, ToolCall
from agio_grpc.engine.admission import RunSlots, Slot
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import open_tool_calls
from agio_grpc.engine.control import RunControl
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.engine.history import CachedHistory
from agio_grpc.engine.leases import LeaseKeeper
from agio_grpc.engine.live import LiveRuns, LiveSegment
from agio_grpc.engine.loop import LoopServices, RunLoop, RunSegment
from agio_grpc.engine.remote import FollowedEvent
from agio_grpc.engine.tracing import RunTrace
from agio_grpc.store.records import RunStart

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RunHandle:
    """A started (or queued) run segment: its id, session and event stream."""

    run: Run
    """The run as it started, RUNNING or QUEUED (a snapshot)."""
    follow: Callable[[int], AsyncIterator[FollowedEvent]]

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def session_id(self) -> str:
        return self.run.session_id

    def events(self, after_seq: int = 0) -> AsyncIterator[FollowedEvent]:
        """The segment's events after `after_seq`, live; ends after the terminal event (a
        queued run's: from its queueing through its start to its end, relayed from the
        member that started it when another one did)."""
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
    decisions: dict[str, ApprovalDecision] = field(default_factory=dict)
    """Decisions on calls that waited for approval (engine/approvals.py): approved ones of
    `resume_calls` run without waiting again, and their results keep the decision."""
    approval_waits: dict[str, float] = field(default_factory=dict)
    """Seconds each decided call waited, by call id (for its trace)."""


class Segments:
    """Starts the run segments of this process: the one path from a stored start to a live
    loop task."""

    def __init__(
        self,
        services: LoopServices,
        live: LiveRuns,
        slots: RunSlots,
        keeper: LeaseKeeper | None = None,
    ) -> None:
        """Each segment holds one of `slots` while its task runs; the first spawn starts
        `keeper` (the runtime may have started it before)."""
        self._services = services
        self._live = live
        self._slots = slots
        self._keeper = keeper

    async def admit(self, deadline_at: float | None) -> Slot:
        """A slot for a segment about to start (engine/admission.py): `with` it around the
        start, and hand it to `spawn`. Raises ServerBusyError when none frees in time."""
        return await self._slots.take(deadline_at)

    async def spawn_started(
        self,
        started: RunStart,
        cached: CachedHistory,
        settings: RunSettings,
        channel: RunChannel,
        trace: RunTrace,
        deadline_at: float | None,
        slot: Slot | None = None,
    ) -> RunHandle:
        """The segment of a new run, direct or queued, whose start the lifecycle stored
        (`begin`, `begin_queued`) after the steps of `cached`. Raises ValueError, the run
        abandoned, when the store read its history from elsewhere than `cached` ends."""
        for step in started.steps:
            trace.step_stored(step.id, step.sequence)
        try:
            history = cached.join(started.history_start, started.history)
        except ValueError:
            trace.end(started.run)
            await self._services.lifecycle.abandon(started.run, channel)
            raise
        plan = RunPlan(history, kept_steps=len(history) - len(started.history))
        return self.spawn(started.run, settings, plan, channel, deadline_at, trace, slot=slot)

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
        segment = LiveSegment(run.session_id, run.tenant, channel, control)
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
                decisions=plan.decisions,
                approval_waits=plan.approval_waits,
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
        self._live.add(run.id, segment)
        if self._keeper is not None:
            self._keeper.start()
        return RunHandle(started, channel.subscribe)

    def _ended(self, run_id: str, segment: LiveSegment, task: asyncio.Task[Run]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("run loop task failed", exc_info=task.exception())
        self._live.remove(run_id, segment)


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
