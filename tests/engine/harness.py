"""The engine under test, assembled from real parts: a SQLite file store, the real openai
client talking HTTP to the fake model server, the built-in tools plus a few test tools.

`Harness.run()` starts a run and collects its whole event stream, checking on the way the
invariants every stream must keep (gapless seqs, one terminal event at the end, each
`StepCompleted` step readable from the store when it is published).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agio_grpc.domain import Role, Run, Step, StopReason
from agio_grpc.engine import (
    AgentSpec,
    ClientTool,
    Limits,
    RetryPolicy,
    RunCompleted,
    RunFailed,
    RunHandle,
    RunInput,
    Runtime,
    RuntimeOptions,
    SequencedEvent,
    StepCompleted,
    ToolContext,
    ToolRegistry,
    ToolStop,
)
from agio_grpc.engine.builtin_tools import TOOLS
from agio_grpc.engine.events import Event
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver
from agio_grpc.engine.output import OutputMode, OutputSpec
from agio_grpc.engine.remote import FollowedEvent, RemoteRuns
from agio_grpc.engine.storage import Storage
from agio_grpc.store.leases import SessionLeases
from agio_grpc.testing import FakeModelServer
from tests.roles import StoreRoles

E = TypeVar("E", bound=Event)

INSTRUCTIONS = "You are a test assistant."
TEST_TOOLS = [
    "calculate",
    "current_time",
    "echo",
    "note",
    "wait_for_gate",
    "explode",
    "finish",
    "repeat",
    "report",
]
LOOKUP = ClientTool("lookup", "Look an order up.", '{"type": "object"}')
"""A client tool: a call to it ends the run REQUIRES_ACTION."""
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
"""The output schema of the `structured_<mode>` agents (one per output mode)."""
OUTPUT_MODES: tuple[OutputMode, ...] = ("json_schema", "json_object", "tool")
FAST_RETRIES = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.01, max_retry_after_s=0.05)


@dataclass
class Gate:
    """Lets a test hold the `wait_for_gate` tool while it acts (no sleeps)."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    contexts: list[ToolContext] = field(default_factory=list)
    """The context of each `report` call, kept past the call."""
    calls: int = 0
    running: int = 0
    most_running: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_running(self, count: int) -> None:
        """Return once `count` calls are inside the tool at the same time."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.running >= count)

    async def _update(self, delta: int) -> None:
        async with self.changed:
            self.running += delta
            self.most_running = max(self.most_running, self.running)
            self.changed.notify_all()


def make_registry(gate: Gate) -> ToolRegistry:
    """The built-ins plus tools that block on the gate, raise, or stop the run."""

    async def wait_for_gate(label: str = "") -> str:
        """Wait until the test opens the gate.

        Args:
            label: Returned with the result.
        """
        gate.calls += 1
        await gate._update(+1)
        gate.entered.set()
        try:
            await gate.release.wait()
        finally:
            await gate._update(-1)
        return f"released {label}".strip()

    async def note(text: str) -> str:
        """Return the text (an async tool that never waits)."""
        return text

    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(reason)

    def finish(summary: str) -> str:
        """Ends the run."""
        raise ToolStop(f"finished: {summary}")

    def repeat(text: str, times: int) -> str:
        """Returns `text` `times` times (a result much longer than its arguments)."""
        return text * times

    def report(steps: int, context: ToolContext) -> str:
        """Reports progress `steps` times from its worker thread (a sync tool), then answers."""
        gate.contexts.append(context)
        for step in range(1, steps + 1):
            context.report_progress(f"step {step} of {steps}", state="WORKING")
        return "reported"

    registry = ToolRegistry(TOOLS)
    for function in (note, wait_for_gate, explode, finish, repeat, report):
        registry.register(function)
    return registry


def make_agents(**limits: Any) -> dict[str, AgentSpec]:
    return {
        "assistant": AgentSpec(
            name="assistant",
            model="fake-model",
            instructions=INSTRUCTIONS,
            tools=list(TEST_TOOLS),
            limits=Limits(**limits),
        ),
        "impatient": AgentSpec(
            name="impatient",
            model="fake-model",
            instructions=INSTRUCTIONS,
            tools=list(TEST_TOOLS),
            limits=Limits(tool_timeout_s=0.2, max_parallel_tools=2),
        ),
        "strict": AgentSpec(
            name="strict",
            model="fake-model",
            instructions=INSTRUCTIONS,
            tools=list(TEST_TOOLS),
            limits=Limits(**limits),
            stop_on_error_tools=["explode"],
        ),
        **{
            f"structured_{mode}": AgentSpec(
                name=f"structured_{mode}",
                model="fake-model",
                instructions=INSTRUCTIONS,
                tools=list(TEST_TOOLS),
                limits=Limits(**limits),
                output=OutputSpec(CITY_SCHEMA, mode),
            )
            for mode in OUTPUT_MODES
        },
    }


@dataclass
class Outcome:
    """A run segment's full event stream."""

    events: list[SequencedEvent]

    @property
    def run(self) -> Run:
        terminal = self.events[-1].event
        assert isinstance(terminal, RunCompleted | RunFailed)
        return terminal.run

    @property
    def run_id(self) -> str:
        return self.events[0].run_id

    @property
    def session_id(self) -> str:
        return self.events[0].session_id

    @property
    def reason(self) -> StopReason:
        assert self.run.stop_signal is not None
        return self.run.stop_signal.reason

    @property
    def steps(self) -> list[Step]:
        return [e.step for e in self.of(StepCompleted)]

    def steps_of(self, role: Role) -> list[Step]:
        return [step for step in self.steps if step.role is role]

    def of(self, kind: type[E]) -> list[E]:
        return [e.event for e in self.events if isinstance(e.event, kind)]


