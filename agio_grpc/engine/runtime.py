"""`Runtime`: the engine's API for the service layer — start, continue, retry, cancel, watch.

Each verb validates its request, reads what it decides on, has the lifecycle make the
transition (engine/lifecycle.py: one store transaction, which also journals the events it
announces), and spawns the run loop as an asyncio task the runtime owns. The caller streams
`RunHandle.events()`; leaving the stream does not stop the run — the service decides that
(a `Run` cancels on disconnect unless asked to continue; `StartRun` has no caller at all).

Verbs and their store calls (a Run, in every form, is one):
- `start_run`: `start_run` (take or create the session, check request_id and a waiting
  run, store the input, the run and `run_started`, read the history after the cached part).
- `submit_tool_outputs`: read the run; read the history after the cached part;
  `continue_run` (take the session, check the log is the one read, store the outputs).
- `retry`: read the last step's history and run; `restart_run` (take, check, delete, create).
- `cancel` of a run waiting for its client: read the run and its history; `end_waiting_run`.

Live segments are kept while their task runs; `watch` follows one live, and replays any
other run from the journal (engine/watching.py), exactly, across restarts and replicas.
Session leases and cancels across replicas are the `LeaseKeeper`'s (engine/leases.py).

Each segment gets a trace from the `RunTracer` (engine/tracing.py), started where the segment
is started, so it continues the caller's current trace context (the gRPC server span); its
first steps and the run row keep its ids. The loop task then ends it.

Never imports grpc, SQLAlchemy or OpenTelemetry; storage only through `StepStore`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import Context
from dataclasses import dataclass, field, replace
from typing import TypeVar

from agio_grpc.domain import (
    BusyPolicy,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopSignal,
    ToolCall,
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
    InvalidInputError,
    RunStateError,
    RuntimeClosedError,
)
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.history import CachedHistory, HistoryCache
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.leases import LeaseKeeper
from agio_grpc.engine.lifecycle import Lifecycle, cancelled, shutting_down, superseded
from agio_grpc.engine.loop import LoopServices, RunLoop, RunSegment
from agio_grpc.engine.model import ModelDriver
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import NO_TRACER, RunTrace, RunTracer
from agio_grpc.engine.watching import Watching, follow
from agio_grpc.store.errors import (
    HistoryChangedError,
    NotFoundError,
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
)
from agio_grpc.store.protocol import (
    HistoryMark,
    QueueRequest,
    RunStart,
    SessionLeases,
    StepStore,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How often a run interrupting a run that waits for its client ends that run and tries again
# (another client may put a new waiting run in its way meanwhile).
_INTERRUPT_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """The runtime's tuning knobs."""

    cancel_wait_s: float = 10.0
    """How long `cancel` waits for a running run to record its end (and `shutdown`, `settle`
    for runs and clean-ups still finishing)."""
    cancel_poll_s: float = 0.5
    """How often this process looks for cancel requests other replicas recorded for its live
    runs (with leases)."""
    watch_poll_s: float = 0.25
    """How often a watch of a run another process runs reads the journal."""
    history_cache_bytes: int = 64_000_000
    """The memory bound of the histories kept between runs (engine/history.py; 0 keeps
    none)."""
    max_queued_runs: int = 10
    """How many runs one session's queue may hold (BUSY_POLICY_ENQUEUE and the rest)."""


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
class _Segment:
    """A run segment this process runs."""

    session_id: str
    channel: RunChannel
    control: RunControl
    task: asyncio.Task[Run] | None = None


