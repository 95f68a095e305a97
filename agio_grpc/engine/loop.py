"""One run segment's agent loop (DESIGN.md section 3), from its first model call to its end.

    [run pending tool calls] -> limits? -> build context -> model call (deltas streamed)
        -> a reply that stops the run: stored with the run's end (one write), stop
        -> store assistant step -> server tools in parallel -> store tool steps in call order
        -> stop signals? -> loop

A reply that stops the run is stored by the end's own transaction (`_ends_with`: not when
it has tool calls, which get results first, nor when after_step hooks must see it stored
before the end), so a run that asks the model once costs two writes: its start and its end.

Calls of client tools and calls needing approval (engine/approvals.py) are not run: once
the turn's other calls have their results, the segment ends REQUIRES_ACTION with them open.

A segment is a `Run` call, a `SubmitToolOutputs` continuation or a `Retry`; the runtime
stores its first steps (user input, tool outputs) and hands it over. Every stop — normal,
limit, cancel, timeout, shutdown, model error, hook, unexpected exception — is caught at ONE
boundary (`RunLoop.run`) and becomes a StopSignal; `_finish` then, on every path: stores a
synthetic error result for each tool call left without one (so the history stays valid),
and has the lifecycle (engine/lifecycle.py) end the run: its row (the status the signal's
reason leaves it in, `domain.status_for`), the session's release and the terminal event in
one transaction, then exactly one terminal event published. An INTERRUPTED run's
resume_from_sequence points at the first step the interruption wrote, so Retry re-runs the
interrupted tools.

Every store write journals the events it announces (engine/journal.py) in its own
transaction, and they are published once it committed, under the seqs they were stored with.
What running tools report of their progress is published live only while they run
(engine/progress.py), never during a write.

Limits: a step's tool calls always run before a limit stops the run, so a limit never
leaves a call without a result. MAX_STEPS counts model calls over the whole run; the run
timeout (the smaller of the configured timeout and the caller's deadline) applies to each
segment. A model reply cut off by `length` or `content_filter` stops the run without
running its tool calls (they get error results). A tool's own stop (ToolStop: TOOL_STOP;
an error result of a tool configured `on_error: stop`, or a result over the step limit:
TOOL_ERROR) likewise ends the run only once every call of the step has its result stored.

Structured output (engine/output.py): in a run with an output schema, a reply without tool
calls is the final answer and is validated; an invalid one is answered with a repair user
step (its errors) and the loop goes on, up to the agent's `output_retries` and while no limit
forbids another call; else the run stops OUTPUT_INVALID. A valid one is the run's output.

Tracing goes through `segment.trace` (engine/tracing.py): one child per model call and per
tool call, whose ids the produced step keeps; `_finish` ends the segment's trace just before
the terminal event, so a client that saw the end can find the whole trace.

Never imports grpc, SQLAlchemy or OpenTelemetry; stores steps only through the `SessionLog`,
and changes runs only through the lifecycle.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from agio_grpc.domain import (
    ApprovalDecision,
    Role,
    Run,
    Step,
    StepMetrics,
    StopReason,
    StopSignal,
    ToolCall,
    Usage,
    new_id,
    pick_stop_signal,
    unfinished_reason,
)
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.approvals import held_calls, waiting_signal
from agio_grpc.engine.channel import Announce, RunChannel
from agio_grpc.engine.compaction import (
    MAX_COMPACTIONS_PER_CALL,
    Compacting,
    Summary,
    Trigger,
    context_window_signal,
)
from agio_grpc.engine.context_window import LEARNED_WINDOWS, context_refusal
from agio_grpc.engine.control import RunControl, StopRequested
from agio_grpc.engine.events import (
    ErrorNotice,
    StepStarted,
)
from agio_grpc.engine.executor import execute_tool_calls, unfinished_result
from agio_grpc.engine.history import HistoryCache
from agio_grpc.engine.hooks import Hook, Hooks, StopRun, call_hooks
from agio_grpc.engine.lifecycle import (
    Lifecycle,
    completed,
    deadline_reached,
    internal_error,
    lease_lost,
    task_cancelled,
)
from agio_grpc.engine.model_call import (
    ModelCall,
    model_error_signal,
    model_request,
    streamed_to,
)
from agio_grpc.engine.models import (
    ModelDriver,
    ModelError,
    ModelReply,
)
from agio_grpc.engine.output import OutputAttempts, answer_of
from agio_grpc.engine.progress import ProgressRelay
from agio_grpc.engine.tools import ToolContext, ToolRegistry, ToolResult
from agio_grpc.engine.tracing import NO_RUN_TRACE, RunTrace, SpanIds, ToolCallTrace
from agio_grpc.store.errors import LeaseLostError
from agio_grpc.store.log import SessionLog

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoopServices:
    """What every loop uses: storage, tools, the model, the hooks, the histories kept
    between runs (a loop hands its history over when it ends) and the run lifecycle."""

    log: SessionLog
    registry: ToolRegistry
    model: ModelDriver
    hooks: Hooks
    histories: HistoryCache
    lifecycle: Lifecycle


@dataclass(slots=True)
class RunSegment:
    """One segment of a run, as the runtime hands it to the loop."""

    run: Run
    settings: RunSettings
    history: list[Step]
    """The session's steps so far, including the ones this segment already stored. Steps
    read back from the store carry the conversation only (`SessionLog.get_history`): their
    metrics, create_time and trace ids are defaults. Build messages from them, not totals."""
    channel: RunChannel
    control: RunControl
    model_calls: int = 0
    """Model calls the run made in earlier segments (for max_steps)."""
    resume_calls: list[ToolCall] = field(default_factory=list)
    """Tool calls of the last assistant step to run before the first model call (Retry, and
    approved calls of a SubmitToolOutputs)."""
    decisions: dict[str, ApprovalDecision] = field(default_factory=dict)
    """Decisions on calls that waited for approval, by call id (engine/approvals.py)."""
    approval_waits: dict[str, float] = field(default_factory=dict)
    """Seconds each decided call waited, by call id (its trace's `approved`)."""
    deadline_at: float | None = None
    """The caller's deadline as the event loop's time (`loop.time()`)."""
    trace: RunTrace = NO_RUN_TRACE
    """The segment's trace, ended by the loop (its model and tool calls are its children)."""
    history_is_log: bool = False
    """`history` was read while the segment held its session (so it is the stored log, and
    the loop may hand it to the history cache when it ends)."""


class _Stop(Exception):  # noqa: N818 - internal control flow
    """Ends the loop with a signal raised deep inside a phase."""

    def __init__(self, signal: StopSignal) -> None:
        super().__init__(signal.message)
        self.signal = signal


class RunLoop:
    """Drives one run segment; `run()` returns the final run row, never raises."""

    def __init__(self, services: LoopServices, segment: RunSegment) -> None:
        self.services = services
        self.segment = segment
        self.run_row = segment.run
        self.channel = segment.channel
        self.control = segment.control
        self.settings = segment.settings
        self.history = segment.history
        self.model_calls = segment.model_calls
        # The assistant step whose tool calls have no stored result yet, and those calls.
        self.pending_step: Step | None = None
        self.pending_calls: dict[str, ToolCall] = {}
        self.finished_results: dict[str, ToolResult] = {}
        # Step ids announced by StepStarted for tool calls, reused when a call never returns.
        self.tool_step_ids: dict[str, str] = {}
        self.trace = segment.trace
        # The span of each tool call that started, for its step's trace and span ids.
        self.tool_spans: dict[str, SpanIds] = {}
        self.progress = ProgressRelay(self.channel)
        # The reply that stopped the run, stored with its end (`_ends_with`).
        self.last_step: Step | None = None
        output = segment.settings.output
        self.output_attempts = OutputAttempts(output) if output is not None else None

    async def run(self) -> Run:
        """Run the segment to its end: the one boundary where every stop is caught."""
        timer = self._start_timer()
        with self.trace.activate():
            return await self._run(timer)

    async def _run(self, timer: asyncio.TimerHandle) -> Run:
        reraise: asyncio.CancelledError | None = None
        try:
            task = asyncio.current_task()
            assert task is not None
            self.control.start(task)
            if self.services.hooks.on_run_start:
                await self._call_hooks(self.services.hooks.on_run_start, self._snapshot())
            if self.segment.resume_calls:
                signal = await self._resume_tool_calls()
            else:
                signal = await self._drive()
        except (StopRequested, asyncio.CancelledError) as stop:
            signal = self._requested_signal()
            if isinstance(stop, asyncio.CancelledError):
                _uncancel()  # the stop is handled here; finishing must not be cancelled
                if not self.control.delivered:  # someone else's cancel (loop teardown)
                    reraise = stop
        except _Stop as stop:
            signal = stop.signal
        except StopRun as stop:
            signal = stop.signal
        except LeaseLostError:
            signal = lease_lost()
        except Exception as error:
            signal = internal_error(error)
        finally:
            timer.cancel()
        self.control.finish()
        try:
            run = await self._finish(signal)
        finally:
            self.trace.end(self.run_row)
        if reraise is not None:
            raise reraise
        return run

    async def _drive(self) -> StopSignal:
        while True:
            self.control.check()
            if signal := pick_stop_signal(self._limits_reached()):
                return signal
            assistant, reply = await self._model_step()
            signal = self._reply_signal(assistant, reply)
            if signal is not None and self._ends_with(assistant):
                self.last_step = assistant  # stored with the run's end: one write fewer
                return signal
            (assistant,) = await self._store_steps([assistant])
            if signal is not None:
                return signal
            if assistant.tool_calls:
                signals = await self._run_tool_calls(assistant.tool_calls)
            else:  # an invalid structured answer (`_answer_signal`): ask again
                signals = await self._ask_for_repair(assistant)
            if signal := pick_stop_signal(signals + self._limits_reached()):
                return signal

    async def _resume_tool_calls(self) -> StopSignal:
        """Retry from an assistant step: run its unanswered calls, then go on as usual."""
        assistant = next(step for step in reversed(self.history) if step.role is Role.ASSISTANT)
        self.pending_step = assistant
        self.pending_calls = {call.id: call for call in self.segment.resume_calls}
        signals = await self._run_tool_calls(self.segment.resume_calls)
        if signal := pick_stop_signal(signals):
            return signal
        return await self._drive()

    # -- model ------------------------------------------------------------------------------

    async def _model_step(self) -> tuple[Step, ModelReply]:
        """Call the model with the history (compacted first when it nears the window) and
        stream its deltas: the assistant step, not stored yet (its sequence is the one it
        will be stored at). A context the provider finds too long is compacted once and the
        call made again."""
        await self._compact("threshold")
        call = await self._model_call()
        self.channel.publish(StepStarted(step_id=call.step_id, role=Role.ASSISTANT))
        self.model_calls += 1
        try:
            called = await call.reply(streamed_to(self.channel, call.step_id))
        except ModelError as error:
            refusal = context_refusal(error)
            if refusal is None:
                raise _Stop(self._model_error_signal(error)) from None
            LEARNED_WINDOWS.learn(self.settings.model, refusal)
            if not await self._compact("overflow"):
                raise _Stop(context_window_signal(error)) from None
            call = await self._model_call(call.step_id)
            try:
                called = await call.reply(streamed_to(self.channel, call.step_id))
            except ModelError as again:
                if context_refusal(again) is not None:
                    raise _Stop(context_window_signal(again)) from None
                raise _Stop(self._model_error_signal(again)) from None
        reply = answer_of(self.settings.output, called.reply)
        step = Step(
            session_id=self.run_row.session_id,
            run_id=self.run_row.id,
            role=Role.ASSISTANT,
            content=reply.content,
            reasoning_content=reply.reasoning_content,
            tool_calls=reply.tool_calls,
            metrics=reply.metrics,
            id=call.step_id,
            sequence=self._next_sequence(),
            trace_id=called.trace_id,
            span_id=called.span_id,
        )
        self.run_row.usage.add(reply.metrics)
        self.run_row.tool_call_count += len(reply.tool_calls)
        return step, reply

    def _ends_with(self, answer: Step) -> bool:
        """Whether the run's last step, a reply that stops it, is stored with its end: unless
        it has calls (they get results first) or after_step hooks must see it stored first."""
        return not answer.tool_calls and not self.services.hooks.after_step

    def _model_error_signal(self, error: ModelError) -> StopSignal:
        return model_error_signal(error, self._next_sequence())

    async def _model_call(self, step_id: str = "") -> ModelCall:
        request = model_request(self.settings, self.services.registry, self.history, self.trace)
        if self.services.hooks.before_model_call:
            await self._call_hooks(
                self.services.hooks.before_model_call, self._snapshot(), request.messages
            )
        return ModelCall(
            self.services.model,
            self.trace,
            request,
            step_id or new_id("step"),
            self._next_sequence(),
        )

    async def _compact(self, trigger: Trigger) -> bool:
        """Summarize the oldest steps (engine/compaction.py) when `trigger` calls for it and
        a cut is possible: store the summary step with its `context_compacted` event.
        Returns whether it did. A summary call that fails is reported as a COMPACTION_FAILED
        notice and the run goes on without it (on an overflow the run stops: CONTEXT_WINDOW
        when not even one turn fits a summary request, else MODEL_ERROR)."""
        compacted: Summary | None = None
        for _ in range(MAX_COMPACTIONS_PER_CALL):
            compacting = Compacting.planned(
                self.settings, self.services.registry, self.history, trigger, after=compacted
            )
            summary = None if compacting is None else await self._summarize(compacting)
            if summary is None:
                break
            compacted = summary
        return compacted is not None

    async def _summarize(self, compacting: Compacting) -> Summary | None:
        """Store the summary `compacting` plans; None when its call failed (threshold)."""
        trigger = compacting.trigger
        step = Step(self.run_row.session_id, self.run_row.id, Role.SUMMARY)
        self.channel.publish(StepStarted(step_id=step.id, role=Role.SUMMARY))
        try:
            summary = await compacting.summarize(
                self.services.model, self.trace, step, self._next_sequence()
            )
        except ModelError as error:
            if trigger == "overflow" and context_refusal(error) is not None:
                raise _Stop(context_window_signal(error)) from None
            if trigger == "overflow":
                raise _Stop(self._model_error_signal(error)) from None
            self.channel.publish(ErrorNotice("COMPACTION_FAILED", error.message, "model"))
            return None
        self.run_row.usage.add(summary.step.metrics)
        await self._store_steps([summary.step], announce=summary.announce)
        self.trace.compacted(trigger, summary.tokens_before, summary.tokens_after)
        return summary

    def _reply_signal(self, assistant: Step, reply: ModelReply) -> StopSignal | None:
        """The stop signal a model reply raises by itself (None: run its tool calls)."""
        reason = reply.stop_reason
        if reply.oversized:
            limit = self.settings.limits.max_step_bytes
            signal = StopSignal(
                StopReason.MAX_TOKENS,
                f"the reply was cut off at the step limit of {limit} bytes",
                "model",
                context={"max_step_bytes": limit},
            )
        elif reason is StopReason.MAX_TOKENS:
            signal = StopSignal(reason, "the reply was cut off at max_tokens", "model")
        elif reason is StopReason.CONTENT_FILTER:
            signal = StopSignal(reason, "the provider's content filter stopped the reply", "model")
        elif reply.refusal:
            signal = StopSignal(
                StopReason.CONTENT_FILTER, f"the model refused: {reply.refusal}", "model"
            )
        elif not assistant.tool_calls:
            answered = self._answer_signal(assistant)
            if answered is None:
                return None
            signal = answered
        else:
            return None
        return pick_stop_signal([signal, *self._budget_reached()])

    # -- structured output (engine/output.py) -----------------------------------------------

    def _answer_signal(self, answer: Step) -> StopSignal | None:
        """A final answer's stop: COMPLETED (its output kept on the run when it has a
        schema), OUTPUT_INVALID, or None when an invalid one is to be repaired."""
        attempts = self.output_attempts
        if attempts is None:
            return StopSignal(StopReason.COMPLETED, "", "model")
        checked = attempts.check(answer)
        if checked.valid:
            self.run_row.output_json = checked.output_json
            return StopSignal(StopReason.COMPLETED, "", "model")
        self.trace.output_invalid(checked, attempts.repairs)
        if attempts.may_repair() and not self._limits_reached():
            return None
        return attempts.invalid_signal(answer)

    async def _ask_for_repair(self, answer: Step) -> list[StopSignal]:
        assert self.output_attempts is not None
        await self._store_steps([self.output_attempts.repair_step(answer)])
        return []

    # -- tools ------------------------------------------------------------------------------

    async def _run_tool_calls(self, calls: list[ToolCall]) -> list[StopSignal]:
        """Run the server calls, store their results in call order; client calls stay open."""
        client_names = self.settings.client_tool_names()
        server_calls = [call for call in calls if call.name not in client_names]
        client_calls = [call for call in calls if call.name in client_names]
        held = held_calls(self.settings, server_calls, self.segment.decisions)
        server_calls = [call for call in server_calls if call not in held]
        signals: list[StopSignal] = []
        if server_calls:
            step_ids = {call.id: new_id("step") for call in server_calls}
            self.tool_step_ids.update(step_ids)
            # Results are stored in call order, in one append after the assistant step.
            first = self._next_sequence()
            sequences = {call.id: first + index for index, call in enumerate(server_calls)}
            for call in server_calls:
                self.channel.publish(
                    StepStarted(
                        step_id=step_ids[call.id],
                        role=Role.TOOL,
                        tool_call_id=call.id,
                        name=call.name,
                    )
                )
            with self.progress.running(step_ids):
                results = await execute_tool_calls(
                    server_calls,
                    self.services.registry,
                    offered=self.settings.tools,
                    make_context=self._tool_context,
                    timeout_s=self.settings.limits.tool_timeout_s,
                    max_parallel=self.settings.limits.max_parallel_tools,
                    completed=self.finished_results,
                    trace_call=lambda call: self._trace_tool_call(call, sequences[call.id]),
                    max_result_bytes=self.settings.limits.max_step_bytes,
                    stop_on_error=self.settings.stop_on_error_tools,
                )
            for result in results:
                if result.is_error:
                    self.channel.publish(
                        ErrorNotice("TOOL_FAILED", result.content, f"tool:{result.call.name}")
                    )
            steps = [
                self._tool_step(result, step_ids[result.call.id], sequences[result.call.id])
                for result in results
            ]
            for step in steps:  # a local agent's tokens are its caller's (engine/agent_tools.py)
                self.run_row.usage.add(step.metrics)
            await self._store_steps(steps)
            signals += [result.stop for result in results if result.stop is not None]
        if client_calls or held:
            timeout_s = self.settings.approval_timeout_s
            signals.append(waiting_signal(client_calls, held, timeout_s))
        return signals

    @contextmanager
    def _trace_tool_call(self, call: ToolCall, sequence: int) -> Iterator[ToolCallTrace]:
        with self.trace.tool_call(call, self.tool_step_ids[call.id], sequence) as span:
            self.tool_spans[call.id] = span
            if (decision := self.segment.decisions.get(call.id)) is not None:
                span.approved(decision, self.segment.approval_waits.get(call.id, 0.0))
            yield span

    def _tool_context(self, call: ToolCall) -> ToolContext:
        return ToolContext(
            self.run_row.id,
            self.run_row.session_id,
            call.id,
            call.name,
            self.run_row.tenant,
            step_id=self.tool_step_ids[call.id],
            history=tuple(self.history),
            progress=self.progress.report,
        )

    def _tool_step(self, result: ToolResult, step_id: str, sequence: int) -> Step:
        # A call that never started is recorded by the run's own span.
        span = self.tool_spans.get(result.call.id, self.trace)
        return Step(
            session_id=self.run_row.session_id,
            run_id=self.run_row.id,
            role=Role.TOOL,
            content=result.content,
            tool_call_id=result.call.id,
            name=result.call.name,
            is_error=result.is_error,
            metrics=_spent(
                StepMetrics(duration_ms=result.duration_ms, tool_exec_time_ms=result.exec_time_ms),
                result.usage,
            ),
            id=step_id,
            sequence=sequence,
            trace_id=span.trace_id,
            span_id=span.span_id,
            approval=self.segment.decisions.get(result.call.id),
        )

    # -- limits -----------------------------------------------------------------------------

    def _limits_reached(self) -> list[StopSignal]:
        """Limits that forbid another model call."""
        return self.settings.limits.reached(self.model_calls, self.run_row.usage.total_tokens)

    def _budget_reached(self) -> list[StopSignal]:
        return self.settings.limits.budget_reached(self.run_row.usage.total_tokens)

    def _start_timer(self) -> asyncio.TimerHandle:
        timeout = self.settings.limits.run_timeout_s
        signal = StopSignal(
            StopReason.TIMEOUT, f"the run exceeded its time limit of {timeout:g}s", "loop"
        )
        loop = asyncio.get_running_loop()
        deadline_at = self.segment.deadline_at
        if deadline_at is not None and deadline_at - loop.time() < timeout:
            timeout = deadline_at - loop.time()
            signal = deadline_reached()
        delay = max(0.0, timeout) if math.isfinite(timeout) else 1e9
        return loop.call_later(delay, self.control.request_stop, signal)

    def _requested_signal(self) -> StopSignal:
        return self.control.signal or task_cancelled()

    # -- storage and events -----------------------------------------------------------------

    async def _store_steps(self, steps: list[Step], announce: Announce = completed) -> list[Step]:
        """Store steps atomically, then publish them and call the after_step hooks."""
        with self.control.protected():
            stored = await self._append(steps, announce)
        for step in stored if self.services.hooks.after_step else ():
            # A copy, as the run is: the stored step is also the history later model calls
            # (and later runs, engine/history.py) are built from.
            await self._call_hooks(
                self.services.hooks.after_step, self._snapshot(), copy.deepcopy(step)
            )
        return stored

    async def _append(self, steps: list[Step], announce: Announce = completed) -> list[Step]:
        """Store the run's steps with the events `announce` makes of them (their
        `step_completed`s), then publish those."""
        stored = await self.services.log.append_steps(
            steps, held_by=self.run_row.id, journal=self.channel.journal_for(announce)
        )
        self._record_stored(stored)
        self.channel.publish_journaled()
        return stored

    def _record_stored(self, stored: list[Step]) -> None:
        run = self.run_row
        for step in stored:
            self.history.append(step)
            run.step_count += 1
            run.first_sequence = run.first_sequence or step.sequence
            run.last_sequence = max(run.last_sequence, step.sequence)
            if step.role is Role.ASSISTANT and step.tool_calls:
                self.pending_step = step
                self.pending_calls = {call.id: call for call in step.tool_calls}
                self.finished_results = {}
            elif step.role is Role.TOOL:
                self.pending_calls.pop(step.tool_call_id, None)

    def _next_sequence(self) -> int:
        return (self.history[-1].sequence if self.history else 0) + 1

    async def _call_hooks(self, hooks: list[Hook], *args: object) -> None:
        if not hooks:
            return

        def report(message: str) -> None:
            self.channel.publish(ErrorNotice("HOOK_FAILED", message, "hook"))

        await call_hooks(hooks, *args, on_failure=report)

    def _snapshot(self) -> Run:
        """A deep copy of the run for hooks, which may change what they get (events carry
        the cheaper `Run.snapshot`). Taken only when a hook is configured."""
        return copy.deepcopy(self.run_row)

    # -- the end ----------------------------------------------------------------------------

    async def _finish(self, signal: StopSignal) -> Run:
        """Close open tool calls, then end the run: its last step, its row, the session, the
        stream."""
        run = self.run_row
        try:
            if signal.reason is not StopReason.REQUIRES_ACTION and self.pending_calls:
                first_written = await self._close_pending_calls(signal)
                if signal.retryable and not signal.resume_from_sequence:
                    signal.resume_from_sequence = first_written
        except LeaseLostError:
            logger.warning("run %s: its session is no longer its own to close calls in", run.id)
        except Exception:
            logger.exception("run %s: could not store results for open tool calls", run.id)
        last = [self.last_step] if self.last_step is not None else []
        if signal.retryable and not signal.resume_from_sequence:
            signal.resume_from_sequence = self._next_sequence() + len(last)
        ended = await self.services.lifecycle.end(run, signal, self.channel, last)
        run = self.run_row = ended.run
        self.history.extend(ended.steps)
        if ended.released and self.segment.history_is_log:
            # The history is the stored log exactly: read under the session, extended only by
            # this run's own writes, the session held throughout. Kept before the terminal
            # event, so the client's next run on the session starts from it.
            self.services.histories.remember(run.session_id, self.history, tenant=run.tenant)
        self.trace.end(run)  # before the terminal event: a client that saw it sees the trace
        final = ended.publish(self.channel)
        try:
            if self.services.hooks.on_run_end:
                await call_hooks(
                    self.services.hooks.on_run_end, self._snapshot(), on_failure=lambda _: None
                )
        except StopRun:
            logger.info("run %s: StopRun from on_run_end ignored (the run had ended)", run.id)
        return final

    async def _close_pending_calls(self, signal: StopSignal) -> int:
        """Store the finished results of open calls, then an error result for each other one.

        Returns the sequence of the first error result written (0 if none).
        """
        assert self.pending_step is not None
        calls = [call for call in self.pending_step.tool_calls if call.id in self.pending_calls]
        finished = [self.finished_results[c.id] for c in calls if c.id in self.finished_results]
        why = unfinished_reason(signal)
        unfinished = [unfinished_result(c, why) for c in calls if c.id not in self.finished_results]
        first = self._next_sequence()
        stored = await self._append(
            [
                self._tool_step(
                    result, self.tool_step_ids.get(result.call.id) or new_id("step"), first + index
                )
                for index, result in enumerate(finished + unfinished)
            ]
        )
        first_error = stored[len(finished)] if unfinished else None
        return first_error.sequence if first_error is not None else 0


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _spent(metrics: StepMetrics, usage: Usage | None) -> StepMetrics:
    """A tool step's metrics with the tokens of the models its call ran (a local agent's)."""
    if usage is not None:
        metrics.input_tokens = usage.input_tokens
        metrics.output_tokens = usage.output_tokens
        metrics.total_tokens = usage.total_tokens
    return metrics