@dataclass
class Harness:
    runtime: Runtime
    store: StoreRoles
    model: FakeModelServer
    gate: Gate
    driver: OpenAIModelDriver

    async def run(self, text: str, **fields: Any) -> Outcome:
        """Start a run with `text` and collect its stream to the end."""
        return await self.collect(await self.runtime.start_run(RunInput(text, **fields)))

    async def collect(
        self,
        handle: RunHandle,
        after_seq: int = 0,
        on_event: Callable[[SequencedEvent], Awaitable[None]] | None = None,
        *,
        check_stored: bool = True,
    ) -> Outcome:
        """Every event of the segment, checking the stream invariants as they arrive (with
        `check_stored`, that each completed step is in the store: not for a run whose steps
        another run may roll back meanwhile)."""
        events: list[SequencedEvent] = []
        async for sequenced in own(handle.events(after_seq)):
            if events:
                assert sequenced.seq == events[-1].seq + 1, (
                    f"seqs are gapless: {[(e.seq, e.event.type) for e in events]}, then "
                    f"{sequenced.seq} {sequenced.event.type}"
                )
            assert not any(e.is_terminal for e in events), "nothing after the terminal event"
            if check_stored and isinstance(sequenced.event, StepCompleted):
                step = sequenced.event.step
                stored = await self.store.get_step(step.session_id, step.sequence)
                assert stored.id == step.id, "a completed step is in the store"
            events.append(sequenced)
            if on_event is not None:
                await on_event(sequenced)
        assert events, "a stream has events"
        assert events[-1].is_terminal, "the stream ends with its terminal event"
        return Outcome(events)

    async def history(self, session_id: str) -> list[Step]:
        return await self.store.get_steps(session_id)

    def follow(self, run_id: str, after_seq: int = 0) -> AsyncIterator[SequencedEvent]:
        """`Runtime.follow` of the run."""
        return own(self.runtime.follow(run_id, after_seq))


async def own(events: AsyncIterator[FollowedEvent]) -> AsyncIterator[SequencedEvent]:
    """The events of a runtime with no other member to relay from: all its own."""
    async for event in events:
        assert isinstance(event, SequencedEvent), "nothing is relayed without other members"
        yield event


def storage_of(store: StoreRoles, leases: SessionLeases | None = None) -> Storage:
    """The runtime's storage on `store` (or a wrapper passing through to it): every role,
    the ledger inside a lifecycle; `leases` renews the sessions of its live runs."""
    return Storage(store, store, Lifecycle(store, store), leases)


def build_runtime(
    store: StoreRoles,
    model: FakeModelServer,
    gate: Gate,
    *,
    hooks: Hooks | None = None,
    retry: RetryPolicy = FAST_RETRIES,
    history_cache_bytes: int = 64_000_000,
    leases: SessionLeases | None = None,
    remote: RemoteRuns | None = None,
    cancel_poll_s: float = 0.5,
    watch_poll_s: float = 0.25,
    max_queued_runs: int = 10,
    **limits: Any,
) -> Harness:
    driver = OpenAIModelDriver(base_url=model.base_url, api_key="test-key", retry=retry)
    runtime = Runtime(
        storage_of(store, leases),
        make_agents(**limits),
        "assistant",
        make_registry(gate),
        driver,
        hooks,
        options=RuntimeOptions(
            history_cache_bytes=history_cache_bytes,
            cancel_poll_s=cancel_poll_s,
            watch_poll_s=watch_poll_s,
            max_queued_runs=max_queued_runs,
        ),
        remote=remote,
    )
    return Harness(runtime, store, model, gate, driver)


def assert_valid_messages(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call is answered right after it, and every tool message answers
    a call of the assistant message before it (what OpenAI-compatible servers require)."""
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, f"orphan tool result {message}"
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"tool calls {open_calls} have no result before {message}"
        if message["role"] == "assistant":
            open_calls = {call["id"] for call in message.get("tool_calls") or []}
    assert not open_calls, f"tool calls {open_calls} have no result"
