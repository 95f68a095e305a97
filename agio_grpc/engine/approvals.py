"""Tool approvals: server tool calls that wait for a person's decision before they run.

A call needs approval when its tool is one of the run's `RunSettings.approval_tools` (the
agent's `needs_approval` tools, its MCP servers' and the run's `require_approval`). The wait
is the client tools' wait: the loop runs the turn's other server calls, stores their
results, and ends the segment with REQUIRES_ACTION (`waiting_signal`), the held calls left
open in the log. The stop signal's context names what the run waits for (`tool_calls`:
client calls; `approvals`: held calls), which is what `Run.required_action` shows, so a
restart, another member or a replayed journal see the same wait.

One SubmitToolOutputs answers the whole wait (`decide`): an output per client call and a
decision per held call, else InvalidInputError naming the missing ids and nothing is
stored. Client outputs and rejections (`rejected_result`) are stored by the lifecycle's
`resume`; approved calls run first thing in the continued segment (`RunPlan.resume_calls`),
with their timeout, tracing and error policy, as any server call does.

Never imports grpc or the store.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from agio_grpc.domain import (
    ApprovalDecision,
    Role,
    Run,
    Step,
    StopReason,
    StopSignal,
    ToolCall,
    unanswered_call_result,
    utc_now,
)
from agio_grpc.engine.agents import RunSettings, ToolOutput
from agio_grpc.engine.context import open_tool_calls
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.engine.tracing import RunTrace

T = TypeVar("T")

TIMED_OUT = "timed out"
"""The reason of a rejection the server made when the wait passed `approval_timeout_s`."""
SERVER_DECIDER = "server"
"""Who decided a timed-out call."""


@dataclass(frozen=True, slots=True)
class ToolApproval:
    """A decision on one call waiting for approval (`SubmitToolOutputsRequest.approvals`)."""

    tool_call_id: str
    approved: bool
    reason: str = ""


@dataclass(slots=True)
class Decided:
    """What a submit decided: the steps the lifecycle stores, the calls the segment runs."""

    steps: list[Step]
    """The client outputs and the rejections, in call order."""
    approved: list[ToolCall]
    """Calls to run before the model (in call order)."""
    decisions: dict[str, ApprovalDecision] = field(default_factory=dict)
    """Every decision by call id, kept with the call's result."""
    waits: dict[str, float] = field(default_factory=dict)
    """Seconds each decided call waited (from its run's wait to the decision), by call id."""

    def traced(self, trace: RunTrace) -> list[Step]:
        """The steps to store, marked with the span of the segment that stores them, which
        records each rejection (an approved call's decision goes on its own span once it
        runs: engine/loop.py)."""
        for step in self.steps:
            step.trace_id, step.span_id = trace.trace_id, trace.span_id
            decision = step.approval
            if decision is not None and not decision.approved:
                call = ToolCall(step.tool_call_id, step.name, "")
                trace.rejected(call, decision, self.waits.get(step.tool_call_id, 0.0))
        return self.steps


@dataclass(frozen=True, slots=True)
class Answers:
    """What one SubmitToolOutputs brings: client outputs, decisions, and who decided."""

    outputs: list[ToolOutput]
    approvals: list[ToolApproval]
    decided_by: str = ""
    timed_out: bool = False
    """The server's own answer to a wait past its timeout (`timed_out`)."""

    def decide(self, run: Run, settings: RunSettings, history: list[Step]) -> Decided:
        """Answer the open calls of the waiting `run`'s log (`history`): see `decide`."""
        _, pending = open_tool_calls(history)
        held = held_ids(settings, pending)
        if self.timed_out:
            decided = timed_out(run.id, run.session_id, pending, held)
        else:
            decided = decide(
                run.id,
                run.session_id,
                pending,
                held,
                self.outputs,
                self.approvals,
                self.decided_by,
            )
        began = run.end_time  # the wait began as its segment ended
        for call_id, decision in decided.decisions.items():
            if began is not None and decision.decide_time is not None:
                decided.waits[call_id] = max(0.0, (decision.decide_time - began).total_seconds())
        return decided


def held_calls(
    settings: RunSettings, calls: Sequence[ToolCall], approved: Collection[str]
) -> list[ToolCall]:
    """The server calls of `calls` that wait for a decision (none `approved` already)."""
    if not settings.approval_tools:
        return []
    needing = set(settings.approval_tools)
    return [call for call in calls if call.name in needing and call.id not in approved]


def held_ids(settings: RunSettings, pending: Sequence[ToolCall]) -> set[str]:
    """Which of a waiting run's open calls wait for a decision: all but its client calls
    (a server call is open in a waiting run only because it was held)."""
    client_names = settings.client_tool_names()
    return {call.id for call in pending if call.name not in client_names}


def waiting_signal(
    client_calls: Sequence[ToolCall], held: Sequence[ToolCall], timeout_s: float | None
) -> StopSignal:
    """The REQUIRES_ACTION stop of a turn with client calls or calls waiting for approval;
    its context is what `Run.required_action` shows."""
    parts = []
    if client_calls:
        parts.append(f"the results of {len(client_calls)} client tool call(s)")
    if held:
        parts.append(f"a decision on {len(held)} tool call(s)")
    context: dict[str, Any] = {"tool_calls": [_call_entry(call) for call in client_calls]}
    if held:
        context["approvals"] = [_call_entry(call) for call in held]
        if timeout_s is not None and math.isfinite(timeout_s):
            context["approval_deadline"] = (utc_now() + timedelta(seconds=timeout_s)).isoformat()
    return StopSignal(
        StopReason.REQUIRES_ACTION, "waiting for " + " and ".join(parts), "loop", context=context
    )


