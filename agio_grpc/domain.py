"""The domain model shared by every layer: steps, runs, sessions and stop signals.

Plain dataclasses and enums. This module never imports grpc, protobuf, SQLAlchemy or
OpenTelemetry: the engine and the store speak these types, and the service layer converts
them to and from the `agio.v1` contract.
"""

from __future__ import annotations

import copy
import enum
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Final, TypeVar

T = TypeVar("T")


def new_id(prefix: str) -> str:
    """A fresh opaque id such as `step_3f2a...`; the prefix tells a reader what it names."""
    return f"{prefix}_{uuid.uuid4().hex}"


def utc_now() -> datetime:
    return datetime.now(UTC)


_FIELD_VALUES: dict[type[Any], Callable[[Any], tuple[Any, ...]]] = {}


def copy_of(value: T, **changes: Any) -> T:
    """`dataclasses.replace(value, **changes)` for the mutable dataclasses here, at about a
    third of its cost: every field of theirs is an init field, so a copy is their class called
    with the values in field order, then `changes` set on it. A run is copied several times a
    run (each event's snapshot, each write's stored copy), and `replace` checks each field's
    kind every time."""
    cls: type[Any] = type(value)
    values = _FIELD_VALUES.get(cls)
    if values is None:
        of_class = fields(cls)
        # Two fields at least: `attrgetter` of one name gives the value, not a tuple.
        if len(of_class) < 2 or not all(each.init for each in of_class):
            raise TypeError(
                f"copy_of needs a dataclass of two or more fields, init fields only: {cls!r}"
            )
        values = _FIELD_VALUES[cls] = attrgetter(*(each.name for each in of_class))
    duplicate: T = cls(*values(value))
    for name, new in changes.items():
        setattr(duplicate, name, new)
    return duplicate


DEFAULT_TENANT = "default"
"""The tenant of every caller when the server authenticates no one (`auth.mode: none`), and
of the rows made before tenants existed."""

MAX_TENANT_CHARS = 256


def is_tenant_name(value: str) -> bool:
    """Whether `value` can name a tenant: 1 to 256 printable characters, no space at either
    end (an API key's `--tenant`, a JWT's tenant claim, a client certificate's name)."""
    return 0 < len(value) <= MAX_TENANT_CHARS and value.isprintable() and value == value.strip()


class Role(enum.StrEnum):
    """The chat role of a step; the value is the OpenAI message role."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SUMMARY = "summary"
    """Compaction's summary of earlier steps (`Step.summary_first_sequence`..
    `summary_last_sequence`), sent to the model as a user message."""


class StopReason(enum.StrEnum):
    """Why a run stopped. Declared highest priority first (DESIGN.md section 2)."""

    INTERNAL_ERROR = "INTERNAL_ERROR"
    INTERRUPTED = "INTERRUPTED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    MODEL_ERROR = "MODEL_ERROR"
    TOOL_ERROR = "TOOL_ERROR"
    OUTPUT_INVALID = "OUTPUT_INVALID"
    """The final answer stayed invalid against the run's output schema (engine/output.py):
    below the failures of the service, the model and the tools, above every limit, since a
    run that stopped for a limit with an invalid answer has still no output to give."""
    CONTENT_FILTER = "CONTENT_FILTER"
    CONTEXT_WINDOW = "CONTEXT_WINDOW"
    TOKEN_BUDGET = "TOKEN_BUDGET"
    MAX_TOKENS = "MAX_TOKENS"
    TOOL_STOP = "TOOL_STOP"
    REQUIRES_ACTION = "REQUIRES_ACTION"
    MAX_STEPS = "MAX_STEPS"
    COMPLETED = "COMPLETED"

    @property
    def priority(self) -> int:
        """Lower is stronger: the declaration index."""
        return _STOP_PRIORITY[self]

    @property
    def is_error(self) -> bool:
        """Whether a run stopped for this reason ends with `run_failed` (and status FAILED)."""
        return self in _ERROR_REASONS


_STOP_PRIORITY = {reason: index for index, reason in enumerate(StopReason)}
_ERROR_REASONS = frozenset(
    {
        StopReason.INTERNAL_ERROR,
        StopReason.MODEL_ERROR,
        StopReason.TOOL_ERROR,
        StopReason.OUTPUT_INVALID,
    }
)


class RunStatus(enum.StrEnum):
    """The lifecycle state of a run."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    REQUIRES_ACTION = "REQUIRES_ACTION"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"

    @property
    def is_terminal(self) -> bool:
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.REQUIRES_ACTION)


