"""How many store calls each verb makes before its run goes on: every call is a round trip
to the database, on the path of every client's first event, and a write is a transaction
that takes the database's write lock.

Counted by a wrapper around the real store; the session's history is cached, as it is after
a run on it in this process (the usual case). Each verb's write checks the log it decided
on, so the counts hold without giving up any check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from agio_grpc.domain import RunStatus
from agio_grpc.engine import ClientTool, RunInput, ToolOutput
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import Gate, Harness, build_runtime
from tests.roles import StoreRoles

LOOKUP = ClientTool("lookup", "Look it up.", '{"type": "object"}')


class Counting:
    """The real store, counting the calls made to it (by method name)."""

    def __init__(self, store: StoreRoles) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await method(*args, **kwargs)

        return counted


@pytest.fixture
async def counted(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> AsyncIterator[tuple[Harness, Counting]]:
    counting = Counting(sqlite_store)
    harness = build_runtime(cast(StoreRoles, counting), fake_model, Gate())
    try:
        yield harness, counting
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()


READS = ("get_", "list_", "read_", "next_", "count_", "context_", "ready_")


async def test_each_verb_is_one_write_transaction_in_at_most_two_round_trips(
    counted: tuple[Harness, Counting],
) -> None:
    harness, counting = counted
    verbs: dict[str, int] = {}
    writes: dict[str, int] = {}

    async def count(name: str, verb: Any) -> Any:
        counting.calls.clear()
        handle = await verb
        verbs[name] = sum(counting.calls.values())
        writes[name] = sum(n for call, n in counting.calls.items() if not call.startswith(READS))
        return handle

    harness.model.enqueue(Turn.text("one"))
    first = await harness.collect(
        await count("Run, new session", harness.runtime.start_run(RunInput("hi")))
    )
    session_id = first.session_id
    harness.model.enqueue(Turn.text("two"))
    await harness.collect(
        await count("Run", harness.runtime.start_run(RunInput("again", session_id=session_id)))
    )
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    request = RunInput("look", session_id=session_id, request_id="req-1", client_tools=[LOOKUP])
    waiting = await harness.collect(
        await count("Run with request_id", harness.runtime.start_run(request))
    )
    assert waiting.run.status is RunStatus.REQUIRES_ACTION

    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_2")]))
    outputs = [ToolOutput("call_client", "found")]
    submitted = harness.runtime.submit_tool_outputs(waiting.run_id, outputs)
    waiting_again = await harness.collect(await count("SubmitToolOutputs", submitted))
    assert waiting_again.run.status is RunStatus.REQUIRES_ACTION

    cancelled = await count(
        "CancelRun of a waiting run", harness.runtime.cancel(waiting.run_id, "no")
    )
    assert cancelled.status is RunStatus.CANCELLED

    harness.model.enqueue(Turn.text("regenerated"))
    await harness.collect(await count("Retry", harness.runtime.retry(session_id, 4)))

    assert writes == dict.fromkeys(verbs, 1)
    assert verbs == {
        "Run, new session": 1,
        "Run": 1,
        "Run with request_id": 1,
        "SubmitToolOutputs": 2,
        "CancelRun of a waiting run": 2,
        "Retry": 2,
    }
