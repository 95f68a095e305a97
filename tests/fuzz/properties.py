"""The properties every fuzzed call and every session it touched must hold.

- A call answers OK or a documented status (DEADLINE_EXCEEDED only when the test set a
  deadline), never INTERNAL or UNKNOWN, and a failure carries exactly one
  `google.rpc.ErrorInfo` in its status details. A request holding bytes that are not UTF-8
  answers INVALID_ARGUMENT.
- A run's stream (Run, SubmitToolOutputs, Retry, WatchRun) ends with exactly one terminal
  event and nothing after it, unless it failed before sending one (a stream that started
  a run may not: the run must stop before the caller's deadline); seqs rise without gaps
  (a WatchRun replay skips the deltas); the run it reports did not stop INTERNAL_ERROR. A
  WatchRun may send nothing only when asked from the run's last terminal event.
- At rest, a session's log is valid history: sequences 1..N without gaps, only user,
  assistant, tool and summary steps, every tool step answering an open call of the assistant
  step before it, no user, assistant or summary step while calls are open, a summary
  standing for earlier steps that end where a turn ends; the log may end with open
  calls only for a run waiting in REQUIRES_ACTION, the one that made them or a retry from
  after them (a DeleteSteps or ForkSession that would cut calls from their results is
  refused). None of its runs is still RUNNING or stopped INTERNAL_ERROR.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Sequence

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agio_grpc.testing import Turn
from agio_grpc.v1 import agent_service_pb2, resources_pb2
from agio_grpc.v1.resources_pb2 import Role, RunStatus, StopReason
from tests.fuzz.harness import FuzzService, Outcome
from tests.fuzz.strategies import RUN_STARTING, Case, Undecodable
from tests.fuzz.world import SETTLE_DEADLINE_S, TERMINAL_KINDS, World, terminal_run

DOCUMENTED_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
ERROR_DOMAIN = "agio-grpc"


def describe(case: Case, outcome: Outcome) -> str:
    kinds = [event.WhichOneof("event") for event in outcome.events]
    return f"{case.rpc.name} -> {outcome.code.name} {outcome.details!r}, events {kinds}"


def follows_only(case: Case, request: object) -> bool:
    """Whether the call only follows a run it does not own (WatchRun, or a Run that asked to
    outlive its caller), so its deadline may pass while the run goes on."""
    if case.rpc.name == "WatchRun":
        return True
    return (
        isinstance(request, agent_service_pb2.RunRequest)
        and request.on_disconnect == agent_service_pb2.DISCONNECT_POLICY_CONTINUE
    )


def assert_documented_status(case: Case, request: object, outcome: Outcome) -> None:
    """OK, or a documented code with exactly one ErrorInfo of the service's domain."""
    code = outcome.code
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        # The client's own deadline: no details to expect. Without one the test's safety
        # deadline passed: a hang, unless a run's stream had started (the server saw that
        # deadline too, so the run must have stopped TIMEOUT: assert_one_terminal_event).
        started_run = bool(outcome.events) and case.rpc.name in RUN_STARTING
        assert case.deadline_s is not None or started_run or follows_only(case, request), (
            f"no answer within the safety deadline: {describe(case, outcome)}"
        )
        return
    assert code in DOCUMENTED_CODES, f"undocumented status: {describe(case, outcome)}"
    if code == grpc.StatusCode.OK:
        return
    assert outcome.error is not None
    status = rpc_status.from_call(outcome.error)
    assert status is not None, f"no status details: {describe(case, outcome)}"
    infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1, f"{len(infos)} ErrorInfo details: {describe(case, outcome)}"
    info = error_details_pb2.ErrorInfo()
    infos[0].Unpack(info)
    assert info.reason, f"an ErrorInfo with no reason: {describe(case, outcome)}"
    assert info.domain == ERROR_DOMAIN, f"ErrorInfo {info}: {describe(case, outcome)}"