class BusyPolicy(enum.StrEnum):
    """What a new run does when its session has a RUNNING, QUEUED or REQUIRES_ACTION run."""

    REJECT = "REJECT"
    """Refused: SessionBusyError, or RunRequiresActionError for a run waiting for its client."""
    ENQUEUE = "ENQUEUE"
    """Stored QUEUED; started when the session frees, first in first out."""
    INTERRUPT = "INTERRUPT"
    """The current run is cancelled (superseded); the new one starts next, ahead of the queue."""
    ROLLBACK = "ROLLBACK"
    """As INTERRUPT, then the interrupted run's steps are deleted before the new one starts."""


SUMMARY_PREFIX: Final = "[Summary of the earlier conversation]\n"
"""What a summary step's message starts with, so the model reads it as one."""

_ROLE_VALUES: Final[dict[Role, str]] = {role: role.value for role in Role}
# The roles `Step.to_message` tells apart, as module names: a member read off the enum class
# takes ~150 ns here, a module name ~20, and a message is made for every step of a context.
_TOOL: Final = Role.TOOL
_ASSISTANT: Final = Role.ASSISTANT
_SUMMARY: Final = Role.SUMMARY


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call requested by the model; `arguments` is JSON text, maybe invalid."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class StepMetrics:
    """Measurements of one step (DESIGN.md section 2, `StepMetrics`)."""

    duration_ms: int = 0
    first_token_latency_ms: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    model_name: str = ""
    provider: str = ""
    tool_exec_time_ms: int = 0
    retries: int = 0


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """Who decided a call that waited for approval, how and when (engine/approvals.py)."""

    approved: bool
    reason: str = ""
    decided_by: str = ""
    """The deciding credential's id; `server` for a timeout."""
    decide_time: datetime | None = None


@dataclass(slots=True)
class Step:
    """One chat message of a session plus metadata and metrics.

    `sequence` is 0 until the store allocates it; `create_time` is set by the store.
    """

    session_id: str
    run_id: str
    role: Role
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    is_error: bool = False
    metrics: StepMetrics = field(default_factory=StepMetrics)
    id: str = field(default_factory=lambda: new_id("step"))
    sequence: int = 0
    create_time: datetime | None = None
    trace_id: str = ""
    span_id: str = ""
    summary_first_sequence: int = 0
    """For a summary step: the first sequence it summarizes (0 on other steps)."""
    summary_last_sequence: int = 0
    """For a summary step: the last sequence it summarizes; its context goes on after it."""
    approval: ApprovalDecision | None = None
    """For a tool step of a call that waited for approval: the decision."""

    def to_message(self) -> dict[str, Any]:
        """The OpenAI chat message this step is, with no other conversion (a summary is a
        user message saying what it is)."""
        # Made for every step of a session before every model call: one dict literal per
        # role, and the other roles' value from a dict rather than the (slower) enum
        # `value` property.
        role = self.role
        if role is _TOOL:
            return {"role": "tool", "content": self.content, "tool_call_id": self.tool_call_id}
        if role is _ASSISTANT:
            if not self.tool_calls:
                return {"role": "assistant", "content": self.content}
            return {
                "role": "assistant",
                "content": self.content or None,
                "tool_calls": [call.to_openai() for call in self.tool_calls],
            }
        if role is _SUMMARY:
            return {"role": "user", "content": SUMMARY_PREFIX + self.content}
        return {"role": _ROLE_VALUES[role], "content": self.content}


@dataclass(slots=True)
class StopSignal:
    """Why a run stopped, who stopped it, and whether a retry may succeed."""

    reason: StopReason
    message: str = ""
    source: str = "loop"
    context: dict[str, Any] = field(default_factory=dict)
    retryable: bool = False
    resume_from_sequence: int = 0

    def copied(self) -> StopSignal:
        """A copy that shares nothing mutable. Most signals have no context, and a deep
        copy's machinery costs several times a shallow copy; so only a context is deep-copied."""
        return copy_of(self, context=copy.deepcopy(self.context) if self.context else {})


def pick_stop_signal(signals: Iterable[StopSignal]) -> StopSignal | None:
    """The strongest signal by `StopReason` priority; ties keep the first raised."""
    best: StopSignal | None = None
    for signal in signals:
        if best is None or signal.reason.priority < best.reason.priority:
            best = signal
    return best


_COMPLETED_REASONS: Final = frozenset(
    {
        StopReason.COMPLETED,
        StopReason.MAX_STEPS,
        StopReason.MAX_TOKENS,
        StopReason.CONTENT_FILTER,
        StopReason.CONTEXT_WINDOW,
        StopReason.TOKEN_BUDGET,
        StopReason.TOOL_STOP,
    }
)