@dataclass(slots=True)
class _RunPlan:
    """Where a segment starts: the history, and tool calls to run before the model."""

    history: list[Step]
    """As `StepStore.get_history` reads it: the conversation, not the metrics."""
    resume_calls: list[ToolCall] = field(default_factory=list)
    kept_steps: int = 0
    """How many steps of `history` came from the history cache rather than the store."""


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
        options: RuntimeOptions | None = None,
        tracer: RunTracer | None = None,
        leases: SessionLeases | None = None,
    ) -> None:
        """`tracer` traces each run segment (nothing by default); `leases` renews the session
        leases of this process's live runs (the store's takes set them; its
        `session_lease_s` is the duration). Without `leases` nothing renews them: only for
        runs shorter than a lease."""
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
        self.options = options or RuntimeOptions()
        self.lifecycle = Lifecycle(store, self._start_next_soon)
        self._histories = HistoryCache(self.options.history_cache_bytes)
        self._services = LoopServices(
            store, registry, model, hooks or Hooks(), self._histories, self.lifecycle
        )
        self._segments: dict[str, _Segment] = {}
        self._closing = False
        self._tracer = tracer or NO_TRACER
        self._keeper = (
            LeaseKeeper(
                leases,
                store,
                self._live_controls,
                self.options.cancel_poll_s,
                on_tick=self._start_ready_queues,
            )
            if leases is not None
            else None
        )
        # Set (and replaced) whenever a segment starts here: a watch of a queued run wakes.
        self._spawned = asyncio.Event()
        self._watching = Watching(
            store,
            leases,
            self._live_channel,
            lambda: self._closing,
            self.options.watch_poll_s,
            lambda: self._spawned,
        )
        # Queued runs being started (`_start_next_soon`).
        self._starting: set[asyncio.Task[None]] = set()
        # Queued runs this process is starting: their callers follow their channels.
        self._starting_runs: set[str] = set()
        # The channels of runs queued here, while their handles live (`_queued`).
        self._queued_channels: weakref.WeakValueDictionary[str, RunChannel] = (
            weakref.WeakValueDictionary()
        )

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

    # -- the verbs --------------------------------------------------------------------------

    async def start_run(self, request: RunInput) -> RunHandle:
        """Store the user input as a step and start a run on it.

        Raises AgentNotFoundError, InvalidInputError, and the store's refusals, each before
        anything is written: NotFoundError (unknown session), SessionBusyError,
        RunRequiresActionError, DuplicateRequestError; RuntimeClosedError.
        """
        self._check_open()
        agent = self.agent(request.agent)
        if not request.input.strip():
            raise InvalidInputError("input", "must not be empty")
        settings = resolve_settings(agent, request.overrides, request.client_tools)
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
        cached = CachedHistory() if new_session else self._histories.cached(run.session_id)
        channel = RunChannel(run.id, run.session_id)
        try:
            started = await self._begin(run, user, channel, new_session, cached, request.on_busy)
        except BaseException:
            trace.end(run)  # no stop signal: the run never started
            raise
        if started.run.status is RunStatus.QUEUED:
            trace.end(started.run)  # it gets a trace of its own when it starts
            return self._queued(started, request.on_busy, channel)
        for step in started.steps:
            trace.step_stored(step.id, step.sequence)
        try:
            history = cached.join(started.history_start, started.history)
        except ValueError:
            trace.end(started.run)
            await self.lifecycle.abandon(started.run, channel)
            raise
        plan = _RunPlan(history, kept_steps=len(history) - len(started.history))
        return self._spawn(started.run, settings, plan, channel, request.deadline_s, trace)

    async def _begin(
        self,
        run: Run,
        user: Step,
        channel: RunChannel,
        new_session: Session | None,
        cached: CachedHistory,
        policy: BusyPolicy,
    ) -> RunStart:
        """`Lifecycle.begin` with the busy policy's queue; INTERRUPT and ROLLBACK end a run
        waiting for its client first (the store leaves that to the engine: its open calls
        need error results), then try again."""
        queue = self._queue_request(run.id, policy)
        for _ in range(_INTERRUPT_ATTEMPTS):
            try:
                return await self.lifecycle.begin(
                    run, [user], channel, new_session=new_session, since=cached.mark, queue=queue
                )
            except RunRequiresActionError as waiting:
                if queue is None or not queue.ahead:
                    raise
                blocking = await self.store.get_run(waiting.active_run_id)
                await self.lifecycle.end_idle(blocking, superseded(run.id, policy.value))
                if queue.rollback:
                    run.rollback_run_id = blocking.id
                    run.rollback_from = blocking.first_sequence
        return await self.lifecycle.begin(
            run, [user], channel, new_session=new_session, since=cached.mark, queue=queue
        )

    def _queue_request(self, run_id: str, policy: BusyPolicy) -> QueueRequest | None:
        if policy is BusyPolicy.REJECT:
            return None
        ahead = policy in (BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK)
        return QueueRequest(
            self.options.max_queued_runs,
            ahead=ahead,
            supersede=superseded(run_id, policy.value) if ahead else None,
            rollback=policy is BusyPolicy.ROLLBACK,
        )

    def _queued(self, started: RunStart, policy: BusyPolicy, channel: RunChannel) -> RunHandle:
        """A run stored QUEUED: the run it interrupts is stopped now if it runs here (one
        elsewhere finds the store's cancel request), and a free session starts its queue.
        Its channel (with its queued `run_started`) is kept for it while its handle lives:
        started here, it goes on in the same channel, so its caller misses nothing."""
        if started.interrupted:
            segment = self._live_segment(started.interrupted)
            if segment is not None:
                segment.control.request_stop(superseded(started.run.id, policy.value))
        run_id = started.run.id
        self._queued_channels[run_id] = channel
        if not started.holder:
            self._start_next_soon(started.run.session_id)
        return RunHandle(
            started.run.snapshot(), lambda after: self._follow_queued(run_id, channel, after)
        )

    async def _follow_queued(
        self, run_id: str, channel: RunChannel, after_seq: int
    ) -> AsyncIterator[SequencedEvent]:
        """A queued run's events: from its channel while it waits or runs here (the channel
        then has every one of them, to the terminal event); from the journal once it
        started (or ended) without this process."""
        queued_seq = channel.last_seq
        cursor = after_seq
        while True:
            events = channel.events_after(cursor)
            for event in events:
                yield event
                cursor = event.seq
                if event.is_terminal:
                    return
            if events or channel.last_seq > queued_seq or self._starts_here(run_id):
                await channel.wait_beyond(cursor, self.options.watch_poll_s)
                continue
            run = await self.store.get_run(run_id)
            if run.status is RunStatus.QUEUED or channel.last_seq > queued_seq:
                await channel.wait_beyond(cursor, self.options.watch_poll_s)
            elif not self._starts_here(run_id):
                async for event in self.watch(run_id, cursor):
                    yield event
                return

    def _start_next_soon(self, session_id: str) -> None:
        """Start the run heading the session's queue, in a task of its own (with a context
        of its own: its trace must not continue the trace of whatever freed the session)."""
        if self._closing:
            return
        task = asyncio.get_running_loop().create_task(
            self._start_next(session_id), name=f"agio queue {session_id}", context=Context()
        )
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _start_next(self, session_id: str) -> None:
        """Start the run heading the session's queue, if the session lets it. Never raises:
        what cannot start now is started by whichever transition frees the session next, or
        by the sweep of ready queues."""
        try:
            run = await self.store.next_queued_run(session_id)
            if run is None or self._closing:
                return
            settings = self._settings_of(run)
            trace = self._tracer.start_run(run, settings, "run")
            run.trace_id = trace.trace_id
            user = Step(
                session_id,
                run.id,
                Role.USER,
                content=run.input,
                trace_id=trace.trace_id,
                span_id=trace.span_id,
            )
            cached = self._histories.cached(session_id)
            # Not taken out until the run started: a start that loses the race leaves it.
            channel = self._queued_channels.get(run.id)
            if channel is None or channel.last_seq != run.last_event_seq:
                channel = RunChannel(run.id, session_id, start_after_seq=run.last_event_seq)
            self._starting_runs.add(run.id)
            try:
                await self._start_queued(run, settings, user, channel, cached, trace)
            finally:
                self._starting_runs.discard(run.id)
        except (SessionBusyError, RunStateConflictError):
            return  # another member started it, or something else holds the session
        except Exception:
            logger.exception("could not start the next queued run of session %s", session_id)

    async def _start_queued(
        self,
        run: Run,
        settings: RunSettings,
        user: Step,
        channel: RunChannel,
        cached: CachedHistory,
        trace: RunTrace,
    ) -> None:
        try:
            started = await self.lifecycle.begin_queued(run, [user], channel, cached.mark)
        except BaseException:
            trace.end(run)
            raise
        self._queued_channels.pop(run.id, None)
        try:
            history = cached.join(started.history_start, started.history)
        except ValueError:
            trace.end(started.run)
            await self.lifecycle.abandon(started.run, channel)
            return
        plan = _RunPlan(history, kept_steps=len(history) - len(started.history))
        self._spawn(started.run, settings, plan, channel, None, trace)

    async def _start_ready_queues(self) -> None:
        """Start the queues whose session freed with no one to start them (a crash)."""
        for session_id in await self.store.ready_queues():
            self._start_next_soon(session_id)

    async def submit_tool_outputs(
        self, run_id: str, outputs: list[ToolOutput], *, deadline_s: float | None = None
    ) -> RunHandle:
        """Store the caller's client tool results and continue the same run.

        The run must be REQUIRES_ACTION (else RunStateError); `outputs` must answer exactly
        its pending client calls (else InvalidInputError naming the ids). Event seqs continue
        from the run's last one; the new segment starts with `RunStarted` and a
        `StepCompleted` per stored output. Raises NotFoundError, SessionBusyError,
        HistoryChangedError (the log changed while the call decided).
        """
        self._check_open()
        run = _requiring_action(await self.store.get_run(run_id))
        settings = self._settings_of(run)

        async def submit(history: list[Step], kept: int) -> RunHandle:
            return await self._submit(run, settings, outputs, history, kept, deadline_s)

        return await self._on_history(run.session_id, submit)

    async def _submit(
        self,
        run: Run,
        settings: RunSettings,
        outputs: list[ToolOutput],
        history: list[Step],
        kept: int,
        deadline_s: float | None,
    ) -> RunHandle:
        run_id = run.id
        _, pending = open_tool_calls(history)
        by_id = _check_outputs(outputs, pending)
        run = replace(run)  # each try starts from the run as read
        trace = self._tracer.start_run(run, settings, "submit_tool_outputs")
        run.trace_id = run.trace_id or trace.trace_id
        steps = [
            Step(
                run.session_id,
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
        channel = RunChannel(run.id, run.session_id, start_after_seq=run.last_event_seq)
        try:
            continued = await self.lifecycle.resume(run, steps, channel, _mark(history))
        except RunStateConflictError as error:
            trace.end(run)
            raise RunStateError(run_id, error.status, str(error)) from None
        except BaseException:
            trace.end(run)
            raise
        for step in continued.steps:
            trace.step_stored(step.id, step.sequence)
        history.extend(continued.steps)
        model_calls = sum(
            1 for step in history if step.run_id == run_id and step.role is Role.ASSISTANT
        )
        plan = _RunPlan(history, kept_steps=kept)
        return self._spawn(
            continued.run, settings, plan, channel, deadline_s, trace, model_calls=model_calls
        )

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
        is gone). The write checks that the session's log is still the one read (else
        HistoryChangedError). Raises NotFoundError, InvalidInputError, SessionBusyError,
        RunRequiresActionError.
        """
        self._check_open()

        async def retry(whole: list[Step], kept: int) -> RunHandle:
            return await self._retry(session_id, sequence, whole, kept, deadline_s)

        return await self._on_history(session_id, retry)

    async def _retry(
        self,
        session_id: str,
        sequence: int,
        whole: list[Step],
        kept: int,
        deadline_s: float | None,
    ) -> RunHandle:
        if not whole:
            raise InvalidInputError("session_id", "the session has no steps to regenerate")
        if not 2 <= sequence <= len(whole) + 1:
            raise InvalidInputError(
                "sequence",
                f"must be between 2 and {len(whole) + 1} "
                "(at least one step must remain to regenerate from)",
            )
        history = whole[: sequence - 1]
        plan = _retry_plan(history, sequence)
        plan.kept_steps = min(kept, len(history))
        agent, settings = await self._settings_of_step(history[-1])
        run = Run(session_id=session_id, agent=agent, options=settings.to_options())
        trace = self._tracer.start_run(run, settings, "retry")
        run.trace_id = trace.trace_id
        channel = RunChannel(run.id, session_id)
        try:
            started = await self.lifecycle.restart(run, sequence, channel, _mark(whole))
        except BaseException:
            trace.end(run)
            raise
        return self._spawn(started, settings, plan, channel, deadline_s, trace)

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
        signal = cancelled(reason, source)
        if await self._stop_live(run_id, signal):
            return await self.store.get_run(run_id)
        run = await self.store.get_run(run_id)
        if run.status is RunStatus.RUNNING and self._keeper is not None:
            run = await self._keeper.cancel_elsewhere(run, signal, self.options.cancel_wait_s)
        if run.status not in (RunStatus.REQUIRES_ACTION, RunStatus.QUEUED):
            return run
        try:

            async def end(history: list[Step], _: int) -> Run | None:
                return await self.lifecycle.end_idle(run, signal, history)

            ended = await (
                self._on_history(run.session_id, end)
                if run.status is RunStatus.REQUIRES_ACTION
                else self.lifecycle.end_idle(run, signal)
            )
        except Exception:
            # A submit is continuing it right now: stop that segment instead.
            if await self._stop_live(run_id, signal):
                return await self.store.get_run(run_id)
            raise
        return ended or await self.store.get_run(run_id)

    async def watch(self, run_id: str, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """The run's events after `after_seq` up to its next terminal event: live (replay,
        then follow) for a run segment this process runs, else from the journal
        (engine/watching.py), the same events under the same seqs, deltas of finished steps
        left out. Raises NotFoundError on the first iteration for an unknown run, and
        RuntimeClosedError when the runtime closes while following a run elsewhere.
        """
        channel = self._live_channel(run_id)
        if channel is not None and after_seq >= channel.first_seq - 1:
            async for event in channel.subscribe(after_seq):
                yield event
            return
        async for event in follow(self._watching, run_id, after_seq):
            yield event

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish for up to `grace_s`, then interrupt the
        rest (INTERRUPTED, retryable) and wait for their rows to be finalised.
        """
        self._closing = True
        try:
            if self._starting:
                await asyncio.wait(set(self._starting), timeout=self.options.cancel_wait_s)
            running = {s.task for s in self._segments.values() if s.task and not s.task.done()}
            if running and grace_s > 0:
                _, running = await asyncio.wait(running, timeout=grace_s)
            for segment in list(self._segments.values()):
                if segment.task in running:
                    segment.control.request_stop(shutting_down())
            if running:
                await asyncio.wait(running, timeout=self.options.cancel_wait_s)
            await self.settle()
        finally:
            # Last: the leases of runs still finishing are kept until they have released.
            if self._keeper is not None:
                await self._keeper.stop()

    async def settle(self) -> None:
        """Wait (up to `cancel_wait_s`) for the clean-ups of failed or cancelled calls."""
        await self.lifecycle.settle(self.options.cancel_wait_s)

    # -- internals --------------------------------------------------------------------------

    def _spawn(
        self,
        run: Run,
        settings: RunSettings,
        plan: _RunPlan,
        channel: RunChannel,
        deadline_s: float | None,
        trace: RunTrace,
        *,
        model_calls: int = 0,
    ) -> RunHandle:
        """Start the segment's loop task (its opening events are published)."""
        trace.history_loaded(plan.kept_steps, len(plan.history) - plan.kept_steps)
        control = RunControl()
        segment = _Segment(run.session_id, channel, control)
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
                history_is_log=True,  # every plan is read with the session's log checked
            ),
        )
        started = run.snapshot()
        segment.task = asyncio.create_task(loop.run(), name=f"agio run {run.id}")
        segment.task.add_done_callback(lambda task: self._segment_ended(run.id, segment, task))
        # The loop ends its trace; this ends it too if the task never got to run.
        segment.task.add_done_callback(lambda _: trace.end(loop.run_row))
        self._segments[run.id] = segment
        if self._keeper is not None:
            self._keeper.start()
        self._spawned.set()
        self._spawned = asyncio.Event()
        return RunHandle(started, channel.subscribe)

    def _segment_ended(self, run_id: str, segment: _Segment, task: asyncio.Task[Run]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("run loop task failed", exc_info=task.exception())
        if self._segments.get(run_id) is segment:  # not a segment a continuation replaced
            del self._segments[run_id]

    def _starts_here(self, run_id: str) -> bool:
        """Whether the run runs here, or is being started here (queued before)."""
        return run_id in self._segments or run_id in self._starting_runs

    def _live_segment(self, run_id: str) -> _Segment | None:
        segment = self._segments.get(run_id)
        if segment is None or segment.task is None or segment.task.done():
            return None
        return segment

    def _live_channel(self, run_id: str) -> RunChannel | None:
        segment = self._segments.get(run_id)
        return segment.channel if segment is not None else None

    def _live_controls(self) -> Mapping[str, tuple[str, RunControl]]:
        return {
            run_id: (segment.session_id, segment.control)
            for run_id in list(self._segments)
            if (segment := self._live_segment(run_id)) is not None
        }

    async def _stop_live(self, run_id: str, signal: StopSignal) -> bool:
        """Stop the run's segment running here and wait (up to `cancel_wait_s`) for its end
        to be recorded; False when none runs here."""
        segment = self._live_segment(run_id)
        if segment is None or segment.task is None:
            return False
        segment.control.request_stop(copy.deepcopy(signal))
        await asyncio.wait({segment.task}, timeout=self.options.cancel_wait_s)
        return True

    def _check_open(self) -> None:
        if self._closing:
            raise RuntimeClosedError()

    def _settings_of(self, run: Run) -> RunSettings:
        """The run's stored settings; its agent's when the store kept none."""
        if run.options:
            return RunSettings.from_options(run.options)
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

    async def _on_history(
        self, session_id: str, decide: Callable[[list[Step], int], Awaitable[T]]
    ) -> T:
        """`decide(history, cached_steps)` on the session's history as this process last
        saw it (the history cache: no read), and once more on the history as stored when
        what it decided was refused for a log that changed meanwhile: its write checks the
        log's last step (HistoryChangedError), and a request it found invalid is checked
        again against the stored log."""
        cached = self._histories.cached(session_id)
        if cached.steps:
            try:
                return await decide(list(cached.steps), len(cached.steps))
            except (HistoryChangedError, InvalidInputError):
                self._histories.forget(session_id)
        history, kept = await self._read_through_cache(session_id)
        return await decide(history, kept)

    async def _read_through_cache(self, session_id: str) -> tuple[list[Step], int]:
        """The session's whole history: what the cache kept, then the steps stored after it,
        read from the store; with how many came from the cache."""
        cached = self._histories.cached(session_id)
        read = await self.store.get_history_since(session_id, cached.mark)
        history = cached.join(read.start, read.steps)
        return history, len(history) - len(read.steps)


def _mark(history: list[Step]) -> HistoryMark | None:
    """The last step of a history read, for a write to check it is still the log's end."""
    return HistoryMark(history[-1].sequence, history[-1].id) if history else None


def _requiring_action(run: Run) -> Run:
    if run.status is not RunStatus.REQUIRES_ACTION:
        raise RunStateError(
            run.id, run.status.value, f"run {run.id!r} is {run.status.value}, not REQUIRES_ACTION"
        )
    return run


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


def _retry_plan(history: list[Step], sequence: int) -> _RunPlan:
    """Where a retry run starts, given the steps that remain (see `Runtime.retry`)."""
    last = history[-1]
    if last.role is Role.ASSISTANT and not last.tool_calls:
        raise InvalidInputError(
            "sequence",
            f"step {last.sequence} before sequence {sequence} is a final assistant reply: "
            f"nothing to regenerate (retry from {last.sequence} to regenerate that reply)",
        )
    if last.role in (Role.ASSISTANT, Role.TOOL):
        _, open_calls = open_tool_calls(history)
        return _RunPlan(history, resume_calls=open_calls)
    return _RunPlan(history)
