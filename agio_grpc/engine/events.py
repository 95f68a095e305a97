"""The events a run emits, in the order a client sees them.

One dataclass per kind, each with a `type` discriminator matching the `StepEvent` oneof
field it becomes (`run_started`, `step_delta`, ...). `SequencedEvent` wraps an event with
its run, session and gapless `seq`. The service layer converts these to protobuf; this
module never imports grpc or protobuf, and events are never mutated once published.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from agio_grpc.domain import Role, Run, Step


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The run started: its user step (if any) is stored."""

    run: Run
    type: Literal["run_started"] = "run_started"


@dataclass(frozen=True, slots=True)
class StepStarted:
    """A model or tool step started; its deltas and its `StepCompleted` follow.

    `sequence` is 0: a step's sequence is allocated when it is stored. Join deltas to their
    stored step by `step_id`.
    """

    step_id: str
    role: Role
    sequence: int = 0
    tool_call_id: str = ""
    name: str = ""
    type: Literal["step_started"] = "step_started"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call; fragments with the same `index` join in order.

    `index` is the call's position in the step's `tool_calls` (assigned by the engine, so it
    stays right even for providers that reuse index 0 for every call).
    """

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class StepDelta:
    """Streamed fragments of the step in progress (consecutive ones may be coalesced)."""

    step_id: str
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    sequence: int = 0
    type: Literal["step_delta"] = "step_delta"

    def merged(self, later: StepDelta) -> StepDelta:
        """This delta followed by `later` (same step) as one delta."""
        if not self.tool_calls and not later.tool_calls:  # text only: every burst's deltas
            return StepDelta(
                self.step_id,
                self.content + later.content,
                self.reasoning_content + later.reasoning_content,
                (),
                self.sequence,
            )
        calls = {call.index: call for call in self.tool_calls}
        for call in later.tool_calls:
            before = calls.get(call.index)
            calls[call.index] = (
                call
                if before is None
                else ToolCallDelta(
                    index=call.index,
                    id=before.id or call.id,
                    name=before.name or call.name,
                    arguments=before.arguments + call.arguments,
                )
            )
        return StepDelta(
            step_id=self.step_id,
            content=self.content + later.content,
            reasoning_content=self.reasoning_content + later.reasoning_content,
            tool_calls=tuple(calls[index] for index in sorted(calls)),
            sequence=self.sequence,
        )


@dataclass(frozen=True, slots=True)
class StepCompleted:
    """A step, published only after it is durably stored."""

    step: Step
    type: Literal["step_completed"] = "step_completed"


@dataclass(frozen=True, slots=True)
class RunCompleted:
    """The run (segment) ended without error; `run.stop_signal` says why."""

    run: Run
    type: Literal["run_completed"] = "run_completed"


@dataclass(frozen=True, slots=True)
class RunFailed:
    """The run ended with an error reason (model, tool-fatal, internal)."""

    run: Run
    type: Literal["run_failed"] = "run_failed"


@dataclass(frozen=True, slots=True)
class ErrorNotice:
    """A non-fatal problem while the run goes on.

    Reasons used by the engine: `MODEL_RETRY` (a model call is retried before anything
    streamed), `MODEL_STREAM_RESTART` (a stream broke after deltas: discard the step's deltas
    so far, the step restarts), `TOOL_FAILED` (a tool error the model will see),
    `HOOK_FAILED` (a hook raised; the run goes on).
    """

    reason: str
    message: str
    source: str
    retryable: bool = False
    type: Literal["error"] = "error"


@dataclass(frozen=True, slots=True)
class ContextCompacted:
    """Older steps were summarized (engine/compaction.py): the summary step `step_id`, stored
    at `sequence`, stands for `first_sequence`..`last_sequence` in the context from now on.
    `trigger` is `threshold`, `overflow` or `request`; the token counts are estimates."""

    step_id: str
    sequence: int
    first_sequence: int
    last_sequence: int
    tokens_before: int
    tokens_after: int
    trigger: str
    type: Literal["context_compacted"] = "context_compacted"


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """A server tool call in progress said how it goes (`ToolContext.report_progress`):
    between its tool step's `StepStarted` and `StepCompleted`. Live only, as deltas are (never
    journaled), and adds nothing to the stored step. `state` is as the source names it; the
    ids are the child run of a local agent tool, or the task of a remote A2A agent."""

    step_id: str
    tool_call_id: str
    name: str
    message: str = ""
    state: str = ""
    child_run_id: str = ""
    child_session_id: str = ""
    remote_task_id: str = ""
    remote_context_id: str = ""
    type: Literal["tool_progress"] = "tool_progress"


LIVE_ONLY = (StepDelta, ToolProgress)
"""The event kinds a replay never needs: served live, never journaled."""


Event = (
    RunStarted
    | StepStarted
    | StepDelta
    | StepCompleted
    | RunCompleted
    | RunFailed
    | ErrorNotice
    | ContextCompacted
    | ToolProgress
)
"""Every kind of run event."""


def terminal_event(run: Run) -> RunCompleted | RunFailed:
    """The event that ends the run's stream: `run_failed` for an error reason, else
    `run_completed`."""
    failed = run.stop_signal is not None and run.stop_signal.reason.is_error
    return RunFailed(run) if failed else RunCompleted(run)


@dataclass(frozen=True, slots=True)
class SequencedEvent:
    """An event as streamed: with its run, session, per-run gapless `seq` and time."""

    run_id: str
    session_id: str
    seq: int
    time: datetime
    event: Event

    @property
    def is_terminal(self) -> bool:
        """Whether this event ends the run's stream (`run_completed` or `run_failed`)."""
        return isinstance(self.event, RunCompleted | RunFailed)
