"""`Runtime`: the engine's API for the service layer — start, continue, retry, cancel, follow.

Each verb validates its request, reads what it decides on, has the lifecycle make the
transition (engine/lifecycle.py: one store transaction, which also journals the events it
announces), and spawns the run loop as an asyncio task the runtime owns. The caller streams
`RunHandle.events()`; leaving the stream does not stop the run — the service decides that
(a `Run` cancels on disconnect unless asked to continue; `StartRun` has no caller at all).

Verbs and their store calls, with the session's history cached (as after a run here):
- `start_run`, in every form: `start_run` (take or create the session, or queue the run by
  its busy policy; check request_id; store the input, the run and `run_started`; read the
  history after the cached part).
- `submit_tool_outputs`: read the run; `continue_run` (take the session, check the log is
  the cached one, store the outputs).
- `retry`: read the settings of the last step's run; `restart_run` (take, check, delete,
  create).
- `cancel` of a run waiting for its client: read the run; `end_idle_run`.
A write refused for a log that changed is decided again once, on the log read afresh. A
verb on a caller's ids takes its `tenant`: another tenant's is missing (store/log.py).

The runtime's parts share one `LiveRuns` (engine/live.py: the segments live here, whether
the runtime is closing, the hook of a session that frees) and call nothing back in the
runtime: segments start through engine/segments.py (one path for a new run, direct or
queued), queued runs are engine/queues.py's, stops engine/stopping.py's, and `follow`
(engine/watching.py) follows a run live here, live from the member running it
(`RemoteRuns`, engine/remote.py), or from the journal, exactly, across restarts and
replicas. Session leases and cancels across replicas are the `LeaseKeeper`'s
(engine/leases.py).

A segment's trace (engine/tracing.py) continues the caller's trace context (the gRPC server
span); its first steps and run row keep its ids.

Never imports grpc, SQLAlchemy or OpenTelemetry; storage only through `Storage`'s roles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from agio_grpc.domain import DEFAULT_TENANT, Role, Run, RunStatus, Session, Step, StopSignal
from agio_grpc.engine.admission import RunSlots, Slot
from agio_grpc.engine.agents import (
    AgentCatalog,
    AgentSpec,
    RunInput,
    RunSettings,
    ToolOutput,
    check_agents,
    resolve_settings,
)
from agio_grpc.engine.approval_timeouts import ApprovalTimeouts
from agio_grpc.engine.approvals import SERVER_DECIDER, Answers, ToolApproval
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import context_steps
from agio_grpc.engine.errors import InvalidInputError, RunStateError, RuntimeClosedError
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.history import CachedHistory, HistoryCache, mark_of
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.leases import LeaseKeeper
from agio_grpc.engine.lifecycle import cancelled, shutting_down
from agio_grpc.engine.live import LiveRuns
from agio_grpc.engine.loop import LoopServices
from agio_grpc.engine.models import ModelDriver
from agio_grpc.engine.options import RuntimeOptions
from agio_grpc.engine.queues import RunQueues
from agio_grpc.engine.remote import FollowedEvent, RemoteRuns
from agio_grpc.engine.segments import RunHandle, RunPlan, Segments, retry_plan
from agio_grpc.engine.stopping import RunStops
from agio_grpc.engine.storage import Storage
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import NO_TRACER, RunTracer
from agio_grpc.engine.watching import Watching
from agio_grpc.store import NotFoundError, RunStateConflictError

logger = logging.getLogger(__name__)


class Runtime:
    """Runs agents on sessions; the one object the service layer drives."""

    def __init__(
        self,
        storage: Storage,
        agents: dict[str, AgentSpec],
        default_agent: str,
        registry: ToolRegistry,
        model: ModelDriver,
        hooks: Hooks | None = None,
        *,
        options: RuntimeOptions | None = None,
        tracer: RunTracer | None = None,
        remote: RemoteRuns | None = None,
    ) -> None:
        """`storage` holds the store's roles (its `leases` renew the sessions of this process's
        live runs); `tracer` traces each run segment (nothing by default); `remote` reaches
        the runs other members run (followed live, told of cancels; without it, through the
        store only)."""
        check_agents(agents, default_agent, registry)
        self.log, self.runs, leases = storage.log, storage.runs, storage.leases
        self.agents = agents
        self.default_agent = default_agent
        self.registry = registry
        self.options = options = options or RuntimeOptions()
        self._catalog = AgentCatalog(agents, default_agent, registry)
        self._tracer = tracer or NO_TRACER
        self._live = live = LiveRuns()
        self.lifecycle = storage.lifecycle
        self.lifecycle.on_session_free = live.session_freed
        self._histories = HistoryCache(options.history_cache_bytes)
        services = LoopServices(
            self.log, registry, model, hooks or Hooks(), self._histories, self.lifecycle
        )
        self._keeper = (
            LeaseKeeper(
                leases, self.log, self.runs, self.lifecycle, live, options.cancel_poll_s, remote
            )
            if leases is not None
            else None
        )
        slots = RunSlots(options.max_running_runs, options.admission_wait_s)
        self._segments = Segments(services, live, slots, self._keeper)
        self._stops = RunStops(
            self.log,
            self.runs,
            live,
            self.lifecycle,
            self._histories,
            self._keeper,
            options.cancel_wait_s,
        )
        self._watching = Watching(
            self.runs, self.lifecycle, live, options.watch_poll_s, leases, remote
        )
        self._approval_timeouts = ApprovalTimeouts(
            self.lifecycle, self._time_out_approvals, options.approval_poll_s
        )
        self._queues = RunQueues(
            self.runs,
            self.lifecycle,
            live,
            self._segments,
            histories=self._histories,
            tracer=self._tracer,
            catalog=self._catalog,
            stops=self._stops,
            watching=self._watching,
            options=options,
        )

    # -- agents and context -----------------------------------------------------------------

    def agent(self, name: str = "") -> AgentSpec:
        """The named agent ("" = the default). Raises AgentNotFoundError."""
        return self._catalog.agent(name)

    async def next_context(
        self, session_id: str, agent: str = "", *, tenant: str | None = None
    ) -> list[Step]:
        """What the model would receive next on the session (GetContext): the system prompt
        (sequence 0), then the stored steps as repaired by `build_context`. Raises
        NotFoundError (also for a session that is not `tenant`'s, when given).
        """
        spec = self.agent(agent)
        steps = await self.log.get_steps(session_id, tenant=tenant)
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
        tools = self._catalog.tools_of(agent)
        settings = resolve_settings(
            agent,
            request.overrides,
            request.client_tools,
            tools,
            output_schema=request.output_schema,
            require_approval=request.require_approval,
        )
        new_session = None if request.session_id else Session(tenant=request.tenant)
        run = Run(
            session_id=new_session.id if new_session else request.session_id,
            agent=agent.name,
            request_id=request.request_id,
            metadata=dict(request.metadata),
            options=settings.to_options(),
            tenant=request.tenant,
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
            slot = await self._segments.admit(request.deadline_at)
            with slot:
                started = await self._queues.begin(
                    run, user, channel, new_session, cached.mark, request
                )
                if started.run.status is RunStatus.QUEUED:
                    trace.end(started.run)  # it gets a trace of its own when it starts
                    return self._queues.handle(
                        started, request.on_busy, channel, request.deadline_at
                    )
                return await self._segments.spawn_started(
                    started, cached, settings, channel, trace, request.deadline_at, slot
                )
        except BaseException:
            trace.end(run)  # no stop signal: the run never started
            raise

    async def submit_tool_outputs(
        self,
        run_id: str,
        outputs: list[ToolOutput],
        *,
        deadline_at: float | None = None,
        tenant: str | None = None,
        approvals: list[ToolApproval] | None = None,
        decided_by: str = "",
    ) -> RunHandle:
        """Store the caller's client tool results and decisions, and continue the same run.

        The run must be REQUIRES_ACTION (else RunStateError); `outputs` must answer exactly
        its pending client calls and `approvals` decide exactly its calls waiting for
        approval (else InvalidInputError naming the ids; engine/approvals.py), each decision
        kept with `decided_by`. Event seqs continue from the run's last one; the new segment
        starts with `RunStarted` and a `StepCompleted` per stored output or rejection, then
        runs the approved calls. Raises NotFoundError (also for a run that is not
        `tenant`'s, when given), SessionBusyError, HistoryChangedError (the log changed
        while the call decided).
        """
        self._check_open()
        run = RunStateError.unless_waiting(await self.runs.get_run(run_id, tenant=tenant))
        settings = self._catalog.settings_of(run)

        async def submit(history: list[Step], kept: int) -> RunHandle:
            answers = Answers(outputs, approvals or [], decided_by)
            return await self._submit(run, settings, answers, history, kept, deadline_at, slot)

        with await self._segments.admit(deadline_at) as slot:
            try:
                return await self._histories.decide(self.log, run.session_id, submit)
            except InvalidInputError:  # no calls left to answer: ended meanwhile?
                RunStateError.unless_waiting(await self.runs.get_run(run_id, tenant=tenant))
                raise

    async def _submit(
        self,
        run: Run,
        settings: RunSettings,
        answers: Answers,
        history: list[Step],
        kept: int,
        deadline_at: float | None,
        slot: Slot,
    ) -> RunHandle:
        run_id = run.id
        decided = answers.decide(run, settings, history)
        run = replace(run)  # each try starts from the run as read
        trace = self._tracer.start_run(run, settings, "submit_tool_outputs")
        run.trace_id = run.trace_id or trace.trace_id
        steps = decided.traced(trace)
        channel = RunChannel(run.id, run.session_id, start_after_seq=run.last_event_seq)
        try:
            continued = await self.lifecycle.resume(run, steps, channel, mark_of(history))
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
        plan = RunPlan(history, decided.approved, kept, decided.decisions, decided.waits)
        return self._segments.spawn(
            continued.run, settings, plan, channel, deadline_at, trace, model_calls, slot
        )

    async def expire_approvals(self) -> int:
        """Answer now every wait for approval past its `approval_timeout_s` (what the sweep
        of every process does, engine/approval_timeouts.py); how many this call answered."""
        return await self._approval_timeouts.expire_due()

    async def _time_out_approvals(self, run: Run) -> None:
        """Answer `run`'s wait past its approval deadline as the server (`ApprovalTimeouts`):
        its held calls rejected "timed out", and the run goes on with no caller."""
        self._check_open()
        settings = self._catalog.settings_of(run)
        answers = Answers([], [], SERVER_DECIDER, timed_out=True)

        async def submit(history: list[Step], kept: int) -> RunHandle:
            return await self._submit(run, settings, answers, history, kept, None, slot)

        with await self._segments.admit(None) as slot:
            await self._histories.decide(self.log, run.session_id, submit)

    async def retry(
        self,
        session_id: str,
        sequence: int,
        *,
        deadline_at: float | None = None,
        tenant: str = DEFAULT_TENANT,
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
        retryable stop's `resume_from_sequence` is used). Sequence 1, or an empty session,
        is an InvalidInputError. The run has the agent and settings of the run that wrote the
        remaining last step (else the default agent's); the write checks the log is still
        the one read (else HistoryChangedError); `tenant`'s run, on a session of its only.
        Raises NotFoundError (also for another tenant's session, before anything is decided
        on it), InvalidInputError, SessionBusyError, RunRequiresActionError.
        """
        self._check_open()

        async def retry(whole: list[Step], kept: int) -> RunHandle:
            run = Run(session_id, "", tenant=tenant)  # its agent and settings: `_retry`'s
            return await self._retry(run, sequence, whole, kept, deadline_at, slot)

        with await self._segments.admit(deadline_at) as slot:
            return await self._histories.decide(self.log, session_id, retry, tenant=tenant)

    async def _retry(
        self,
        run: Run,
        sequence: int,
        whole: list[Step],
        kept: int,
        deadline_at: float | None,
        slot: Slot,
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
        plan = retry_plan(history, sequence)
        plan.kept_steps = min(kept, len(history))
        run.agent, settings = await self._settings_of_step(history[-1])
        run.options = settings.to_options()
        trace = self._tracer.start_run(run, settings, "retry")
        run.trace_id = trace.trace_id
        channel = RunChannel(run.id, run.session_id)
        try:
            started = await self.lifecycle.restart(run, sequence, channel, mark_of(whole))
        except BaseException:
            trace.end(run)
            raise
        return self._segments.spawn(started, settings, plan, channel, deadline_at, trace, slot=slot)

    async def cancel(
        self, run_id: str, reason: str, source: str = "client", *, tenant: str | None = None
    ) -> Run:
        """`stop` the run CANCELLED (a CancelRun, or a caller gone)."""
        return await self.stop(run_id, cancelled(reason, source), tenant=tenant)

    async def stop(self, run_id: str, signal: StopSignal, *, tenant: str | None = None) -> Run:
        """Stop a run with `signal`; idempotent. Returns the run as stored afterwards.

        A run here stops with it (open calls get error results; waited for up to
        `cancel_wait_s`), as does a REQUIRES_ACTION one; a QUEUED one never starts; an ended
        one is returned as it is. A run another process runs gets a cancel request on its
        row (that process is told at once, else finds it within its `cancel_poll_s`; waited
        for alike); one whose process died ends INTERRUPTED once its lease ran out. Never
        SESSION_BUSY. Raises NotFoundError, also for another `tenant`'s run (left as it is).
        """
        return await self._stops.stop(run_id, signal, tenant=tenant)

    def history_cache_bytes(self) -> int:
        """The estimated memory of the histories kept between runs (a metric reads it)."""
        return self._histories.size

    def follow(self, run_id: str, after_seq: int = 0) -> AsyncIterator[FollowedEvent]:
        """The run's events after `after_seq` up to its next terminal event: live for a run
        segment this process runs, live from the member running it (relayed as it streamed
        them), else from the journal (engine/watching.py), without the deltas of finished
        steps. Raises NotFoundError on the first iteration for an unknown run,
        RuntimeClosedError when the runtime closes while following one elsewhere."""
        return self._watching.follow(run_id, after_seq)

    def follow_here(self, run_id: str, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """`follow` without relaying another member's stream: what a member serves the
        others (a relay of a relay would chain members)."""
        return self._watching.follow_here(run_id, after_seq)

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish for up to `grace_s`, then interrupt the
        rest (INTERRUPTED, retryable) and wait for their rows to be finalised.
        """
        self._live.closing = True
        await self._approval_timeouts.stop()
        try:
            await self._queues.settle(self.options.cancel_wait_s)
            running = self._live.running()
            if running and grace_s > 0:
                _, running = await asyncio.wait(running, timeout=grace_s)
            self._live.stop_all(running, shutting_down())
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

    def start(self) -> None:
        """Start the lease keeper (renewals, cancels from other replicas, the sweep of queues
        a crash left): the app calls this at once, since a restarted server has queues to
        start before anyone runs anything on it; else the first run here does."""
        if self._keeper is not None:
            self._keeper.start()
        self._approval_timeouts.start()

    def _check_open(self) -> None:
        if self._live.closing:
            raise RuntimeClosedError()

    async def _settings_of_step(self, step: Step) -> tuple[str, RunSettings]:
        """The agent name and settings of the run that wrote `step` (else the default)."""
        try:
            run = await self.runs.get_run(step.run_id) if step.run_id else None
        except NotFoundError:
            run = None
        if run is None or run.agent not in self.agents:
            agent = self.agent()
            return agent.name, self._catalog.default_settings(agent)
        return run.agent, self._catalog.settings_of(run)