def assert_one_terminal_event(case: Case, request: object, outcome: Outcome) -> None:
    """A run's stream ends with exactly one terminal event, unless it failed before one."""
    events = outcome.events
    kinds = [event.WhichOneof("event") for event in events]
    if events:
        assert len({event.run_id for event in events}) == 1, describe(case, outcome)
        seqs = [event.seq for event in events]
        # A run's own stream has every seq; a replay skips the deltas, never journaled.
        expected = (
            list(range(seqs[0], seqs[0] + len(seqs)))
            if case.rpc.name in RUN_STARTING
            else sorted(set(seqs))
        )
        assert seqs == expected, f"seqs {seqs}: {describe(case, outcome)}"
    ends = [index for index, kind in enumerate(kinds) if kind in TERMINAL_KINDS]
    assert len(ends) <= 1, f"{len(ends)} terminal events: {describe(case, outcome)}"
    if ends:
        assert ends[0] == len(events) - 1, (
            f"events after the terminal one: {describe(case, outcome)}"
        )
        run = terminal_run(events[-1])
        assert run is not None
        assert run.stop_signal.reason != StopReason.STOP_REASON_INTERNAL_ERROR, (
            f"the run stopped INTERNAL_ERROR ({run.stop_signal.message!r}): "
            f"{describe(case, outcome)}"
        )
        assert outcome.code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED), (
            f"the stream failed after its terminal event: {describe(case, outcome)}"
        )
        return
    if outcome.code == grpc.StatusCode.OK:
        # A watch from the cursor of the run's last terminal event has nothing to send
        # (assert_watch_started_at_the_end checks that it was that cursor).
        assert case.rpc.name == "WatchRun", (
            f"the stream ended OK with no terminal event: {describe(case, outcome)}"
        )
        assert not events, f"the stream ended OK with no terminal event: {describe(case, outcome)}"
    if events and case.rpc.name in RUN_STARTING:
        # A stream that started (or continued) a run must see it end: the run stops with
        # TIMEOUT before the caller's deadline, whatever else goes wrong.
        assert follows_only(case, request), (
            f"the stream ended without a terminal event: {describe(case, outcome)}"
        )


async def assert_watch_started_at_the_end(world: World, request: object) -> None:
    """An empty watch that ended OK was asked for the events after the run's last terminal
    event, so it missed nothing."""
    assert isinstance(request, agent_service_pb2.WatchRunRequest)
    replay = agent_service_pb2.WatchRunRequest(run_id=request.run_id)
    events = [event async for event in world.agents.WatchRun(replay, timeout=SETTLE_DEADLINE_S)]
    ends = [event.seq for event in events if terminal_run(event) is not None]
    assert ends[-1:] == [request.after_seq], (
        f"WatchRun after_seq={request.after_seq} sent nothing and ended OK; the run's "
        f"terminal events are at {ends}"
    )


