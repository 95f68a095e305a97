"""How the client commands print what the server returned: for people, or as JSON.

`HumanPrinter` writes names, never enum numbers: streamed text and results on stdout,
progress and stop reasons on stderr. A run reads the same live and replayed (`watch` of an
ended run, whose journal has no deltas): each assistant step's text comes from its deltas
when they were streamed, else from its `step_completed`. `JsonPrinter` writes the RPC's
response message as proto3 JSON (field names as in the .proto, enums by name), one document
per line: a stream is JSON Lines, one `StepEvent` a line. Printers never call the server.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agio_grpc.cli.client_tools import pending_calls
from agio_grpc.client import output_value
from agio_grpc.v1 import (
    agent_service_pb2,
    events_pb2,
    resources_pb2,
    session_service_pb2,
)


class Printer(Protocol):
    """What a command prints, whatever the format."""

    def event(self, event: events_pb2.StepEvent) -> None: ...
    def watching(self, run: resources_pb2.Run) -> None: ...
    def waiting(self, run: resources_pb2.Run) -> None: ...
    def interrupted(self, cancels_run: bool) -> None: ...
    def started(self, run: resources_pb2.Run) -> None: ...
    def run(self, run: resources_pb2.Run) -> None: ...
    def answer(self, run: resources_pb2.Run) -> None: ...
    def cancelled(self, run: resources_pb2.Run) -> None: ...
    def runs(self, page: agent_service_pb2.ListRunsResponse) -> None: ...
    def approvals(self, runs: Sequence[resources_pb2.Run]) -> None: ...
    def sessions(self, page: session_service_pb2.ListSessionsResponse) -> None: ...
    def session(
        self, session: resources_pb2.Session, steps: Sequence[resources_pb2.Step]
    ) -> None: ...
    def steps(self, steps: Sequence[resources_pb2.Step]) -> None: ...
    def deleted(self, session_id: str, deleted_steps: int) -> None: ...
    def forked(self, session: resources_pb2.Session) -> None: ...
    def compacted(self, response: session_service_pb2.CompactSessionResponse) -> None: ...
    def agents(self, agents: Sequence[resources_pb2.Agent], verbose: bool) -> None: ...


def to_dict(message: Message) -> dict[str, Any]:
    """proto3 JSON: .proto field names, enum names, every field (zero values too), int64 as
    numbers."""
    return json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )


class LastRun:
    """The run a printer printed events of last, and its end once that was printed (a
    `submit` continues a run that ended waiting: its next event starts it again)."""

    def __init__(self) -> None:
        self.run_id = ""
        self.ended: resources_pb2.Run | None = None
        self.told_waiting = False  # how to answer the waiting run was said

    def waiting(self, run: resources_pb2.Run) -> str:
        """How to answer the waiting `run`, said once."""
        self.told_waiting = True
        return waiting_hint(run)

    def watch(self, run: resources_pb2.Run) -> None:
        self.run_id = run.id
        self.ended = run if run.HasField("end_time") else None

    def see(self, event: events_pb2.StepEvent) -> None:
        self.run_id = event.run_id
        kind = event.WhichOneof("event")
        self.ended = getattr(event, kind).run if kind in ("run_completed", "run_failed") else None
        if self.ended is None:
            self.told_waiting = False  # going on: a wait to come is a new one

    def interruption(self, cancels_run: bool) -> str:
        """What Ctrl-C left behind, for stderr. `cancels_run`: the command's stream was the
        run's own (chat, retry, submit), whose end cancels the run on the server; else a
        watch, whose end leaves it running."""
        run_id, ended = self.run_id, self.ended
        if not run_id:
            return "interrupted"
        if ended is not None:
            waiting = ended.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION
            if waiting and not self.told_waiting:
                return f"interrupted: {waiting_hint(ended)}"
            return "interrupted"
        if cancels_run:
            return (
                f"interrupted: run {run_id} is cancelled (a run stops when its caller leaves; "
                "`chat --background` starts one that goes on without it)"
            )
        return (
            f"stopped watching run {run_id}, which goes on "
            f"(`agio-grpc runs cancel {run_id}` stops it)"
        )


def submit_command(run: resources_pb2.Run) -> str:
    """The command that answers a waiting run, with each pending call's id."""
    answers = " ".join(f"{call.id}=OUTPUT" for call in pending_calls(run))
    return f"agio-grpc submit {run.id} {answers or 'CALL_ID=OUTPUT...'}"