def status_for(reason: StopReason) -> RunStatus:
    """The status a run stopped for `reason` is left in:
    - COMPLETED, MAX_STEPS, MAX_TOKENS, CONTENT_FILTER, CONTEXT_WINDOW, TOKEN_BUDGET,
      TOOL_STOP -> COMPLETED (a limit ends a run completed; its reason says which);
    - REQUIRES_ACTION -> REQUIRES_ACTION (the pending client calls stay open);
    - CANCELLED and TIMEOUT -> CANCELLED (cut off, not finished: the signal says which);
    - INTERRUPTED -> INTERRUPTED;
    - MODEL_ERROR, TOOL_ERROR, OUTPUT_INVALID, INTERNAL_ERROR -> FAILED.
    """
    if reason.is_error:
        return RunStatus.FAILED
    if reason in _COMPLETED_REASONS:
        return RunStatus.COMPLETED
    if reason is StopReason.REQUIRES_ACTION:
        return RunStatus.REQUIRES_ACTION
    if reason is StopReason.INTERRUPTED:
        return RunStatus.INTERRUPTED
    return RunStatus.CANCELLED


LEASE_EXPIRED_MESSAGE = "the server running this run stopped (its lease expired)"
"""Why a run whose server stopped renewing its session's lease ended (a take-over)."""
ABANDONED_MESSAGE = "the server running this run stopped before it stored the run's end"
"""Why a run whose server let go of its session without storing its end ended."""
RESTARTED_MESSAGE = "the server running this run restarted before the run ended"
"""Why a run ended that its own server, restarted under the same instance id, found left
RUNNING."""


def abandoned_run_signal(message: str, resume_from_sequence: int) -> StopSignal:
    """The stop of a run whose server is gone (its lease expired, or it let go of the
    session without storing the run's end): INTERRUPTED, retryable from the step after the
    last one stored, which is complete (steps are stored whole)."""
    return StopSignal(
        StopReason.INTERRUPTED,
        message,
        "server",
        retryable=True,
        resume_from_sequence=resume_from_sequence,
    )


def unfinished_reason(signal: StopSignal) -> str:
    """Why a tool call got no result, for the synthetic error result a stop stores."""
    detail = f" ({signal.message})" if signal.message else ""
    match signal.reason:
        case StopReason.CANCELLED:
            return f"the run was cancelled{detail}"
        case StopReason.TIMEOUT:
            return f"the run timed out{detail}"
        case StopReason.INTERRUPTED:
            return f"the run was interrupted{detail}"
        case StopReason.MAX_TOKENS | StopReason.CONTENT_FILTER:
            return f"the call was not run: the model's reply was cut off{detail}"
        case _:
            return f"the call was not run: the run stopped with {signal.reason.value}{detail}"


def unanswered_call_result(session_id: str, run_id: str, call: ToolCall, why: str) -> Step:
    """The error result a stop stores for a tool call that never returned, so the log
    stays valid history (every call answered)."""
    return Step(
        session_id,
        run_id,
        Role.TOOL,
        content=f"Error: tool {call.name!r} did not return a result: {why}",
        tool_call_id=call.id,
        name=call.name,
        is_error=True,
    )


REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """`text` as every backend stores it: each U+0000 (which PostgreSQL's text cannot hold)
    and lone surrogate (JSON `"\\ud800"`: not UTF-8) replaced by U+FFFD.

    Returns `text` itself when there is nothing to replace, the usual case, checked without
    copying ASCII text.
    """
    if text.isascii():  # O(1): a flag of the string
        return text.replace("\x00", REPLACEMENT) if "\x00" in text else text
    if "\x00" not in text:
        try:
            text.encode()
        except UnicodeEncodeError:  # a surrogate (a pair from JSON is one character)
            pass
        else:
            return text
    return _UNSAFE_CHARACTERS.sub(REPLACEMENT, text)


_UNSAFE_CHARACTERS: Final = re.compile("[\x00\ud800-\udfff]")


MAX_COUNT = 2**63 - 1
"""The largest count or sequence the store keeps (64-bit columns on every backend)."""


@dataclass(slots=True)
class Usage:
    """Token counts of a run."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def add(self, metrics: StepMetrics | Usage) -> None:
        """Add a step's (or another run's) counts, saturating at the store's 64-bit maximum."""
        self.input_tokens = min(self.input_tokens + metrics.input_tokens, MAX_COUNT)
        self.output_tokens = min(self.output_tokens + metrics.output_tokens, MAX_COUNT)
        self.total_tokens = min(self.total_tokens + metrics.total_tokens, MAX_COUNT)


