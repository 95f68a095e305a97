"""`Runtime`: the engine's API for the service layer — start, continue, retry, cancel, watch.

Each call validates its request completely before writing anything, takes the session
(one active run per session, enforced by the store), stores the segment's first steps,
publishes `RunStarted`, and spawns the run loop as an asyncio task the runtime owns. The
caller streams `RunHandle.events()`; leaving the stream does not stop the run — the service
calls `cancel(run_id, "client disconnected")` for that.

The store holds each session for its run under a lease (store/protocol.py); one background
task renews the leases of every run live in this process every third of the lease, so a
session outlives a crashed process by at most one lease. A run whose lease was found taken
over (this process stalled past it) is stopped as INTERRUPTED.

Live channels are kept for a while after their run ends (`retention_s`, `retention_count`),
so a late `watch` replays the real event stream; older runs are replayed from the store.

Each segment gets a trace from the `RunTracer` (engine/tracing.py), started where the segment
is started, so it continues the caller's current trace context (the gRPC server span); its
first steps and the run row keep its ids. The loop task then ends it.

Never imports grpc, SQLAlchemy or OpenTelemetry; storage only through `StepStore`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from agio_grpc.domain import (
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
    StopSignal,
    ToolCall,
    new_id,
    utc_now,
)
from agio_grpc.engine.agents import (
    AgentSpec,
    RunInput,
    RunOverrides,
    RunSettings,
    ToolOutput,
    resolve_settings,
)
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import context_steps, open_tool_calls
from agio_grpc.engine.control import RunControl
from agio_grpc.engine.errors import (
    AgentNotFoundError,
    DuplicateRequestError,
    InvalidInputError,
    RunStateError,
    RuntimeClosedError,
)
from agio_grpc.engine.events import (
    Event,
    RunStarted,
    SequencedEvent,
    StepCompleted,
    terminal_event,
)
from agio_grpc.engine.executor import unfinished_result
from agio_grpc.engine.history import HeldHistory, HistoryCache
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.loop import LoopServices, RunLoop, RunSegment, lease_lost
from agio_grpc.engine.model import ModelDriver
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import NO_TRACER, RunTrace, RunTracer
from agio_grpc.store.errors import (
    NotFoundError,
    SessionBusyError,
    StoreError,
    StoreUnavailableError,
)
from agio_grpc.store.protocol import SessionLeases, StepStore

logger = logging.getLogger(__name__)

T = TypeVar("T")

_REQUEST_ID_SCAN = 100  # how many recent runs of a session are checked for a reused request_id
_CANCEL_WAIT_POLL_S = 0.1  # how often a cancel for a run elsewhere rereads the run
# How long a call whose write failed waits to learn whether it committed.
_UNCLEAR_WRITE_CHECK_S = 1.0


@dataclass(slots=True)
class RunHandle:
    """A started run segment: its id, session and event stream."""

    run: Run
    """The run as it started (a snapshot)."""
    channel: RunChannel

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def session_id(self) -> str:
        return self.run.session_id

    def events(self, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """The segment's events after `after_seq`, live; ends after the terminal event."""
        return self.channel.subscribe(after_seq)


@dataclass(slots=True)
class _Segment:
    """A run segment this process runs or ran recently."""

    session_id: str
    channel: RunChannel
    control: RunControl
    settings: RunSettings
    task: asyncio.Task[Run] | None = None
    finished_at: float | None = None


@dataclass(slots=True)
class _RunPlan:
    """Where a segment starts: the history, and tool calls to run before the model."""

    history: list[Step]
    """As `StepStore.get_history` reads it: the conversation, not the metrics."""
    resume_calls: list[ToolCall] = field(default_factory=list)
    kept_steps: int = 0
    """How many steps of `history` came from the history cache rather than the store."""
    history_held: bool = False
    """`history` was read under the session's lease (see `RunSegment.history_held`)."""