def _call_entry(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def pending_approvals(signal: StopSignal | None) -> list[ToolCall]:
    """The calls a waiting run's stop signal holds for a decision."""
    entries = signal.context.get("approvals", []) if signal is not None else []
    return [ToolCall(e["id"], e["name"], e["arguments"]) for e in entries]


def approval_deadline(signal: StopSignal | None) -> datetime | None:
    """When the server rejects a waiting run's held calls; None: never."""
    text = signal.context.get("approval_deadline") if signal is not None else None
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def decide(
    run_id: str,
    session_id: str,
    pending: Sequence[ToolCall],
    held_ids: Collection[str],
    outputs: Sequence[ToolOutput],
    approvals: Sequence[ToolApproval],
    decided_by: str,
) -> Decided:
    """Answer a waiting run's open calls (`pending`, in call order): `held_ids` wait for a
    decision, the others for a client output. Raises InvalidInputError naming every id
    missing, unknown or given twice; then nothing was decided."""
    held = [call for call in pending if call.id in held_ids]
    client = [call for call in pending if call.id not in held_ids]
    if not pending:
        raise InvalidInputError(
            "tool_outputs", "the run has no pending client tool calls or approvals"
        )
    output_of, output_problems = _by_id(
        [o.tool_call_id for o in outputs], outputs, client, "output(s)"
    )
    approval_of, approval_problems = _by_id(
        [a.tool_call_id for a in approvals], approvals, held, "decision(s)"
    )
    if output_problems or approval_problems:
        # Every id at once, so that the next submit can be right.
        problems = [("tool_outputs", output_problems), ("approvals", approval_problems)]
        bad = [(name, text) for name, text in problems if text]
        message = bad[0][1] + "".join(f"; {name}: {text}" for name, text in bad[1:])
        raise InvalidInputError(bad[0][0], message)
    now = utc_now()
    steps: list[Step] = []
    approved: list[ToolCall] = []
    decisions: dict[str, ApprovalDecision] = {}
    for call in pending:
        if call.id in output_of:
            output = output_of[call.id]
            steps.append(
                Step(
                    session_id,
                    run_id,
                    Role.TOOL,
                    content=output.output,
                    tool_call_id=call.id,
                    name=call.name,
                    is_error=output.is_error,
                )
            )
            continue
        choice = approval_of[call.id]
        decision = ApprovalDecision(choice.approved, choice.reason, decided_by, now)
        decisions[call.id] = decision
        if choice.approved:
            approved.append(call)
        else:
            steps.append(rejected_result(session_id, run_id, call, decision))
    return Decided(steps, approved, decisions)


def timed_out(
    run_id: str, session_id: str, pending: Sequence[ToolCall], held_ids: Collection[str]
) -> Decided:
    """The server's answer to a wait past its `approval_timeout_s`, as a cancel would answer
    it: each held call rejected "timed out", each client call an error result."""
    decision = ApprovalDecision(False, TIMED_OUT, SERVER_DECIDER, utc_now())
    steps = [
        rejected_result(session_id, run_id, call, decision)
        if call.id in held_ids
        else unanswered_call_result(session_id, run_id, call, "the wait timed out")
        for call in pending
    ]
    return Decided(steps, [], {call.id: decision for call in pending if call.id in held_ids})


def rejected_result(
    session_id: str, run_id: str, call: ToolCall, decision: ApprovalDecision
) -> Step:
    """The result the model sees for a rejected call: that it was rejected, and why."""
    why = f": {decision.reason}" if decision.reason else " (no reason given)"
    return Step(
        session_id,
        run_id,
        Role.TOOL,
        content=f"The call of tool {call.name!r} was rejected and did not run{why}",
        tool_call_id=call.id,
        name=call.name,
        is_error=True,
        approval=decision,
    )


def _by_id(
    ids: Sequence[str], answers: Sequence[T], expected_calls: Sequence[ToolCall], what: str
) -> tuple[dict[str, T], str]:
    """The answers by call id, and what is wrong unless they answer exactly
    `expected_calls` ("" when nothing is)."""
    by_id: dict[str, T] = {}
    duplicates: list[str] = []
    for call_id, answer in zip(ids, answers, strict=True):
        if call_id in by_id:
            duplicates.append(call_id)
        by_id[call_id] = answer
    expected = [call.id for call in expected_calls]
    unknown = [call_id for call_id in by_id if call_id not in expected]
    missing = [call_id for call_id in expected if call_id not in by_id]
    problems = []
    if duplicates:
        problems.append(f"duplicate tool_call_id(s): {', '.join(duplicates)}")
    if unknown:
        problems.append(f"unknown tool_call_id(s): {', '.join(unknown)}")
    if missing:
        problems.append(f"missing {what} for tool_call_id(s): {', '.join(missing)}")
    if not problems:
        return by_id, ""
    return by_id, "; ".join(problems) + f" (pending: {', '.join(expected) or 'none'})"
