"""Conversion between table rows and the domain dataclasses.

Pure functions, no I/O: what a Step, Run or Session looks like as a row and back. Never opens
a connection or decides what to store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import Row

from agio_grpc import json_codec
from agio_grpc.domain import (
    DEFAULT_TENANT,
    ApprovalDecision,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StepMetrics,
    StopReason,
    StopSignal,
    ToolCall,
    Usage,
    clean_text,
    copy_of,
)
from agio_grpc.store.records import JournalRecord
from agio_grpc.store.tables import steps as step_table


def aware_utc(value: datetime, name: str) -> datetime:
    """`value` in UTC; ValueError for a naive datetime, whose zone nobody can know."""
    if value.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


def stored_session(session: Session) -> Session:
    """A new session as stored: empty, with its times in UTC."""
    return copy_of(
        session,
        step_count=0,
        create_time=aware_utc(session.create_time, "create_time"),
        update_time=aware_utc(session.update_time, "update_time"),
    )


def session_from_row(row: Row[Any]) -> Session:
    return Session(
        id=row.id,
        parent_session_id=row.parent_session_id or "",
        fork_sequence=row.fork_sequence,
        create_time=row.create_time,
        update_time=row.update_time,
        step_count=row.last_sequence,
        active_run_id=row.active_run_id or "",
        tenant=row.tenant,
    )


def stored_copy(step: Step, *, sequence: int, create_time: datetime) -> Step:
    """The caller's step as stored; the caller's object is left as it was."""
    return copy_of(
        step,
        sequence=sequence,
        create_time=create_time,
        tool_calls=list(step.tool_calls),
        metrics=copy_of(step.metrics),
    )


def stored_copies(steps: Sequence[Step], first: int, create_time: datetime) -> list[Step]:
    """The caller's steps as stored at sequences `first`, `first + 1`..."""
    return [
        stored_copy(step, sequence=first + offset, create_time=create_time)
        for offset, step in enumerate(steps)
    ]


METRIC_FIELDS: Final = tuple(field.name for field in dataclasses.fields(StepMetrics))
SUMMARY_FIELDS: Final = ("summary_first_sequence", "summary_last_sequence")


def tool_calls_json(calls: Sequence[ToolCall]) -> str:
    """A step's tool calls as its row stores them (`_tool_calls` reads them back)."""
    return json_codec.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls])


def step_row(step: Step) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": step.id,
        "session_id": step.session_id,
        "run_id": step.run_id,
        "sequence": step.sequence,
        "role": step.role.value,
        # Text as both backends can store it (domain.clean_text): the engine cleans what it
        # gets from models and tools, and the service refuses U+0000 in requests; this is
        # the last line, so that no text can fail a write.
        "content": clean_text(step.content),
        "reasoning_content": clean_text(step.reasoning_content),
        "tool_calls": tool_calls_json(step.tool_calls),
        "tool_call_count": len(step.tool_calls),
        "tool_call_id": clean_text(step.tool_call_id),
        "name": clean_text(step.name),
        "is_error": step.is_error,
        "create_time": step.create_time,
        "trace_id": step.trace_id,
        "span_id": step.span_id,
        "summary_first_sequence": step.summary_first_sequence,
        "summary_last_sequence": step.summary_last_sequence,
        "approval": approval_json(step.approval),
    }
    metrics = step.metrics
    # Flat fields: `dataclasses.asdict`'s deep copy cost more than the rest of the row.
    row.update({name: getattr(metrics, name) for name in METRIC_FIELDS})
    return row


# What `steps_from_rows` reads, in the order it unpacks them; the metrics in `StepMetrics`
# field order, then a summary's range (last, so that journal records written before it
# existed still read). Not `session_id`: every reader already knows it.
STEP_READ_COLUMNS: Final = tuple(
    step_table.c[name]
    for name in (
        "id",
        "run_id",
        "sequence",
        "role",
        "content",
        "reasoning_content",
        "tool_calls",
        "tool_call_id",
        "name",
        "is_error",
        "create_time",
        "trace_id",
        "span_id",
        *METRIC_FIELDS,
        *SUMMARY_FIELDS,
        "approval",
    )
)
HISTORY_READ_COLUMNS: Final = (
    *STEP_READ_COLUMNS[:10],
    *(step_table.c[name] for name in SUMMARY_FIELDS),
)
"""The message columns: `STEP_READ_COLUMNS` up to `is_error`, and a summary's range."""
_ROLE_OF: Final = {role.value: role for role in Role}
_NO_TOOL_CALLS: Final = "[]"


