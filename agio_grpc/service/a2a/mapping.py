"""The `agio.v1` contract as A2A sees it: a run is a task, its session the task's context.

Everything here translates `agio.v1` messages (a `Run`, its `Step`s, its `StepEvent`s) into
`lf.a2a.v1` ones, so that a run started here and one relayed from another member, whose
events arrive already encoded, read the same.

| agio.v1 | A2A |
|---|---|
| `Run.id`, `Run.session_id` | `Task.id`, `Task.context_id` |
| QUEUED / RUNNING | SUBMITTED / WORKING |
| COMPLETED | COMPLETED |
| REQUIRES_ACTION (client tool calls, approvals) | INPUT_REQUIRED, described in the status message |
| CANCELLED | CANCELED |
| FAILED, INTERRUPTED | FAILED, the stop reason in the status message |
| a user step | a `ROLE_USER` message of the history |
| an assistant step's text | a `ROLE_AGENT` message of the history and an artifact (`answer`) |
| `Run.output` (an output schema's answer) | an artifact (`output`) holding a data part |
| `step_delta` text | `TaskArtifactUpdateEvent` appending to the step's artifact |
| tool calls | `TaskStatusUpdateEvent` WORKING naming them |
| `tool_progress` | `TaskStatusUpdateEvent` WORKING with the tool's message and ids |
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format, struct_pb2

from agio_grpc.domain import RunStatus
from agio_grpc.engine.remote import FollowedEvent, RelayedEvent
from agio_grpc.service import convert
from agio_grpc.v1 import events_pb2, resources_pb2

ANSWER = "answer"
"""The name of an artifact holding an assistant step's text (its id is the step's)."""
OUTPUT = "output"
"""The name and id suffix of the artifact holding a run's structured output."""

_STATES = {
    resources_pb2.RUN_STATUS_QUEUED: a2a.TASK_STATE_SUBMITTED,
    resources_pb2.RUN_STATUS_RUNNING: a2a.TASK_STATE_WORKING,
    resources_pb2.RUN_STATUS_COMPLETED: a2a.TASK_STATE_COMPLETED,
    resources_pb2.RUN_STATUS_REQUIRES_ACTION: a2a.TASK_STATE_INPUT_REQUIRED,
    resources_pb2.RUN_STATUS_CANCELLED: a2a.TASK_STATE_CANCELED,
    resources_pb2.RUN_STATUS_FAILED: a2a.TASK_STATE_FAILED,
    resources_pb2.RUN_STATUS_INTERRUPTED: a2a.TASK_STATE_FAILED,
}
TERMINAL_STATES = frozenset(
    {a2a.TASK_STATE_COMPLETED, a2a.TASK_STATE_CANCELED, a2a.TASK_STATE_FAILED}
)


def task_state(status: resources_pb2.RunStatus) -> a2a.TaskState:
    """The task state of a `RunStatus`."""
    return _STATES.get(status, a2a.TASK_STATE_UNSPECIFIED)


def run_statuses(state: a2a.TaskState) -> frozenset[RunStatus]:
    """The run statuses in task state `state` (FAILED: both FAILED and INTERRUPTED; none
    for a state no run is ever in)."""
    return frozenset(status for status in RunStatus if _task_state_of(status) == state)


def _task_state_of(status: RunStatus) -> a2a.TaskState:
    return _STATES[getattr(resources_pb2, convert.run_status_to_proto(status))]


def _data(value: Mapping[str, object]) -> a2a.Part:
    part = a2a.Part(media_type="application/json")
    json_format.ParseDict(dict(value), part.data)
    return part


def _agent_message(
    run: resources_pb2.Run, text: str, data: Mapping[str, object] | None = None
) -> a2a.Message:
    parts = [a2a.Part(text=text)]
    if data is not None:
        parts.append(_data(data))
    return a2a.Message(
        message_id=f"{run.id}-status-{run.last_sequence}-{run.status}",
        context_id=run.session_id,
        task_id=run.id,
        role=a2a.ROLE_AGENT,
        parts=parts,
    )