async def assert_valid_history(world: World, session_id: str) -> None:
    """The session's log at rest is valid history (module docstring)."""
    steps = await world.steps_of(session_id)
    runs = await world.runs_of(session_id)
    if steps is None or runs is None:
        return  # deleted
    where = f"session {session_id}"
    assert [s.sequence for s in steps] == list(range(1, len(steps) + 1)), (
        f"{where}: sequences {[s.sequence for s in steps]}"
    )
    for run in runs:
        assert run.status != RunStatus.RUN_STATUS_RUNNING, f"{where}: run {run.id} still RUNNING"
        assert run.stop_signal.reason != StopReason.STOP_REASON_INTERNAL_ERROR, (
            f"{where}: run {run.id} stopped INTERNAL_ERROR ({run.stop_signal.message!r})"
        )
    waiting = [run for run in runs if run.status == RunStatus.RUN_STATUS_REQUIRES_ACTION]
    open_calls: Counter[str] = Counter()
    opened_by, opened_at = "", 0
    for step in steps:
        if step.role == Role.ROLE_TOOL:
            assert open_calls[step.tool_call_id] > 0, (
                f"{where}: step {step.sequence} answers {step.tool_call_id!r}, which no open "
                f"call asked for; {_roles(steps)}"
            )
            open_calls[step.tool_call_id] -= 1
            continue
        assert step.role in (Role.ROLE_USER, Role.ROLE_ASSISTANT, Role.ROLE_SUMMARY), (
            f"{where}: step {step.sequence} has role {Role.Name(step.role)}"
        )
        if step.role == Role.ROLE_SUMMARY:
            first, last = step.summary_first_sequence, step.summary_last_sequence
            assert 1 <= first <= last < step.sequence, (
                f"{where}: summary step {step.sequence} covers {first}..{last}"
            )
            assert steps[last].role != Role.ROLE_TOOL, (  # steps[last] is sequence last + 1
                f"{where}: summary step {step.sequence} ends at {last}, before a tool result"
            )
        unanswered = sorted(+open_calls)
        assert not unanswered, (
            f"{where}: step {step.sequence} ({Role.Name(step.role)}) follows tool calls with "
            f"no result {unanswered}; {_roles(steps)}"
        )
        if step.role != Role.ROLE_SUMMARY:
            open_calls = Counter(call.id for call in step.tool_calls)
            opened_by, opened_at = step.run_id, step.sequence
    if +open_calls:
        # Waiting for them: the run that made the calls, or a retry from after them that
        # took them over (it runs a step's calls that have no result; it wrote no step yet).
        assert any(
            run.id == opened_by or not 0 < run.first_sequence <= opened_at for run in waiting
        ), (
            f"{where}: the log ends with tool calls with no result {sorted(+open_calls)} and "
            f"neither their run {opened_by} nor a retry after them waits for outputs; "
            f"{_roles(steps)}; runs "
            f"{[(r.id, RunStatus.Name(r.status), r.first_sequence) for r in runs]}"
        )


def _roles(steps: list[resources_pb2.Step]) -> str:
    shown = [
        Role.Name(s.role).removeprefix("ROLE_").lower()
        + (f"({len(s.tool_calls)})" if s.tool_calls else "")
        for s in steps
    ]
    return "steps " + " ".join(shown)


async def check_example(
    service: FuzzService, prop: str, cases: Sequence[Case], turns: Sequence[Turn] = ()
) -> list[Outcome]:
    """Send the cases in order (the fake model answering with `turns` first, then by its
    default responder), check each answer, let the runs come to rest, and check the history
    of every session the example touched."""
    started = time.perf_counter()
    service.model.requests.clear()
    service.model.request_headers.clear()
    world = World(service)
    outcomes: list[Outcome] = []
    try:
        encoded = [await world.encode(case) for case in cases]
        service.model.enqueue(*turns)  # after the world's own runs
        for case, (request, data) in zip(cases, encoded, strict=True):
            outcome = await service.call(case.rpc, data, case.deadline_s)
            outcomes.append(outcome)
            world.note(case, request, outcome)
            _count_stop(service, outcome)
            assert_documented_status(case, request, outcome)
            if case.rpc.streaming:
                assert_one_terminal_event(case, request, outcome)
            watched_nothing = case.rpc.name == "WatchRun" and not outcome.events
            if watched_nothing and outcome.code == grpc.StatusCode.OK:
                await assert_watch_started_at_the_end(world, request)
            if case.holds(Undecodable) and outcome.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (
                    f"a request that is not UTF-8: {describe(case, outcome)}"
                )
        await world.settle()
        for session_id in sorted(world.touched):
            await assert_valid_history(world, session_id)
    except BaseException:
        # Leave the server at rest for the next example (and the shrinker), then report.
        with contextlib.suppress(Exception):
            await world.settle()
        with contextlib.suppress(Exception):
            await world.clean_up()
        raise
    finally:
        service.tally.count_case(service.backend, prop, time.perf_counter() - started)
    await world.clean_up()
    return outcomes


def _count_stop(service: FuzzService, outcome: Outcome) -> None:
    for event in outcome.events:
        run = terminal_run(event)
        if run is not None:
            reason = StopReason.Name(run.stop_signal.reason).removeprefix("STOP_REASON_")
            service.tally.count_stop(service.backend, reason)