def steps_from_rows(session_id: str, rows: Iterable[Sequence[Any]]) -> list[Step]:
    """Steps of `session_id` from driver rows of `STEP_READ_COLUMNS`, undecoded.

    Every full read goes through here (ListSteps, GetContext, event replays, whole sessions
    of thousands of steps), so it takes the driver's own values (no SQLAlchemy result
    processing), unpacks each row into names, builds the
    dataclasses with positional arguments (keywords cost ~40% more) and skips parsing the
    usual empty tool call list. Values come as each driver returns them: SQLite gives
    `is_error` as 0/1 and `create_time` as naive UTC text, asyncpg a bool and an aware
    datetime.
    """
    steps: list[Step] = []
    append = steps.append
    for (
        step_id,
        run_id,
        sequence,
        role,
        content,
        reasoning_content,
        tool_calls,
        tool_call_id,
        name,
        is_error,
        create_time,
        trace_id,
        span_id,
        duration_ms,
        first_token_latency_ms,
        input_tokens,
        output_tokens,
        total_tokens,
        cached_input_tokens,
        reasoning_tokens,
        model_name,
        provider,
        tool_exec_time_ms,
        retries,
        summary_first_sequence,
        summary_last_sequence,
        approval,
    ) in rows:
        # Positional in `Step` field order; tests/store round-trip every field.
        append(
            Step(
                session_id,
                run_id,
                _ROLE_OF[role],
                content,
                reasoning_content,
                [] if not tool_calls or tool_calls == _NO_TOOL_CALLS else _tool_calls(tool_calls),
                tool_call_id,
                name,
                bool(is_error),
                StepMetrics(
                    duration_ms,
                    first_token_latency_ms,
                    input_tokens,
                    output_tokens,
                    total_tokens,
                    cached_input_tokens,
                    reasoning_tokens,
                    model_name,
                    provider,
                    tool_exec_time_ms,
                    retries,
                ),
                step_id,
                sequence,
                utc_from_database(create_time),
                trace_id,
                span_id,
                summary_first_sequence,
                summary_last_sequence,
                _approval(approval) if approval else None,
            )
        )
    return steps


def approval_json(decision: ApprovalDecision | None) -> str | None:
    """A step's approval decision as its row stores it (`_approval` reads it back)."""
    if decision is None:
        return None
    time = decision.decide_time
    return json_codec.dumps(
        {
            "approved": decision.approved,
            "reason": clean_text(decision.reason),
            "decided_by": clean_text(decision.decided_by),
            "decide_time": None if time is None else time.astimezone(UTC).isoformat(),
        }
    )


def _approval(value: str) -> ApprovalDecision:
    data: dict[str, Any] = json_codec.loads(value)
    time = data.get("decide_time")
    return ApprovalDecision(
        bool(data["approved"]),
        data.get("reason", ""),
        data.get("decided_by", ""),
        datetime.fromisoformat(time) if time else None,
    )


# The metrics of every step read as history: one empty instance, not one each (building a
# StepMetrics was half the cost of turning a long session's rows into steps).
HISTORY_METRICS: Final = StepMetrics()


def history_from_rows(session_id: str, rows: Iterable[Sequence[Any]]) -> list[Step]:
    """Steps of `session_id` from driver rows of `HISTORY_READ_COLUMNS` (as `steps_from_rows`,
    for the message fields only: create_time and trace ids keep their defaults, and the
    metrics of all of them are `HISTORY_METRICS`, empty and shared)."""
    return [
        Step(
            session_id,
            run_id,
            _ROLE_OF[role],
            content,
            reasoning_content,
            [] if not tool_calls or tool_calls == _NO_TOOL_CALLS else _tool_calls(tool_calls),
            tool_call_id,
            name,
            bool(is_error),
            HISTORY_METRICS,
            step_id,
            sequence,
            None,
            "",
            "",
            summary_first_sequence,
            summary_last_sequence,
        )
        # Positional in `Step` field order (keywords cost ~40% more); tests/store compare
        # every field with what get_steps reads.
        for (
            step_id,
            run_id,
            sequence,
            role,
            content,
            reasoning_content,
            tool_calls,
            tool_call_id,
            name,
            is_error,
            summary_first_sequence,
            summary_last_sequence,
        ) in rows
    ]


def _tool_calls_of(calls: list[dict[str, str]]) -> list[ToolCall]:
    return [ToolCall(call["id"], call["name"], call["arguments"]) for call in calls]


# A stored tool call list read straight into ToolCalls: 0.9 µs for one call, against 3.2
# for parsing it and making the ToolCall in Python.
_tool_calls: Final = json_codec.decoder_of(list[ToolCall], _tool_calls_of)