@dataclass(slots=True)
class Run:
    """One invocation of the agent loop on a session."""

    session_id: str
    agent: str
    id: str = field(default_factory=lambda: new_id("run"))
    status: RunStatus = RunStatus.RUNNING
    stop_signal: StopSignal | None = None
    usage: Usage = field(default_factory=Usage)
    step_count: int = 0
    tool_call_count: int = 0
    first_sequence: int = 0
    last_sequence: int = 0
    create_time: datetime = field(default_factory=utc_now)
    end_time: datetime | None = None
    trace_id: str = ""
    request_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    # The run's effective settings (overrides, client tools) as JSON-ready data, so a
    # continuation (SubmitToolOutputs, possibly on another replica) runs with the same ones.
    options: dict[str, Any] = field(default_factory=dict)
    # The last StepEvent seq the run emitted: a continuation keeps counting from here.
    last_event_seq: int = 0
    # A QUEUED run's user input, stored as its first step when it starts.
    input: str = ""
    # A QUEUED run's place in its session's queue (lowest first).
    queue_position: int = 0
    # A QUEUED run that interrupts another (BUSY_POLICY_INTERRUPT, ROLLBACK): that run; for
    # a ROLLBACK, its first sequence, from which its steps are deleted when this one starts.
    supersedes: str = ""
    rollback_from: int = 0
    # Its session's tenant: a lookup by run id filters by it (store/log.py).
    tenant: str = DEFAULT_TENANT
    # A QUEUED run whose caller's stream owns it (its end cancels the run): the server
    # instance holding that stream, and the caller's deadline. Gone with the server, the
    # stream cannot end the run; these let whoever comes next end it as the caller would.
    caller_instance: str = ""
    caller_deadline: datetime | None = None
    # A run with an output schema that completed: its valid final answer as compact JSON
    # text ("" while there is none; JSON `null` is the text "null").
    output_json: str = ""

    def ended(self, signal: StopSignal, at: datetime | None = None) -> Run:
        """This run stopped by `signal`: a copy with the status the signal's reason leaves it
        in (`status_for`), the signal, and an end time unless it only waits
        (REQUIRES_ACTION). The only way a run's status changes, with `resumed` and
        `queued`."""
        status = status_for(signal.reason)
        end_time = (at or utc_now()) if status.is_terminal else None
        return copy_of(self, status=status, stop_signal=signal, end_time=end_time)

    def resumed(self) -> Run:
        """This run going on after it waited (for its client's tool outputs, or in its
        session's queue): RUNNING, no stop signal."""
        return copy_of(self, status=RunStatus.RUNNING, stop_signal=None, end_time=None)

    def queued(self) -> Run:
        """This run waiting in its session's queue: QUEUED."""
        return copy_of(self, status=RunStatus.QUEUED, stop_signal=None, end_time=None)

    def with_steps(self, stored: Sequence[Step]) -> Run:
        """A copy counting `stored`, its steps just stored (in sequence order)."""
        if not stored:
            return self
        return copy_of(
            self,
            step_count=self.step_count + len(stored),
            first_sequence=self.first_sequence or stored[0].sequence,
            last_sequence=stored[-1].sequence,
        )

    def snapshot(self) -> Run:
        """A copy for an event, cheaper than a deep copy: what the loop goes on changing
        (status, counts, usage, stop signal, times) is copied, while `options`, set once when
        the run starts and only read after, is shared."""
        return copy_of(
            self,
            usage=copy_of(self.usage),
            stop_signal=None if self.stop_signal is None else self.stop_signal.copied(),
            metadata=dict(self.metadata),
        )


@dataclass(slots=True)
class Session:
    """A conversation: an ordered log of steps."""

    id: str = field(default_factory=lambda: new_id("sess"))
    parent_session_id: str = ""
    fork_sequence: int = 0
    create_time: datetime = field(default_factory=utc_now)
    update_time: datetime = field(default_factory=utc_now)
    step_count: int = 0
    active_run_id: str = ""
    tenant: str = DEFAULT_TENANT
    """Whose it is: the caller's when it was made (a fork: its parent's). Only that
    tenant's callers see it; to anyone else it answers as a missing session."""


@dataclass(slots=True)
class ContextSummary:
    """Counts over a session's steps."""

    total_steps: int = 0
    user_steps: int = 0
    assistant_steps: int = 0
    tool_steps: int = 0
    tool_calls: int = 0
    min_sequence: int = 0
    max_sequence: int = 0
    total_tokens: int = 0