def waiting_hint(run: resources_pb2.Run) -> str:
    return f"run {run.id} waits for its client tool outputs: {submit_command(run)}"


class JsonPrinter:
    """One JSON document per line on stdout (what is said about an interruption goes to
    stderr)."""

    def __init__(self) -> None:
        self._last = LastRun()

    def _write(self, document: Mapping[str, Any]) -> None:
        print(json.dumps(document, ensure_ascii=False), flush=True)

    def event(self, event: events_pb2.StepEvent) -> None:
        self._last.see(event)
        self._write(to_dict(event))

    def watching(self, run: resources_pb2.Run) -> None:
        self._last.watch(run)  # nothing printed: the stream is StepEvents only

    def waiting(self, run: resources_pb2.Run) -> None:
        print(self._last.waiting(run), file=sys.stderr)

    def interrupted(self, cancels_run: bool) -> None:
        print(f"agio-grpc: {self._last.interruption(cancels_run)}", file=sys.stderr)

    def started(self, run: resources_pb2.Run) -> None:
        self._write(to_dict(agent_service_pb2.StartRunResponse(run=run)))

    def run(self, run: resources_pb2.Run) -> None:
        self._write(to_dict(agent_service_pb2.GetRunResponse(run=run)))

    def answer(self, run: resources_pb2.Run) -> None:
        """The whole final run of a structured run (its `output` in it)."""
        self._write(to_dict(run))

    def cancelled(self, run: resources_pb2.Run) -> None:
        self._write(to_dict(agent_service_pb2.CancelRunResponse(run=run)))

    def runs(self, page: agent_service_pb2.ListRunsResponse) -> None:
        self._write(to_dict(page))

    def approvals(self, runs: Sequence[resources_pb2.Run]) -> None:
        self._write(to_dict(agent_service_pb2.ListRunsResponse(runs=runs)))

    def sessions(self, page: session_service_pb2.ListSessionsResponse) -> None:
        self._write(to_dict(page))

    def session(self, session: resources_pb2.Session, steps: Sequence[resources_pb2.Step]) -> None:
        self._write({"session": to_dict(session), "steps": [to_dict(step) for step in steps]})

    def steps(self, steps: Sequence[resources_pb2.Step]) -> None:
        self._write(to_dict(session_service_pb2.ListStepsResponse(steps=steps)))

    def deleted(self, session_id: str, deleted_steps: int) -> None:
        response = session_service_pb2.DeleteSessionResponse(deleted_steps=deleted_steps)
        self._write({"session_id": session_id} | to_dict(response))

    def forked(self, session: resources_pb2.Session) -> None:
        self._write(to_dict(session_service_pb2.ForkSessionResponse(session=session)))

    def compacted(self, response: session_service_pb2.CompactSessionResponse) -> None:
        self._write(to_dict(response))

    def agents(self, agents: Sequence[resources_pb2.Agent], verbose: bool) -> None:
        self._write(to_dict(agent_service_pb2.ListAgentsResponse(agents=agents)))


def _name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def status_name(run: resources_pb2.Run) -> str:
    return _name(resources_pb2.RunStatus, run.status, "RUN_STATUS_")


def reason_name(signal: resources_pb2.StopSignal) -> str:
    return _name(resources_pb2.StopReason, signal.reason, "STOP_REASON_")


def _colon(message: str) -> str:
    return f": {message}" if message else ""


def _time(stamp: Timestamp) -> str:
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return stamp.ToDatetime().isoformat(sep=" ", timespec="seconds")


def _step_line(step: resources_pb2.Step) -> list[str]:
    head = f"#{step.sequence:<4} {_name(resources_pb2.Role, step.role, 'ROLE_').lower():<9}"
    if step.role == resources_pb2.ROLE_TOOL:
        flag = " (error)" if step.is_error else ""
        return [f"{head} {step.name}{flag}: {step.content}{_decision(step)}"]
    if step.role == resources_pb2.ROLE_SUMMARY:
        covers = f"#{step.summary_first_sequence}-#{step.summary_last_sequence}"
        return [f"{head} (of {covers}) {step.content}"]
    lines = [f"{head} {step.content}"] if step.content else []
    return lines + [f"{head} -> {call.name}({call.arguments})" for call in step.tool_calls]