def utc_from_database(value: datetime | str) -> datetime:
    """An aware UTC datetime from a `UTCDateTime` column's driver value (what the column type
    does when SQLAlchemy decodes it, at a fraction of the cost).

    SQLite returns the naive UTC text SQLAlchemy wrote (`YYYY-MM-DD HH:MM:SS.ffffff`);
    PostgreSQL an aware datetime.
    """
    if isinstance(value, str):
        # Appending the offset is several times cheaper than `.replace(tzinfo=UTC)`.
        return datetime.fromisoformat(value + "+00:00")
    if value.tzinfo is UTC:
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def stored_run(run: Run) -> Run:
    """The run as it will read back: a copy with UTC times and JSON-normalised dicts."""
    stored = copy_of(
        run,
        usage=copy_of(run.usage),
        metadata=dict(run.metadata),
        options=json_codec.loads(_json(run.options)),
        stop_signal=stop_signal_from_json(stop_signal_json(run.stop_signal)),
        create_time=aware_utc(run.create_time, "create_time"),
    )
    if stored.end_time is not None:
        stored.end_time = aware_utc(stored.end_time, "end_time")
    return stored


RUN_MUTABLE_COLUMNS: Final = (
    "status",
    "stop_signal",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "step_count",
    "tool_call_count",
    "first_sequence",
    "last_sequence",
    "end_time",
    "trace_id",
    "metadata",
    "options",
    "last_event_seq",
    "output_json",
    "approval_deadline",
)


def run_mutable_values(run: Run) -> dict[str, Any]:
    """The columns a run's transitions overwrite (and its insert sets)."""
    return {
        "status": run.status.value,
        "stop_signal": stop_signal_json(run.stop_signal),
        "input_tokens": run.usage.input_tokens,
        "output_tokens": run.usage.output_tokens,
        "total_tokens": run.usage.total_tokens,
        "step_count": run.step_count,
        "tool_call_count": run.tool_call_count,
        "first_sequence": run.first_sequence,
        "last_sequence": run.last_sequence,
        "end_time": run.end_time,
        "trace_id": run.trace_id,
        "metadata": json_codec.dumps(run.metadata),
        "options": _json(run.options),
        "last_event_seq": run.last_event_seq,
        "output_json": run.output_json,
        "approval_deadline": approval_deadline_of(run),
    }


def approval_deadline_of(run: Run) -> datetime | None:
    """When the server rejects the calls a waiting run holds for approval: the deadline its
    stop signal names (engine/approvals.py), kept in a column of its own so that a sweep
    finds the runs past it by index; None for any run not waiting for a decision."""
    signal = run.stop_signal
    if run.status is not RunStatus.REQUIRES_ACTION or signal is None:
        return None
    text = signal.context.get("approval_deadline")
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def run_from_row(row: Row[Any]) -> Run:
    return Run(
        id=row.id,
        session_id=row.session_id,
        agent=row.agent,
        status=RunStatus(row.status),
        stop_signal=stop_signal_from_json(row.stop_signal),
        usage=Usage(
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            total_tokens=row.total_tokens,
        ),
        step_count=row.step_count,
        tool_call_count=row.tool_call_count,
        first_sequence=row.first_sequence,
        last_sequence=row.last_sequence,
        create_time=row.create_time,
        end_time=row.end_time,
        trace_id=row.trace_id,
        request_id=row.request_id,
        metadata=json_codec.loads(row._mapping["metadata"]),
        options=json_codec.loads(row.options),
        last_event_seq=row.last_event_seq,
        input=row.input,
        queue_position=row.queue_position,
        supersedes=row.supersedes,
        rollback_from=row.rollback_from,
        tenant=row.tenant,
        caller_instance=row.caller_instance,
        caller_deadline=row.caller_deadline,
        output_json=row.output_json,
    )


def _json(value: Any) -> str:
    # default=str: a run is recorded on every exit path, so an odd value in its options or
    # stop-signal context is stored as text rather than failing the write.
    return json_codec.dumps(value, default=str)


def stop_signal_json(signal: StopSignal | None) -> str | None:
    if signal is None:
        return None
    return _json(_stop_signal_data(signal))


def _stop_signal_data(signal: StopSignal) -> dict[str, Any]:
    return {
        "reason": signal.reason.value,
        "message": signal.message,
        "source": signal.source,
        "context": signal.context,
        "retryable": signal.retryable,
        "resume_from_sequence": signal.resume_from_sequence,
    }


def stop_signal_from_json(value: str | None) -> StopSignal | None:
    if value is None:
        return None
    return _stop_signal_from_data(json_codec.loads(value))