class Runtime:
    """Runs agents on sessions; the one object the service layer drives."""

    def __init__(
        self,
        store: StepStore,
        agents: dict[str, AgentSpec],
        default_agent: str,
        registry: ToolRegistry,
        model: ModelDriver,
        hooks: Hooks | None = None,
        *,
        retention_s: float = 600.0,
        retention_count: int = 1000,
        cancel_wait_s: float = 10.0,
        cancel_poll_s: float = 0.5,
        watch_poll_s: float = 0.25,
        tracer: RunTracer | None = None,
        leases: SessionLeases | None = None,
        history_cache_bytes: int = 64_000_000,
    ) -> None:
        """`retention_*` bound how long and how many ended runs stay replayable from memory;
        `cancel_wait_s` bounds how long `cancel` waits for a run to record its end;
        `cancel_poll_s` is how often this process looks for cancel requests that other
        replicas recorded for its live runs (with `leases`); `watch_poll_s` is how often a
        `watch` of a run another process runs reads the store for its progress; `tracer`
        traces each run segment (nothing by default); `leases` renews the session leases of
        this process's live runs (the store's takes set them; its `session_lease_s` is the
        duration). Without `leases` nothing renews them: only for runs shorter than a lease.
        `history_cache_bytes` bounds the memory of the histories kept between runs
        (engine/history.py; 0 keeps none).
        """
        if default_agent not in agents:
            raise ValueError(f"default agent {default_agent!r} is not among the agents")
        for agent in agents.values():
            missing = [name for name in agent.tools if name not in registry]
            if missing:
                raise ValueError(f"agent {agent.name!r} names unknown tools: {missing}")
        self.store = store
        self.agents = agents
        self.default_agent = default_agent
        self.registry = registry
        self._histories = HistoryCache(history_cache_bytes)
        self._services = LoopServices(store, registry, model, hooks or Hooks(), self._histories)
        self._segments: OrderedDict[str, _Segment] = OrderedDict()
        # Run ids of ended segments in the order they ended, so pruning looks only at the
        # oldest instead of walking every retained run at each start and end.
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._retention_s = retention_s
        self._retention_count = retention_count
        self._cancel_wait_s = cancel_wait_s
        self._cancel_poll_s = cancel_poll_s
        self._watch_poll_s = watch_poll_s
        self._closing = False
        self._tracer = tracer or NO_TRACER
        self._leases = leases
        self._renewal: asyncio.Task[None] | None = None
        self._cancel_watch: asyncio.Task[None] | None = None
        # Clean-ups of failed or cancelled calls still running (`_clean_up`).
        self._cleanups: set[asyncio.Task[None]] = set()

    # -- agents and context -----------------------------------------------------------------

    def agent(self, name: str = "") -> AgentSpec:
        """The named agent ("" = the default). Raises AgentNotFoundError."""
        spec = self.agents.get(name or self.default_agent)
        if spec is None:
            raise AgentNotFoundError(name, list(self.agents))
        return spec

    async def next_context(self, session_id: str, agent: str = "") -> list[Step]:
        """What the model would receive next on the session (GetContext): the system prompt
        (sequence 0), then the stored steps as repaired by `build_context`.
        """
        spec = self.agent(agent)
        await self.store.get_session(session_id)
        steps = await self.store.get_steps(session_id)
        return context_steps(spec.instructions, steps, spec.limits.max_history_messages)

    # -- starting runs ----------------------------------------------------------------------

    async def start_run(self, request: RunInput) -> RunHandle:
        """Store the user input as a step and start a run on it.

        Raises AgentNotFoundError, InvalidInputError, store NotFoundError (unknown session),
        SessionBusyError (checked before anything is written), DuplicateRequestError,
        RuntimeClosedError.
        """
        self._check_open()
        agent = self.agent(request.agent)
        if not request.input.strip():
            raise InvalidInputError("input", "must not be empty")
        settings = resolve_settings(agent, request.overrides, request.client_tools)
        if request.request_id and request.session_id:
            # A reused request_id must be checked while holding the session: the slow path.
            return await self._start_run_checking_request_id(request, agent.name, settings)
        new_session = None if request.session_id else Session()
        run = Run(
            session_id=new_session.id if new_session else request.session_id,
            agent=agent.name,
            request_id=request.request_id,
            metadata=dict(request.metadata),
            options=settings.to_options(),
        )
        trace = self._tracer.start_run(run, settings, "run")
        run.trace_id = trace.trace_id
        user = Step(
            run.session_id,
            run.id,
            Role.USER,
            content=request.input,
            trace_id=trace.trace_id,
            span_id=trace.span_id,
        )
        held = HeldHistory() if new_session else self._histories.held(run.session_id)
        # One transaction: take (or create) the session, store the input and the run, read
        # the history back (after what this process still holds of it). The model call needs
        # nothing else from the store. In a task of its own, so that a call cancelled while
        # it runs still learns whether it stored the run.
        starting = asyncio.ensure_future(
            self.store.start_run(run, [user], new_session=new_session, since=held.mark)
        )
        try:
            started = await asyncio.shield(starting)
        except BaseException:
            trace.end(run)  # no stop signal: the run never started
            await self._clean_up(
                self._after_write(
                    starting,
                    lambda started: self._end_unstarted(started.run),
                    failed=lambda error: self._end_if_stored(run.id, error),
                )
            )
            raise
        for step in started.steps:
            trace.step_stored(step.id, step.sequence)
        try:
            history = held.join(started.history_start, started.history)
        except ValueError:
            trace.end(started.run)
            await self._clean_up(self._end_unstarted(started.run))
            raise
        kept = len(history) - len(started.history)
        return self._spawn(
            started.run,
            settings,
            _RunPlan(history, kept_steps=kept, history_held=True),
            started.steps,
            request.deadline_s,
            trace,
        )

    async def _start_run_checking_request_id(
        self, request: RunInput, agent: str, settings: RunSettings
    ) -> RunHandle:
        """`start_run` for a request_id on an existing session: checked under the lease."""
        session_id = (await self.store.get_session(request.session_id)).id
        run = Run(
            session_id=session_id,
            agent=agent,
            request_id=request.request_id,
            metadata=dict(request.metadata),
            options=settings.to_options(),
        )
        await self._take_session(session_id, run.id)
        trace = self._tracer.start_run(run, settings, "run")
        run.trace_id = trace.trace_id
        try:
            await self._check_request_id(session_id, request.request_id)
            user = await self.store.append_step(
                Step(
                    session_id,
                    run.id,
                    Role.USER,
                    content=request.input,
                    trace_id=trace.trace_id,
                    span_id=trace.span_id,
                )
            )
            trace.step_stored(user.id, user.sequence)
            run.first_sequence = run.last_sequence = user.sequence
            run.step_count = 1
            await self.store.create_run(run)
            history = await self.store.get_history(session_id)
        except BaseException:
            trace.end(run)  # no stop signal: the run never started
            await self._clean_up(self._end_unstarted(run))
            raise
        plan = _RunPlan(history, history_held=True)  # read after taking the session
        return self._spawn(run, settings, plan, [user], request.deadline_s, trace)

    async def submit_tool_outputs(
        self, run_id: str, outputs: list[ToolOutput], *, deadline_s: float | None = None
    ) -> RunHandle:
        """Store the caller's client tool results and continue the same run.

        The run must be REQUIRES_ACTION (else RunStateError); `outputs` must answer exactly
        its pending client calls (else InvalidInputError naming the ids). Event seqs continue
        from the run's last one; the new segment starts with `RunStarted` and a
        `StepCompleted` per stored output. Raises NotFoundError, SessionBusyError (checked
        first: the outputs are checked against the history read holding the session).
        """
        self._check_open()
        run = await self._run_requiring_action(run_id)
        session_id = run.session_id
        await self._take_session(session_id, run_id)
        try:
            # Everything is read holding the session: a Retry or DeleteSteps before it was
            # taken would otherwise leave the model a conversation that is no longer stored.
            run = await self._run_requiring_action(run_id)  # not cancelled meanwhile
            history, kept = await self._read_through_cache(run.session_id)
            _, pending = open_tool_calls(history)
            by_id = _check_outputs(outputs, pending)
            settings = self._settings_of(run)
            trace = self._tracer.start_run(run, settings, "submit_tool_outputs")
        except BaseException:
            await self._clean_up(self._release_quietly(session_id, run_id))
            raise
        run.trace_id = run.trace_id or trace.trace_id
        steps = [
            Step(
                session_id,
                run_id,
                Role.TOOL,
                content=by_id[call.id].output,
                tool_call_id=call.id,
                name=call.name,
                is_error=by_id[call.id].is_error,
                trace_id=trace.trace_id,
                span_id=trace.span_id,
            )
            for call in pending
        ]
        run.stop_signal = None
        run.last_event_seq = self._last_event_seq(run)
        # The outputs and the run, RUNNING again, in one transaction (in a task of its own,
        # as `start_run`'s): the run goes on, or it still waits for these outputs.
        continuing = asyncio.ensure_future(self.store.continue_run(run, steps))
        try:
            continued = await asyncio.shield(continuing)
        except BaseException:
            trace.end(run)
            await self._clean_up(
                self._after_write(
                    continuing,
                    lambda stored: self._end_unstarted(stored.run),
                    failed=lambda _: self._end_if_continued(session_id, run_id),
                )
            )
            raise
        run = continued.run
        stored = continued.steps
        for step in stored:
            trace.step_stored(step.id, step.sequence)
        history.extend(stored)
        model_calls = sum(
            1 for step in history if step.run_id == run.id and step.role is Role.ASSISTANT
        )
        plan = _RunPlan(history, kept_steps=kept, history_held=True)
        return self._spawn(run, settings, plan, stored, deadline_s, trace, model_calls=model_calls)

    async def retry(
        self, session_id: str, sequence: int, *, deadline_s: float | None = None
    ) -> RunHandle:
        """Delete the session's steps from `sequence` on and regenerate, as a new run.

        What happens depends on the last step that remains (the one before `sequence`):
        - a user step: a model call answers it;
        - a tool step: a model call continues after the tool results (after first running
          any call of that assistant step still without a result);
        - an assistant step with tool calls: its calls without a result are run (server
          tools; client tools end the run with REQUIRES_ACTION), then the loop goes on;
        - a final assistant reply: nothing to regenerate — InvalidInputError (retry from the
          reply's own sequence to regenerate it).
        `sequence` may be one past the last step (delete nothing, regenerate the end: how a
        retryable stop's `resume_from_sequence` is used). Sequence 1 leaves nothing to
        regenerate from: InvalidInputError, as is an empty session. The run uses the agent and
        settings of the run that wrote the remaining last step (the default agent if that run
        is gone). Everything is checked, holding the session, before anything is deleted (so
        a busy session is SessionBusyError before a bad `sequence` is InvalidInputError).
        Raises NotFoundError, InvalidInputError, SessionBusyError.
        """
        self._check_open()
        run_id = new_id("run")
        await self._take_session(session_id, run_id)
        try:
            # Read holding the session, so the history regenerated from is the stored one.
            history, plan = await self._retry_history(session_id, sequence)
            agent, settings = await self._settings_of_step(history[-1])
            run = Run(session_id=session_id, agent=agent, id=run_id, options=settings.to_options())
            trace = self._tracer.start_run(run, settings, "retry")
        except BaseException:
            await self._clean_up(self._release_quietly(session_id, run_id))
            raise
        run.trace_id = trace.trace_id
        try:
            await self.store.delete_steps_from(session_id, sequence)
            await self.store.create_run(run)
        except BaseException:
            trace.end(run)
            await self._clean_up(self._end_unstarted(run, sequence))
            raise
        return self._spawn(run, settings, plan, [], deadline_s, trace)

    async def _retry_history(self, session_id: str, sequence: int) -> tuple[list[Step], _RunPlan]:
        """The steps a retry from `sequence` keeps, and where its run starts."""
        last = await self.store.get_last_step(session_id)
        if last is None:
            raise InvalidInputError("session_id", "the session has no steps to regenerate")
        if not 2 <= sequence <= last.sequence + 1:
            raise InvalidInputError(
                "sequence",
                f"must be between 2 and {last.sequence + 1} "
                "(at least one step must remain to regenerate from)",
            )
        history, kept = await self._read_through_cache(session_id, sequence - 1)
        return history, _retry_plan(history, sequence, kept_steps=kept)

    async def _read_through_cache(
        self, session_id: str, end: int | None = None
    ) -> tuple[list[Step], int]:
        """The session's history up to `end` (None: all of it): what the cache kept, then the
        steps stored after it, read from the store; with how many came from the cache."""
        held = self._histories.held(session_id)
        if end is not None:
            held = held.up_to(end)
        read = await self.store.get_history_since(session_id, held.mark, end)
        history = held.join(read.start, read.steps)
        return history, len(history) - len(read.steps)

    # -- stopping and watching --------------------------------------------------------------

    async def cancel(self, run_id: str, reason: str, source: str = "client") -> Run:
        """Cancel a run; idempotent. Returns the run as stored afterwards.

        A running run here stops with CANCELLED (no partial step stored; open tool calls get
        error results) and this waits, up to `cancel_wait_s`, for its end to be recorded.
        A REQUIRES_ACTION run becomes CANCELLED (its open client calls get error results).
        An ended run is returned unchanged. A run running in another process (a replica on
        the same database) gets a cancel request recorded on its row, which that process
        acts on within its `cancel_poll_s`; this waits for the run's end the same way. A run
        whose process died is taken over by this call (INTERRUPTED) once its lease has run
        out; before that, it is returned still RUNNING after the wait. Raises NotFoundError.
        """
        signal = StopSignal(StopReason.CANCELLED, reason or "cancelled", source or "client")
        segment = self._segments.get(run_id)
        if segment is not None and segment.task is not None and not segment.task.done():
            segment.control.request_stop(signal)
            await asyncio.wait({segment.task}, timeout=self._cancel_wait_s)
            return await self.store.get_run(run_id)
        run = await self.store.get_run(run_id)
        if run.status is RunStatus.RUNNING and self._leases is not None:
            run = await self._cancel_elsewhere(self._leases, run, signal)
        if run.status is not RunStatus.REQUIRES_ACTION:
            return run
        try:
            await self.store.acquire_session(run.session_id, run.id)
        except SessionBusyError:  # a submit is continuing it right now
            segment = self._segments.get(run_id)
            if segment is not None and segment.task is not None and not segment.task.done():
                return await self.cancel(run_id, reason, source)
            raise
        try:
            return await self._cancel_waiting_run(run_id, signal)
        finally:
            await self._release_quietly(run.session_id, run.id)

    async def _cancel_elsewhere(self, leases: SessionLeases, run: Run, signal: StopSignal) -> Run:
        """Stop a run another process runs: a run whose process died (its lease expired, or
        it let go of the session without storing the run's end) is ended INTERRUPTED, as a
        take-over would end it; else a cancel request is recorded for
        that process, and this waits up to `cancel_wait_s` for the run to end and let go
        of its session, as a local cancel does. Returns the run as last read."""
        if await leases.interrupt_abandoned_run(run.id):
            return await self.store.get_run(run.id)
        logger.info("run %s runs elsewhere: cancel requested", run.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._cancel_wait_s
        # Asked again at every look: the run may have waited for its client (which spends
        # a request) and been continued since.
        while await leases.request_cancel(run.id, copy.deepcopy(signal)):
            if loop.time() >= deadline:
                return await self.store.get_run(run.id)
            await asyncio.sleep(_CANCEL_WAIT_POLL_S)
        while (await self.store.get_session(run.session_id)).active_run_id == run.id:
            if loop.time() >= deadline:
                break
            await asyncio.sleep(_CANCEL_WAIT_POLL_S)
        return await self.store.get_run(run.id)

    async def watch(self, run_id: str, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """The run's events after `after_seq`: live (replay, then follow) for a run this
        process runs or ran recently; else synthesised from the store and numbered 1, 2, 3...
        afresh: `RunStarted`, a `StepCompleted` per stored step of the run, and the terminal
        event once the run has ended (or waits in REQUIRES_ACTION). A run still RUNNING in
        another process (a replica on the same database) is followed through the store every
        `watch_poll_s`: its steps as they are stored, without deltas, then its terminal
        event; one whose process died is ended INTERRUPTED once its lease has run out
        (`SessionLeases.interrupt_abandoned_run`), which ends the watch. A runtime shutting
        down ends such a watch with RuntimeClosedError. Raises NotFoundError on the first
        iteration for an unknown run.
        """
        segment = self._segments.get(run_id)
        if segment is not None:
            async for event in segment.channel.subscribe(after_seq):
                yield event
            return
        run = await self.store.get_run(run_id)
        seq = 0
        async for time_of_event, stored in self._stored_events(run):
            seq += 1
            if seq > after_seq:
                yield SequencedEvent(run.id, run.session_id, seq, time_of_event, stored)

    async def _stored_events(self, run: Run) -> AsyncIterator[tuple[datetime, Event]]:
        """The run's events as the store has them, with the time each happened: `RunStarted`,
        its steps, and its terminal event, read again every `watch_poll_s` while it runs
        elsewhere."""
        yield run.create_time, RunStarted(run)
        loop = asyncio.get_running_loop()
        # Whether the run's server died is asked as often as live servers renew their leases.
        check_every = self._leases.session_lease_s / 3 if self._leases is not None else 0.0
        next_check = loop.time() + check_every
        start = run.first_sequence
        while True:
            # The run is read before its steps: a run found ended has all of its steps stored
            # (the loop stores them before it ends the run), so the read after gets them all.
            ended = run.status is not RunStatus.RUNNING
            if start:
                steps = await self.store.get_steps(
                    run.session_id, start, run.last_sequence if ended else None
                )
                for step in steps:
                    if step.run_id == run.id:
                        yield step.create_time or run.create_time, StepCompleted(step)
                if steps:
                    start = steps[-1].sequence + 1
            if ended:
                yield run.end_time or utc_now(), terminal_event(run)
                return
            await asyncio.sleep(self._watch_poll_s)
            if self._closing:
                raise RuntimeClosedError(
                    "the server is shutting down: watch the run again through another one"
                )
            run = await self.store.get_run(run.id)
            if (
                run.status is RunStatus.RUNNING
                and self._leases is not None
                and loop.time() >= next_check
            ):
                next_check = loop.time() + check_every
                if await self._leases.interrupt_abandoned_run(run.id):
                    run = await self.store.get_run(run.id)
            start = start or run.first_sequence

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish for up to `grace_s`, then interrupt the
        rest (INTERRUPTED, retryable) and wait for their rows to be finalised.
        """
        self._closing = True
        try:
            await self._drain(grace_s)
            await self.settle()
        finally:
            # Last: the leases of runs still finishing are kept until they have released.
            await self._stop_renewal()

    async def settle(self) -> None:
        """Wait (up to `cancel_wait_s`) for the clean-ups of failed or cancelled calls: runs
        they end and sessions they release (a transaction or two each). For a server
        stopping: after its calls are cancelled, before the store closes."""
        deadline = time.monotonic() + self._cancel_wait_s
        while self._cleanups and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(set(self._cleanups), timeout=left)

    async def _drain(self, grace_s: float) -> None:
        tasks = {s.task for s in self._segments.values() if s.task is not None}
        running = {task for task in tasks if not task.done()}
        if running and grace_s > 0:
            _, running = await asyncio.wait(running, timeout=grace_s)
        if not running:
            return
        signal = StopSignal(
            StopReason.INTERRUPTED, "the server is shutting down", "server", retryable=True
        )
        for segment in self._segments.values():
            if segment.task in running:
                segment.control.request_stop(copy.deepcopy(signal))
        await asyncio.wait(running, timeout=self._cancel_wait_s)

    # -- session leases ---------------------------------------------------------------------

    def _start_renewal(self) -> None:
        """Start the lease renewal and cancel request tasks, once, on the first run (they
        need a running loop)."""
        if self._leases is None or self._renewal is not None:
            return
        self._renewal = asyncio.create_task(
            self._renew_forever(self._leases), name="agio session lease renewal"
        )
        self._cancel_watch = asyncio.create_task(
            self._watch_cancel_requests(self._leases), name="agio cancel requests"
        )

    async def _stop_renewal(self) -> None:
        tasks = [task for task in (self._renewal, self._cancel_watch) if task is not None]
        self._renewal = self._cancel_watch = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_cancel_requests(self, leases: SessionLeases) -> None:
        """Stop live runs here that another replica was asked to cancel."""
        failing = False
        while True:
            await asyncio.sleep(self._cancel_poll_s)
            try:
                live = self._live_segments()
                requests = await leases.cancel_requests(live.keys()) if live else {}
                for run_id, signal in requests.items():
                    segment = live[run_id]
                    if segment.control.signal is None:  # not already on its way out
                        logger.info("run %s: cancel requested through another replica", run_id)
                        segment.control.request_stop(signal)
            except Exception as error:
                if not failing:  # once per outage, not every poll
                    logger.warning("could not act on cancel requests (will retry): %s", error)
                failing = True
            else:
                failing = False

    def _live_segments(self) -> dict[str, _Segment]:
        return {
            run_id: segment
            for run_id, segment in self._segments.items()
            if segment.task is not None and not segment.task.done()
        }

    async def _renew_forever(self, leases: SessionLeases) -> None:
        # A third of the lease: a renewal may fail (or be slow) twice before the lease ends.
        interval = leases.session_lease_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._renew_leases(leases)
            except StoreError as error:
                logger.warning("could not renew session leases (will retry): %s", error)
            except Exception:
                logger.exception("could not renew session leases (will retry)")

    async def _renew_leases(self, leases: SessionLeases) -> None:
        live = self._live_segments()
        if not live:
            return
        renewed = await leases.renew_leases(
            {segment.session_id: run_id for run_id, segment in live.items()}
        )
        for run_id, segment in live.items():
            if segment.session_id in renewed or segment.task is None or segment.task.done():
                continue
            # Released meanwhile (its loop is finishing: the stop is ignored) or taken over
            # after this process stalled past the lease: the session is no longer ours.
            logger.warning("run %s lost its lease on session %s", run_id, segment.session_id)
            segment.control.request_stop(lease_lost())

    # -- internals --------------------------------------------------------------------------

    def _spawn(
        self,
        run: Run,
        settings: RunSettings,
        plan: _RunPlan,
        first_steps: list[Step],
        deadline_s: float | None,
        trace: RunTrace,
        *,
        model_calls: int = 0,
    ) -> RunHandle:
        """Publish the segment's opening events and start its loop task."""
        trace.history_loaded(plan.kept_steps, len(plan.history) - plan.kept_steps)
        channel = RunChannel(run.id, run.session_id, start_after_seq=run.last_event_seq)
        control = RunControl()
        started = run.snapshot()
        channel.publish(RunStarted(started))
        for step in first_steps:
            channel.publish(StepCompleted(step))
        segment = _Segment(run.session_id, channel, control, settings)
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
                deadline_s=deadline_s,
                trace=trace,
                history_held=plan.history_held,
            ),
        )
        segment.task = asyncio.create_task(loop.run(), name=f"agio run {run.id}")
        segment.task.add_done_callback(lambda task: self._segment_ended(run.id, segment, task))
        # The loop ends its trace; this ends it too if the task never got to run.
        segment.task.add_done_callback(lambda _: trace.end(loop.run_row))
        self._segments.pop(run.id, None)
        self._segments[run.id] = segment
        self._ended.pop(run.id, None)  # a continued run (SubmitToolOutputs) is live again
        self._prune()
        self._start_renewal()
        return RunHandle(started, channel)

    def _segment_ended(self, run_id: str, segment: _Segment, task: asyncio.Task[Run]) -> None:
        segment.finished_at = time.monotonic()
        if not task.cancelled() and task.exception() is not None:
            logger.error("run loop task failed", exc_info=task.exception())
        if self._segments.get(run_id) is segment:  # not a segment a continuation replaced
            self._ended.pop(run_id, None)
            self._ended[run_id] = segment.finished_at
        self._prune()

    def _prune(self) -> None:
        now = time.monotonic()
        while self._ended:
            run_id, finished_at = next(iter(self._ended.items()))
            if len(self._ended) <= self._retention_count and now - finished_at <= self._retention_s:
                return
            del self._ended[run_id]
            segment = self._segments.get(run_id)
            if segment is not None and segment.finished_at is not None:
                # Not a continuation of the run that started since (SubmitToolOutputs).
                del self._segments[run_id]

    def _check_open(self) -> None:
        if self._closing:
            raise RuntimeClosedError()

    async def _check_request_id(self, session_id: str, request_id: str) -> None:
        for run in await self.store.list_runs(session_id, limit=_REQUEST_ID_SCAN):
            if run.request_id == request_id:
                raise DuplicateRequestError(request_id, run.id)

    async def _run_requiring_action(self, run_id: str) -> Run:
        run = await self.store.get_run(run_id)
        if run.status is not RunStatus.REQUIRES_ACTION:
            raise RunStateError(
                run_id,
                run.status.value,
                f"run {run_id!r} is {run.status.value}, not REQUIRES_ACTION",
            )
        return run

    def _settings_of(self, run: Run) -> RunSettings:
        """The run's stored settings; from memory or its agent when the store kept none."""
        if run.options:
            return RunSettings.from_options(run.options)
        segment = self._segments.get(run.id)
        if segment is not None:
            return segment.settings
        agent = self.agents.get(run.agent) or self.agent()
        return resolve_settings(agent, RunOverrides(), [])

    async def _settings_of_step(self, step: Step) -> tuple[str, RunSettings]:
        """The agent name and settings of the run that wrote `step` (else the default)."""
        try:
            run = await self.store.get_run(step.run_id) if step.run_id else None
        except NotFoundError:
            run = None
        if run is None or run.agent not in self.agents:
            agent = self.agent()
            return agent.name, resolve_settings(agent, RunOverrides(), [])
        return run.agent, self._settings_of(run)

    def _last_event_seq(self, run: Run) -> int:
        if run.last_event_seq:
            return run.last_event_seq
        segment = self._segments.get(run.id)
        return segment.channel.last_seq if segment is not None else 0

    async def _cancel_waiting_run(self, run_id: str, signal: StopSignal) -> Run:
        run = await self.store.get_run(run_id)
        if run.status is not RunStatus.REQUIRES_ACTION:
            return run
        history = await self.store.get_history(run.session_id, run.first_sequence or 1)
        assistant, pending = open_tool_calls(history)
        if assistant is not None and pending:
            why = f"the run was cancelled ({signal.message})"
            stored = await self.store.append_steps(
                [
                    Step(
                        run.session_id,
                        run.id,
                        Role.TOOL,
                        content=unfinished_result(call, why).content,
                        tool_call_id=call.id,
                        name=call.name,
                        is_error=True,
                    )
                    for call in pending
                ]
            )
            run.step_count += len(stored)
            run.last_sequence = stored[-1].sequence
        run.status = RunStatus.CANCELLED
        run.stop_signal = signal
        run.end_time = utc_now()
        await self.store.update_run(run)
        return run

    async def _take_session(self, session_id: str, run_id: str) -> None:
        """`acquire_session`, in a task of its own: a call cancelled meanwhile releases the
        session once the take has committed. A take that failed touches nothing: the holder
        may be another call of the same run (a second SubmitToolOutputs, a CancelRun)."""
        taking = asyncio.ensure_future(self.store.acquire_session(session_id, run_id))
        try:
            await asyncio.shield(taking)
        except asyncio.CancelledError:
            await self._clean_up(
                self._after_write(taking, lambda _: self._release_quietly(session_id, run_id))
            )
            raise

    async def _clean_up(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (undoing what a failed or cancelled call took) in a task of its own:
        it runs to its end even when the call is cancelled (again) while waiting for it;
        `settle` waits for what is still running."""
        task = asyncio.ensure_future(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        await asyncio.shield(task)  # a cancel goes on to the caller; the task runs on

    @staticmethod
    async def _after_write(
        writing: asyncio.Future[T],
        stored: Callable[[T], Awaitable[None]],
        *,
        failed: Callable[[BaseException], Awaitable[None]] | None = None,
    ) -> None:
        """Once a write the call stopped waiting for has ended (a transaction runs to its
        end): `stored` with what it stored if it committed, else `failed` with the error it
        raised."""
        try:
            result = await writing
        except BaseException as error:
            if failed is not None:
                await failed(error)
            return
        await stored(result)

    async def _end_if_stored(self, run_id: str, error: BaseException) -> None:
        """After a run's start transaction raised `error`: one that lost its connection may
        have committed all the same (at COMMIT). The run id is this call's own, so a
        RUNNING row is its doing: end it, freeing the session, rather than leave the
        client's retry refused as busy until the lease runs out. A refusal (busy, unknown
        session) stored nothing, and a store that cannot say leaves the run to its lease."""
        if not isinstance(error, StoreUnavailableError):
            return
        run = await self._stored_running(run_id)
        if run is not None:
            await self._end_unstarted(run)

    async def _end_if_continued(self, session_id: str, run_id: str) -> None:
        """After a continuation write that raised: it may have committed all the same (a
        connection lost after COMMIT). The session is still this call's, so a RUNNING row
        is its doing: end it after the outputs it stored. Else release the session; the run
        still waits for its outputs."""
        run = await self._stored_running(run_id)
        if run is not None:
            await self._end_unstarted(run)
        else:
            await self._release_quietly(session_id, run_id)

    async def _stored_running(self, run_id: str) -> Run | None:
        """The run as stored, if it is RUNNING: what a write whose outcome was unclear left.
        None as well when the store cannot say within `_UNCLEAR_WRITE_CHECK_S`: the caller's
        error waits for this, and a store that just failed may take its connect timeout to
        fail again."""
        try:
            async with asyncio.timeout(_UNCLEAR_WRITE_CHECK_S):
                run = await self.store.get_run(run_id)
        except Exception:  # TimeoutError included
            return None
        return run if run.status is RunStatus.RUNNING else None

    async def _end_unstarted(self, run: Run, resume_from_sequence: int = 0) -> None:
        """End a run whose call ended (cancelled, or failed) once its row may be stored
        RUNNING but before its loop started: INTERRUPTED, retryable from
        `resume_from_sequence` (0: after its last step), its session released; else its row
        would say RUNNING with no server running it, its session refusing the client's next
        call until the lease ran out. A row that is not RUNNING (the write never committed)
        stays as it is. Never raises."""
        signal = StopSignal(
            StopReason.INTERRUPTED,
            "the call that started (or continued) this run ended before the run went on",
            "server",
            retryable=True,
            resume_from_sequence=resume_from_sequence or run.last_sequence + 1,
        )
        ended = replace(run, status=RunStatus.INTERRUPTED, stop_signal=signal, end_time=utc_now())
        try:
            await self.store.end_run(ended)
        except NotFoundError:  # the run was never stored
            await self._release_quietly(run.session_id, run.id)
        except Exception:
            logger.exception("could not end run %s, which never started", run.id)
            await self._release_quietly(run.session_id, run.id)

    async def _release_quietly(self, session_id: str, run_id: str) -> None:
        try:
            await self.store.release_session(session_id, run_id)
        except Exception:
            logger.exception("could not release session %s held by run %s", session_id, run_id)


def _check_outputs(outputs: list[ToolOutput], pending: list[ToolCall]) -> dict[str, ToolOutput]:
    """The outputs by call id, if they answer exactly the pending calls."""
    if not pending:
        raise InvalidInputError("tool_outputs", "the run has no pending client tool calls")
    by_id: dict[str, ToolOutput] = {}
    duplicates: list[str] = []
    for output in outputs:
        if output.tool_call_id in by_id:
            duplicates.append(output.tool_call_id)
        by_id[output.tool_call_id] = output
    expected = [call.id for call in pending]
    unknown = [call_id for call_id in by_id if call_id not in expected]
    missing = [call_id for call_id in expected if call_id not in by_id]
    problems = []
    if duplicates:
        problems.append(f"duplicate tool_call_id(s): {', '.join(duplicates)}")
    if unknown:
        problems.append(f"unknown tool_call_id(s): {', '.join(unknown)}")
    if missing:
        problems.append(f"missing output(s) for tool_call_id(s): {', '.join(missing)}")
    if problems:
        raise InvalidInputError(
            "tool_outputs", "; ".join(problems) + f" (pending: {', '.join(expected)})"
        )
    return by_id


def _retry_plan(history: list[Step], sequence: int, *, kept_steps: int = 0) -> _RunPlan:
    """Where a retry run starts, given the steps that remain (see `Runtime.retry`)."""
    last = history[-1]
    if last.role is Role.ASSISTANT and not last.tool_calls:
        raise InvalidInputError(
            "sequence",
            f"step {last.sequence} before sequence {sequence} is a final assistant reply: "
            f"nothing to regenerate (retry from {last.sequence} to regenerate that reply)",
        )
    # Read holding the session, and what the retry deletes is after it: the log exactly.
    if last.role in (Role.ASSISTANT, Role.TOOL):
        _, open_calls = open_tool_calls(history)
        return _RunPlan(history, resume_calls=open_calls, kept_steps=kept_steps, history_held=True)
    return _RunPlan(history, kept_steps=kept_steps, history_held=True)