def _decision(step: resources_pb2.Step) -> str:
    """Who decided a call that waited for approval, and when (nothing for other steps)."""
    if not step.HasField("approval"):
        return ""
    decision = step.approval
    verdict = "approved" if decision.approved else "rejected"
    why = f": {decision.reason}" if decision.reason else ""
    return f"  [{verdict} by {decision.decided_by or '-'} at {_time(decision.decide_time)}{why}]"


def _run_line(run: resources_pb2.Run) -> str:
    return (
        f"{run.id}  {status_name(run):<15} session {run.session_id}  agent {run.agent}  "
        f"steps {run.step_count}  created {_time(run.create_time)}"
    )


def _session_line(session: resources_pb2.Session) -> str:
    line = f"{session.id}  steps {session.step_count}  updated {_time(session.update_time)}"
    if session.parent_session_id:
        line += f"  (fork of {session.parent_session_id} at #{session.fork_sequence})"
    return line


class HumanPrinter:
    """Text for a terminal: results on stdout, progress and stop reasons on stderr."""

    def __init__(self) -> None:
        self._open_line = False  # streamed text waiting for its newline
        self._streamed: set[str] = set()  # steps whose text came as deltas
        self._headed = ""  # the run whose first line is printed
        self._last = LastRun()

    def _head(self, run: resources_pb2.Run, status: str) -> None:
        print(f"session {run.session_id}  run {run.id}  {status}", file=sys.stderr)
        self._headed = run.id

    def watching(self, run: resources_pb2.Run) -> None:
        """The first line of a watch: the run as it is now, not as it started."""
        self._last.watch(run)
        status = status_name(run)
        if run.HasField("end_time"):
            status += f" (ended {_time(run.end_time)}; replayed)"
        self._head(run, status)

    def event(self, event: events_pb2.StepEvent) -> None:
        self._last.see(event)
        kind = event.WhichOneof("event")
        if kind == "run_started":
            if event.run_id != self._headed:
                self._head(event.run_started.run, status_name(event.run_started.run))
        elif kind == "step_delta" and event.step_delta.content:
            self._open_line = True
            self._streamed.add(event.step_delta.step_id)
            print(event.step_delta.content, end="", flush=True)
        elif kind == "step_completed":
            self._end_line()
            self._completed(event.step_completed.step)
        elif kind == "error":
            print(f"  ! {event.error.reason}: {event.error.message}", file=sys.stderr)
        elif kind == "tool_progress":
            progress = event.tool_progress
            said = f": {progress.message}" if progress.message else ""
            print(f"  .. {progress.name} {progress.state}{said}", file=sys.stderr)
        elif kind in ("run_completed", "run_failed"):
            self._end_line()
            run = getattr(event, kind).run
            usage = run.usage
            print(
                f"[{reason_name(run.stop_signal)}] {run.stop_signal.message} | tokens in "
                f"{usage.input_tokens} out {usage.output_tokens} | steps {run.step_count}",
                file=sys.stderr,
            )

    def _completed(self, step: resources_pb2.Step) -> None:
        if step.role == resources_pb2.ROLE_ASSISTANT:
            if step.content and step.id not in self._streamed:
                print(step.content)  # replayed: no deltas came before it
            for call in step.tool_calls:
                print(f"  -> {call.name}({call.arguments})")
        elif step.role == resources_pb2.ROLE_TOOL:
            flag = " (error)" if step.is_error else ""
            print(f"  <- {step.name}{flag}: {step.content}")

    def _end_line(self) -> None:
        if self._open_line:
            print()
            self._open_line = False

    def waiting(self, run: resources_pb2.Run) -> None:
        print(self._last.waiting(run), file=sys.stderr)

    def interrupted(self, cancels_run: bool) -> None:
        self._end_line()
        print(f"agio-grpc: {self._last.interruption(cancels_run)}", file=sys.stderr)

    def answer(self, run: resources_pb2.Run) -> None:
        """A structured run's output as indented JSON on stdout, its stop on stderr."""
        signal = run.stop_signal
        print(f"[{reason_name(signal)}]{_colon(signal.message)}", file=sys.stderr)
        if run.HasField("output"):
            print(json.dumps(output_value(run), indent=2, ensure_ascii=False))

    def started(self, run: resources_pb2.Run) -> None:
        self._head(run, status_name(run))
        print(run.id)  # the last line of stdout: for `agio-grpc watch`

    def run(self, run: resources_pb2.Run) -> None:
        signal, usage = run.stop_signal, run.usage
        stop = f"{reason_name(signal)} from {signal.source or '-'}{_colon(signal.message)}"
        if signal.retryable:
            stop += f" (retryable from #{signal.resume_from_sequence})"
        fields = {
            "run": run.id,
            "session": run.session_id,
            "agent": run.agent,
            "status": status_name(run),
            "stop": stop if signal.reason else "-",
            "usage": f"tokens in {usage.input_tokens} out {usage.output_tokens} "
            f"total {usage.total_tokens}",
            "steps": f"{run.step_count} (#{run.first_sequence}..#{run.last_sequence}), "
            f"tool calls {run.tool_call_count}",
            "created": _time(run.create_time),
            "ended": _time(run.end_time),
            "trace": run.trace_id or "-",
        }
        if run.HasField("output"):
            fields["output"] = json.dumps(output_value(run), ensure_ascii=False)
        for key, value in fields.items():
            print(f"{key:<8} {value}")
        if run.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION:
            for call in pending_calls(run):
                print(f"{'call':<8} {call.id}  {call.name}({call.arguments})")
            print(f"{'answer':<8} {submit_command(run)}")

    def cancelled(self, run: resources_pb2.Run) -> None:
        print(f"{run.id}  {status_name(run)}{_colon(run.stop_signal.message)}")

    def runs(self, page: agent_service_pb2.ListRunsResponse) -> None:
        for run in page.runs:
            print(_run_line(run))
        self._next_page(page.next_page_token)

    def approvals(self, runs: Sequence[resources_pb2.Run]) -> None:
        if not runs:
            print("no call waits for approval", file=sys.stderr)
        for run in runs:
            action = run.required_action
            until = (
                f"  until {_time(action.approval_deadline)}"
                if action.approval_deadline.seconds
                else ""
            )
            where = f"  session {run.session_id}{until}"
            for call in action.approvals:
                print(f"{run.id}  {call.id}  {call.name}({call.arguments}){where}")

    def sessions(self, page: session_service_pb2.ListSessionsResponse) -> None:
        for session in page.sessions:
            print(_session_line(session))
        self._next_page(page.next_page_token)

    def _next_page(self, token: str) -> None:
        if token:
            print(f"more: --page-token {token}", file=sys.stderr)

    def session(self, session: resources_pb2.Session, steps: Sequence[resources_pb2.Step]) -> None:
        print(f"session {_session_line(session)}  created {_time(session.create_time)}")
        self.steps(steps)

    def steps(self, steps: Sequence[resources_pb2.Step]) -> None:
        for step in steps:
            for line in _step_line(step):
                print(line)

    def deleted(self, session_id: str, deleted_steps: int) -> None:
        print(f"deleted session {session_id} ({deleted_steps} steps)")

    def forked(self, session: resources_pb2.Session) -> None:
        print(
            f"forked {session.parent_session_id} at #{session.fork_sequence}: "
            f"{session.step_count} steps",
            file=sys.stderr,
        )
        print(session.id)  # the last line of stdout: for `chat --session`

    def compacted(self, response: session_service_pb2.CompactSessionResponse) -> None:
        if not response.HasField("summary"):
            print(f"nothing to compact (about {response.tokens_before} tokens)")
            return
        summary = response.summary
        print(
            f"summarized #{summary.summary_first_sequence}-#{summary.summary_last_sequence} "
            f"as #{summary.sequence}: about {response.tokens_before} -> "
            f"{response.tokens_after} tokens"
        )

    def agents(self, agents: Sequence[resources_pb2.Agent], verbose: bool) -> None:
        for agent in agents:
            tools = ", ".join(_tool_label(tool) for tool in agent.tools) or "no tools"
            print(f"{agent.name}  model={agent.model}  tools: {tools}")
            if verbose:
                for tool in agent.tools:
                    schema = json.dumps(json.loads(tool.parameters_json or "{}"))
                    # Where it runs, unless in the server's process.
                    where = f" [{tool.source}]" if tool.source not in ("", "python") else ""
                    label = _tool_label(tool, with_reason=True)
                    print(f"    {label}{where}: {tool.description} {schema}")


def _tool_label(tool: resources_pb2.ToolDefinition, *, with_reason: bool = False) -> str:
    """A tool's name, marked when it cannot be called now (its MCP server is down, say), with
    the reason when asked and known."""
    if not tool.unavailable:
        return tool.name
    if with_reason and tool.unavailable_reason:
        return f"{tool.name} (unavailable: {tool.unavailable_reason})"
    return f"{tool.name} (unavailable)"