def _stop_signal_from_data(data: Mapping[str, Any] | None) -> StopSignal | None:
    if data is None:
        return None
    return StopSignal(
        reason=StopReason(data["reason"]),
        message=data.get("message", ""),
        source=data.get("source", "loop"),
        context=dict(data.get("context", {})),
        retryable=bool(data.get("retryable", False)),
        resume_from_sequence=int(data.get("resume_from_sequence", 0)),
    )


# -- the run event journal ------------------------------------------------------------------
#
# A journal payload is JSON: `[run, step, data]`, the run and the step each a positional array
# (or null). Positional rather than keyed: a run's start writes two payloads inside its
# transaction, on the path to its first event, and arrays of plain values cost about half
# of what keyed objects do to build and encode (bench/journal.py measures the journal's cost
# per run).


def _time_json(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _time_from_json(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def run_json(run: Run) -> list[Any]:
    """Every field of a run but a queued run's bookkeeping (its input and place), which an
    event does not show, in `Run` field order; then its tenant (revision 0006: records
    written before it have none, and belong to the default tenant) and its output (revision
    0011: records written before it have none)."""
    usage, signal = run.usage, run.stop_signal
    return [
        run.session_id,
        run.agent,
        run.id,
        run.status.value,
        None if signal is None else _stop_signal_data(signal),
        usage.input_tokens,
        usage.output_tokens,
        usage.total_tokens,
        run.step_count,
        run.tool_call_count,
        run.first_sequence,
        run.last_sequence,
        _time_json(run.create_time),
        _time_json(run.end_time),
        run.trace_id,
        run.request_id,
        run.metadata,
        run.options,
        run.last_event_seq,
        run.tenant,
        run.output_json,
    ]


def run_from_json(data: Sequence[Any]) -> Run:
    (
        session_id,
        agent,
        run_id,
        status,
        signal,
        input_tokens,
        output_tokens,
        total_tokens,
        step_count,
        tool_call_count,
        first_sequence,
        last_sequence,
        create_time,
        end_time,
        trace_id,
        request_id,
        metadata,
        options,
        last_event_seq,
    ) = data[:19]
    created = _time_from_json(create_time)
    assert created is not None
    return Run(
        session_id,
        agent,
        run_id,
        RunStatus(status),
        _stop_signal_from_data(signal),
        Usage(input_tokens, output_tokens, total_tokens),
        step_count,
        tool_call_count,
        first_sequence,
        last_sequence,
        created,
        _time_from_json(end_time),
        trace_id,
        request_id,
        dict(metadata),
        dict(options),
        last_event_seq,
        tenant=data[19] if len(data) > 19 else DEFAULT_TENANT,
        output_json=data[20] if len(data) > 20 else "",
    )


def step_json(step: Step) -> list[Any]:
    """Every field of a step: its session, then a row as `steps_from_rows` reads it (the tool
    calls and the create time as the store writes them)."""
    assert step.create_time is not None, "the journal has stored steps only"
    metrics = step.metrics
    return [
        step.session_id,
        step.id,
        step.run_id,
        step.sequence,
        step.role.value,
        step.content,
        step.reasoning_content,
        tool_calls_json(step.tool_calls),
        step.tool_call_id,
        step.name,
        step.is_error,
        step.create_time.astimezone(UTC).replace(tzinfo=None).isoformat(" "),
        step.trace_id,
        step.span_id,
        *[getattr(metrics, name) for name in METRIC_FIELDS],
        step.summary_first_sequence,
        step.summary_last_sequence,
        approval_json(step.approval),
    ]


_STEP_JSON_LENGTH: Final = 1 + len(STEP_READ_COLUMNS)


def step_from_json(data: Sequence[Any]) -> Step:
    # Records journaled before summary steps existed end before their range: 0, 0 (and
    # before approvals, without one: 0, read as none).
    row = [*data[1:], *[0] * (_STEP_JSON_LENGTH - len(data))]
    (step,) = steps_from_rows(data[0], [row])
    return step


def journal_row(run_id: str, record: JournalRecord) -> dict[str, Any]:
    """The `run_events` row of one journal record."""
    run, step = record.run, record.step
    payload = [
        None if run is None else run_json(run),
        None if step is None else step_json(step),
        dict(record.data),
    ]
    return {
        "run_id": run_id,
        "seq": record.seq,
        "time": record.time,
        "kind": record.kind,
        "payload": json_codec.dumps(payload, str),  # odd values as text, as in `_json`
    }


def journal_from_row(seq: int, time: datetime | str, kind: str, payload: str) -> JournalRecord:
    run, step, data = json_codec.loads(payload)
    return JournalRecord(
        seq=int(seq),
        time=utc_from_database(time),
        kind=kind,
        run=run_from_json(run) if run is not None else None,
        step=step_from_json(step) if step is not None else None,
        data=data,
    )
