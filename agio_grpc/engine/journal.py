"""The run event journal: events as the store keeps them, and back.

A replay must give a client exactly what the live stream gave it, under the same seqs, after
a restart or on another server. So every event a replay needs is stored with its live seq
in the same transaction as the change it announces (`RunChannel.journal_for`):
`run_started` and the first `step_completed`s with the run's start, each `step_completed`
with its step, the terminal event with the run's end. `step_started` and `error` events
change nothing in the store: they are journaled with the next write, the step they
announce. Deltas and tool progress are not journaled; a finished step's `step_completed`
carries its whole content, and the deltas and progress of the steps in progress are served
live by the channel.

This module only converts; it never reads or writes the store.
"""

from __future__ import annotations

from agio_grpc.domain import Role
from agio_grpc.engine.events import (
    LIVE_ONLY,
    ContextCompacted,
    ErrorNotice,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    SequencedEvent,
    StepCompleted,
    StepDelta,
    StepStarted,
    ToolProgress,
)
from agio_grpc.store.records import JournalRecord


def is_journaled(event: Event) -> bool:
    """Whether a replay needs `event` (every kind but deltas and tool progress)."""
    return not isinstance(event, LIVE_ONLY)


def record_of(sequenced: SequencedEvent) -> JournalRecord:
    """The journal record of a published (or about to be published) event."""
    event = sequenced.event
    seq, time = sequenced.seq, sequenced.time
    match event:
        case RunStarted() | RunCompleted() | RunFailed():
            return JournalRecord(seq, time, event.type, run=event.run)
        case StepCompleted():
            return JournalRecord(seq, time, event.type, step=event.step)
        case StepStarted():
            data = {
                "step_id": event.step_id,
                "role": event.role.value,
                "sequence": event.sequence,
                "tool_call_id": event.tool_call_id,
                "name": event.name,
            }
            return JournalRecord(seq, time, event.type, data=data)
        case ErrorNotice():
            data = {
                "reason": event.reason,
                "message": event.message,
                "source": event.source,
                "retryable": event.retryable,
            }
            return JournalRecord(seq, time, event.type, data=data)
        case ContextCompacted():
            data = {
                "step_id": event.step_id,
                "sequence": event.sequence,
                "first_sequence": event.first_sequence,
                "last_sequence": event.last_sequence,
                "tokens_before": event.tokens_before,
                "tokens_after": event.tokens_after,
                "trigger": event.trigger,
            }
            return JournalRecord(seq, time, event.type, data=data)
        case StepDelta() | ToolProgress():
            raise ValueError(f"{event.type} events are not journaled")


def event_of(run_id: str, session_id: str, record: JournalRecord) -> SequencedEvent:
    """The event a journal record stores, as it was streamed."""
    return SequencedEvent(run_id, session_id, record.seq, record.time, _event(record))


def _event(record: JournalRecord) -> Event:
    data = record.data
    match record.kind:
        case "run_started" if record.run is not None:
            return RunStarted(record.run)
        case "run_completed" if record.run is not None:
            return RunCompleted(record.run)
        case "run_failed" if record.run is not None:
            return RunFailed(record.run)
        case "step_completed" if record.step is not None:
            return StepCompleted(record.step)
        case "step_started":
            return StepStarted(
                step_id=str(data["step_id"]),
                role=Role(data["role"]),
                sequence=int(data.get("sequence", 0)),
                tool_call_id=str(data.get("tool_call_id", "")),
                name=str(data.get("name", "")),
            )
        case "error":
            return ErrorNotice(
                str(data["reason"]),
                str(data["message"]),
                str(data["source"]),
                retryable=bool(data.get("retryable", False)),
            )
        case "context_compacted":
            return ContextCompacted(
                step_id=str(data["step_id"]),
                sequence=int(data["sequence"]),
                first_sequence=int(data["first_sequence"]),
                last_sequence=int(data["last_sequence"]),
                tokens_before=int(data["tokens_before"]),
                tokens_after=int(data["tokens_after"]),
                trigger=str(data["trigger"]),
            )
    raise ValueError(f"journal record {record.seq} of kind {record.kind!r} is not an event")