def _calls(calls: Sequence[resources_pb2.ToolCall]) -> list[dict[str, str]]:
    return [{"tool_call_id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]


def status_message(run: resources_pb2.Run) -> a2a.Message | None:
    """What the task's state says besides itself: what an INPUT_REQUIRED task waits for (a
    text for people, a data part for programs), or why a task failed or was cancelled."""
    if run.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION:
        action = run.required_action
        wanted = []
        if action.approvals:
            names = ", ".join(f"{c.name}({c.arguments})" for c in action.approvals)
            wanted.append(f"approval of {names}")
        if action.tool_calls:
            names = ", ".join(f"{c.name}({c.arguments})" for c in action.tool_calls)
            wanted.append(f"the results of {names}")
        data = {
            "approvals": _calls(action.approvals),
            "tool_calls": _calls(action.tool_calls),
        }
        reply = (
            'Reply in this task with a data part {"approvals": [{"tool_call_id": ..., '
            '"approved": true|false, "reason": ...}], "tool_outputs": [{"tool_call_id": ..., '
            '"output": ..., "is_error": false}]}.'
        )
        return _agent_message(run, f"Waiting for {' and '.join(wanted)}. {reply}", data)
    if run.status in (
        resources_pb2.RUN_STATUS_FAILED,
        resources_pb2.RUN_STATUS_INTERRUPTED,
        resources_pb2.RUN_STATUS_CANCELLED,
    ):
        signal = run.stop_signal
        reason = resources_pb2.StopReason.Name(signal.reason).removeprefix("STOP_REASON_")
        text = f"{reason}: {signal.message}" if signal.message else reason
        return _agent_message(run, text, {"stop_reason": reason, "source": signal.source})
    return None


def task_status(run: resources_pb2.Run) -> a2a.TaskStatus:
    status = a2a.TaskStatus(state=task_state(run.status))
    message = status_message(run)
    if message is not None:
        status.message.CopyFrom(message)
    stamp = run.end_time if run.HasField("end_time") else run.create_time
    status.timestamp.CopyFrom(stamp)
    return status


def task_metadata(run: resources_pb2.Run) -> struct_pb2.Struct:
    """`agio` facts of the run a program may want: its agent, stop reason and usage."""
    metadata = struct_pb2.Struct()
    facts: dict[str, object] = {
        "agent": run.agent,
        "usage": {
            "input_tokens": run.usage.input_tokens,
            "output_tokens": run.usage.output_tokens,
            "total_tokens": run.usage.total_tokens,
        },
    }
    if run.HasField("stop_signal"):
        name = resources_pb2.StopReason.Name(run.stop_signal.reason)
        facts["stop_reason"] = name.removeprefix("STOP_REASON_")
    json_format.ParseDict({"agio": facts}, metadata)
    return metadata


def history_message(step: resources_pb2.Step) -> a2a.Message | None:
    """A step as a message of the task's history: user and assistant text only."""
    if step.role == resources_pb2.ROLE_USER:
        role = a2a.ROLE_USER
    elif step.role == resources_pb2.ROLE_ASSISTANT and step.content:
        role = a2a.ROLE_AGENT
    else:
        return None
    return a2a.Message(
        message_id=step.id,
        context_id=step.session_id,
        task_id=step.run_id,
        role=role,
        parts=[a2a.Part(text=step.content)],
    )


def answer_artifact(step: resources_pb2.Step) -> a2a.Artifact:
    return a2a.Artifact(artifact_id=step.id, name=ANSWER, parts=[a2a.Part(text=step.content)])


def output_artifact(run: resources_pb2.Run) -> a2a.Artifact:
    part = a2a.Part(media_type="application/json")
    part.data.CopyFrom(run.output)
    return a2a.Artifact(artifact_id=f"{run.id}-{OUTPUT}", name=OUTPUT, parts=[part])


def task(
    run: resources_pb2.Run,
    steps: Sequence[resources_pb2.Step] = (),
    *,
    history_length: int | None = None,
    artifacts: bool = True,
) -> a2a.Task:
    """The task of a run with its steps: its history (the last `history_length` messages;
    None: all) and, with `artifacts`, every assistant text and the structured output."""
    messages = [m for m in (history_message(s) for s in steps) if m is not None]
    if history_length is not None:
        messages = messages[len(messages) - history_length :] if history_length else []
    found = a2a.Task(
        id=run.id,
        context_id=run.session_id,
        status=task_status(run),
        history=messages,
        metadata=task_metadata(run),
    )
    if artifacts:
        found.artifacts.extend(
            answer_artifact(s)
            for s in steps
            if s.role == resources_pb2.ROLE_ASSISTANT and s.content
        )
        if run.HasField("output"):
            found.artifacts.append(output_artifact(run))
    return found


Event = a2a.Task | a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent


@dataclass(slots=True)
class EventTranslator:
    """Turns one run's `StepEvent`s, in order, into A2A stream events.

    An assistant step's text streams into its artifact as deltas when the step was seen
    from its start; a step joined halfway (a subscription) or whose deltas were not kept (a
    replay from the journal) sends its whole text when it completes.
    """

    task_id: str
    context_id: str
    streaming: set[str] = field(default_factory=set)
    """Steps whose text is being streamed (their start was seen)."""
    sent: set[str] = field(default_factory=set)
    """Steps whose artifact has a first chunk."""

    def translate(self, event: events_pb2.StepEvent) -> Iterator[Event]:
        kind = event.WhichOneof("event")
        if kind == "step_started" and event.step_started.role == resources_pb2.ROLE_ASSISTANT:
            self.streaming.add(event.step_started.step_id)
        elif kind == "step_delta":
            delta = event.step_delta
            if delta.content and delta.step_id in self.streaming:
                yield self._chunk(delta.step_id, delta.content, last=False)
        elif kind == "step_completed":
            yield from self._completed(event.step_completed.step)
        elif kind == "tool_progress":
            yield self._progress(event.tool_progress, event.seq)
        elif kind in ("run_completed", "run_failed"):
            run = getattr(event, kind).run
            if run.HasField("output"):
                yield a2a.TaskArtifactUpdateEvent(
                    task_id=self.task_id,
                    context_id=self.context_id,
                    artifact=output_artifact(run),
                    last_chunk=True,
                )
            yield self.status(run)

    def status(self, run: resources_pb2.Run) -> a2a.TaskStatusUpdateEvent:
        return a2a.TaskStatusUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            status=task_status(run),
            metadata=task_metadata(run),
        )

    def _completed(self, step: resources_pb2.Step) -> Iterator[Event]:
        if step.role != resources_pb2.ROLE_ASSISTANT:
            return
        if step.content:
            if step.id in self.streaming and step.id in self.sent:
                yield self._chunk(step.id, "", last=True)
            else:
                yield self._chunk(step.id, step.content, last=True)
        self.streaming.discard(step.id)
        if step.tool_calls:
            names = ", ".join(c.name for c in step.tool_calls)
            calls = {"tool_calls": _calls(step.tool_calls)}
            yield self._working(f"{step.id}-calls", f"Calling {names}", calls)

    def _progress(
        self, progress: events_pb2.ToolProgressEvent, seq: int
    ) -> a2a.TaskStatusUpdateEvent:
        said = f": {progress.message}" if progress.message else ""
        facts = json_format.MessageToDict(progress, preserving_proto_field_name=True)
        text = f"{progress.name} is working{said}"
        return self._working(f"{progress.step_id}-progress-{seq}", text, {"tool_progress": facts})

    def _working(
        self, message_id: str, text: str, data: Mapping[str, object]
    ) -> a2a.TaskStatusUpdateEvent:
        """A WORKING status whose message says `text` and holds `data` as a data part."""
        message = a2a.Message(
            message_id=message_id,
            context_id=self.context_id,
            task_id=self.task_id,
            role=a2a.ROLE_AGENT,
            parts=[a2a.Part(text=text), _data(data)],
        )
        return a2a.TaskStatusUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            status=a2a.TaskStatus(state=a2a.TASK_STATE_WORKING, message=message),
        )

    def _chunk(self, step_id: str, text: str, *, last: bool) -> a2a.TaskArtifactUpdateEvent:
        first = step_id not in self.sent
        self.sent.add(step_id)
        return a2a.TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            artifact=a2a.Artifact(artifact_id=step_id, name=ANSWER, parts=[a2a.Part(text=text)]),
            append=not first,
            last_chunk=last,
        )


def reply_data(message: a2a.Message) -> dict[str, object]:
    """The JSON object of a message's data parts, merged (later keys win)."""
    merged: dict[str, object] = {}
    for part in message.parts:
        if part.WhichOneof("content") == "data":
            value = json_format.MessageToDict(part.data)
            if isinstance(value, dict):
                merged.update(value)
    return merged


def message_text(message: a2a.Message) -> str:
    """The text a message gives a run: its text parts, then each data part as JSON text, one
    per line."""
    lines: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            lines.append(part.text)
        elif kind == "data":
            lines.append(json.dumps(json_format.MessageToDict(part.data), ensure_ascii=False))
    return "\n".join(lines)


def step_event(event: FollowedEvent) -> events_pb2.StepEvent:
    """A followed event as `agio.v1` streams it (a relayed one is already)."""
    if isinstance(event, RelayedEvent):
        assert isinstance(event.message, events_pb2.StepEvent)
        return event.message
    return convert.event_to_proto(event)
