"""The StoreRoles contract, run unchanged on a SQLite file and on PostgreSQL.

Every test takes the `store` fixture (parametrized over both backends in tests/conftest.py)
and asserts outcomes through the public StoreRoles methods; where a test needs to reach past
the store, it opens its own engine on the same database, the way another process would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import alembic.command
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.ext.asyncio import create_async_engine

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
)
from agio_grpc.store import (
    InvalidRangeError,
    NotFoundError,
    SchemaTooNewError,
    SequenceConflictError,
    SessionBusyError,
    StoreError,
    StoreUnavailableError,
)
from agio_grpc.store.errors import HistoryChangedError
from agio_grpc.store.migrations import VERSION_TABLE, head_revision
from agio_grpc.store.records import HistoryMark, RunEnd
from agio_grpc.store.sql.steps import READ_BATCH, free_history
from agio_grpc.store.tables import metadata, runs, sessions, steps
from tests.postgres import free_local_port
from tests.roles import StoreRoles, open_roles
from tests.store.versions import set_version, versions_of

# -- helpers -------------------------------------------------------------------------------


def user(session_id: str, text: str = "hi", run_id: str = "run_1") -> Step:
    return Step(session_id=session_id, run_id=run_id, role=Role.USER, content=text)


def assistant(session_id: str, *, calls: int = 0, tokens: int = 0) -> Step:
    return Step(
        session_id=session_id,
        run_id="run_1",
        role=Role.ASSISTANT,
        content="" if calls else "done",
        tool_calls=[ToolCall(id=f"call_{i}", name="lookup", arguments="{}") for i in range(calls)],
        metrics=StepMetrics(total_tokens=tokens, input_tokens=tokens // 2),
    )


def tool(session_id: str, call_id: str = "call_0") -> Step:
    return Step(
        session_id=session_id,
        run_id="run_1",
        role=Role.TOOL,
        content="42",
        tool_call_id=call_id,
        name="lookup",
    )


async def session_with_steps(store: StoreRoles, count: int) -> Session:
    session = await store.new_session()
    await store.append_steps([user(session.id, f"m{i}") for i in range(1, count + 1)])
    return session


async def sequences(store: StoreRoles, session_id: str) -> list[int]:
    return [step.sequence for step in await store.get_steps(session_id)]


def is_aware_utc(value: datetime | None) -> bool:
    return value is not None and value.utcoffset() == timedelta(0)


# -- appending and sequence allocation -----------------------------------------------------


async def test_append_allocates_sequences_one_to_n(store: StoreRoles) -> None:
    session = await store.new_session()

    stored = [await store.append_one(user(session.id, f"m{i}")) for i in range(3)]

    assert [step.sequence for step in stored] == [1, 2, 3]
    assert await sequences(store, session.id) == [1, 2, 3]
    assert (await store.get_session(session.id)).step_count == 3


async def test_append_returns_stored_copies_and_leaves_the_input_untouched(
    store: StoreRoles,
) -> None:
    session = await store.new_session()
    draft = user(session.id)

    stored = await store.append_one(draft)

    assert draft.sequence == 0
    assert draft.create_time is None
    assert stored.id == draft.id
    assert stored.sequence == 1
    assert is_aware_utc(stored.create_time)


async def test_batch_append_is_consecutive(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)

    stored = await store.append_steps(
        [assistant(session.id, calls=2), tool(session.id, "call_0"), tool(session.id, "call_1")]
    )

    assert [step.sequence for step in stored] == [3, 4, 5]
    assert await sequences(store, session.id) == [1, 2, 3, 4, 5]


async def test_batch_append_is_atomic(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)
    existing = (await store.get_steps(session.id))[0]
    batch = [user(session.id, "new"), dataclasses.replace(user(session.id), id=existing.id)]

    with pytest.raises(StoreError):
        await store.append_steps(batch)

    assert [step.content for step in await store.get_steps(session.id)] == ["m1", "m2"]
    assert (await store.get_session(session.id)).step_count == 2
    assert (await store.append_one(user(session.id))).sequence == 3


async def test_empty_batch_writes_nothing(store: StoreRoles) -> None:
    session = await store.new_session()

    assert await store.append_steps([]) == []
    assert await store.step_count(session.id) == 0


async def test_append_rejects_steps_of_two_sessions(store: StoreRoles) -> None:
    first = await store.new_session()
    second = await store.new_session()

    with pytest.raises(ValueError, match="one session"):
        await store.append_steps([user(first.id), user(second.id)])


async def test_append_to_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.append_one(user("sess_missing"))


async def test_sequence_collision_raises_conflict_and_writes_nothing(
    store: StoreRoles, store_url: str
) -> None:
    session = await session_with_steps(store, 2)
    # Another writer puts a step at sequence 3 behind the counter's back, as a buggy
    # replica would; the store's next allocation (3, 4) must collide and change nothing.
    intruder = create_async_engine(store_url)
    try:
        async with intruder.begin() as conn:
            await conn.execute(
                insert(steps).values(
                    id="step_intruder",
                    session_id=session.id,
                    sequence=3,
                    role="user",
                    create_time=datetime.now(UTC),
                )
            )
    finally:
        await intruder.dispose()
    batch = [user(session.id, "a"), user(session.id, "b")]

    with pytest.raises(SequenceConflictError):
        await store.append_steps(batch)

    stored = await store.get_steps(session.id)
    assert [step.id for step in stored][-1] == "step_intruder"
    assert not {step.id for step in batch} & {step.id for step in stored}
    assert (await store.get_session(session.id)).step_count == 2


async def test_fifty_concurrent_writers_get_sequences_one_to_fifty(store: StoreRoles) -> None:
    session = await store.new_session()

    stored = await asyncio.gather(*(store.append_one(user(session.id, f"m{i}")) for i in range(50)))

    assert sorted(step.sequence for step in stored) == list(range(1, 51))
    assert await sequences(store, session.id) == list(range(1, 51))
    assert (await store.get_session(session.id)).step_count == 50
    times = [s.create_time for s in await store.get_steps(session.id) if s.create_time]
    assert len(times) == 50
    assert times == sorted(times)


async def test_two_stores_on_one_database_keep_sequences_gapless(
    store: StoreRoles, store_url: str
) -> None:
    other = await open_roles(store_url)
    try:
        session = await store.new_session()

        await asyncio.gather(
            *(store.append_one(user(session.id, "a")) for _ in range(20)),
            *(other.append_one(user(session.id, "b")) for _ in range(20)),
        )

        assert await sequences(store, session.id) == list(range(1, 41))
    finally:
        await other.close()


_WRITER_PROCESS = """
import asyncio, sys
from agio_grpc.domain import Role, Step
from tests.roles import open_roles

async def main(url: str, session_id: str) -> None:
    store = await open_roles(url)
    try:
        await asyncio.gather(*(
            store.append_one(Step(session_id=session_id, run_id="other", role=Role.USER))
            for _ in range(20)
        ))
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_writers_in_another_process_keep_sequences_gapless(
    store: StoreRoles, store_url: str
) -> None:
    session = await store.new_session()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _WRITER_PROCESS,
        store_url,
        session.id,
        stderr=asyncio.subprocess.PIPE,
    )

    _, (_, stderr) = await asyncio.gather(
        asyncio.gather(*(store.append_one(user(session.id)) for _ in range(20))),
        process.communicate(),
    )

    assert process.returncode == 0, stderr.decode()
    assert await sequences(store, session.id) == list(range(1, 41))
    assert {step.run_id for step in await store.get_steps(session.id)} == {"run_1", "other"}


# -- reading steps -------------------------------------------------------------------------


async def test_step_round_trips_every_field(store: StoreRoles) -> None:
    session = await store.new_session()
    draft = Step(
        session_id=session.id,
        run_id="run_9",
        role=Role.ASSISTANT,
        content="calling",
        reasoning_content="think",
        tool_calls=[
            ToolCall(id="call_a", name="search", arguments='{"q": "x"}'),
            ToolCall(id="call_b", name="broken", arguments="{not json"),
        ],
        tool_call_id="",
        name="planner",
        is_error=True,
        metrics=StepMetrics(
            duration_ms=1200,
            first_token_latency_ms=80,
            input_tokens=100,
            output_tokens=20,
            total_tokens=120,
            cached_input_tokens=50,
            reasoning_tokens=7,
            model_name="gpt-x",
            provider="openai",
            tool_exec_time_ms=3,
            retries=1,
        ),
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
    )

    stored = await store.append_one(draft)
    loaded = await store.get_step(session.id, 1)

    assert loaded == stored
    assert loaded.tool_calls == draft.tool_calls
    assert loaded.metrics == draft.metrics


async def test_a_tool_step_keeps_its_approval_decision(store: StoreRoles) -> None:
    session = await store.new_session()
    decision = ApprovalDecision(
        False, "too risky \u00e9 \u2603", "key_7", datetime(2026, 11, 27, 13, 0, 1, 250000, UTC)
    )
    stored = await store.append_one(
        Step(session.id, "run_9", Role.TOOL, content="rejected", tool_call_id="call_a",
             name="send_mail", is_error=True, approval=decision)
    )  # fmt: skip
    plain = await store.append_one(Step(session.id, "run_9", Role.USER, content="next"))

    assert (await store.get_step(session.id, stored.sequence)).approval == decision
    assert (await store.get_step(session.id, plain.sequence)).approval is None
    assert [step.approval for step in await store.get_steps(session.id)] == [decision, None]


async def test_every_read_returns_steps_exactly_as_appended(store: StoreRoles) -> None:
    # Every field distinct from its neighbours, so a column read into the wrong field shows.
    session = await store.new_session()
    metrics = StepMetrics(1, 2, 3, 4, 5, 6, 7, "model", "provider", 8, 9)
    drafts = [
        Step(session.id, "run_a", Role.SYSTEM, content="be brief"),
        Step(session.id, "run_a", Role.USER, content="question", trace_id="t1", span_id="s1"),
        Step(
            session.id,
            "run_b",
            Role.ASSISTANT,
            content="",
            reasoning_content="thinking",
            tool_calls=[ToolCall("call_1", "lookup", '{"q": "é ☃"}')],
            metrics=metrics,
        ),
        Step(
            session.id,
            "run_b",
            Role.TOOL,
            content="result",
            tool_call_id="call_1",
            name="lookup",
            is_error=True,
            trace_id="t2",
            span_id="s2",
        ),
        Step(
            session.id,
            "run_b",
            Role.SUMMARY,
            content="they looked something up",
            summary_first_sequence=2,
            summary_last_sequence=4,
        ),
    ]
    first = await store.append_steps(drafts[:2])
    second = [await store.append_one(step) for step in drafts[2:]]
    appended = first + second

    assert await store.get_steps(session.id) == appended
    assert await store.get_steps(session.id, 2, 3) == appended[1:3]
    assert [await store.get_step(session.id, n) for n in (1, 2, 3, 4, 5)] == appended
    assert await store.last_step(session.id) == appended[-1]
    for step in await store.get_steps(session.id):
        assert step.create_time is not None
        assert step.create_time.tzinfo is UTC
        assert type(step.is_error) is bool
        assert type(step.role) is Role
    assert await store.get_history(session.id) == [conversation_of(s) for s in appended]
    assert await store.get_history(session.id, 2, 3) == [conversation_of(s) for s in appended[1:3]]
    start = await store.start_run(
        Run(session_id=session.id, agent="a"), [user(session.id, "next", run_id="run_c")]
    )
    assert start.history == [conversation_of(s) for s in appended] + start.steps


def conversation_of(step: Step) -> Step:
    """`step` as `get_history` reads it: the message fields, ids and sequence only."""
    return dataclasses.replace(
        step, metrics=StepMetrics(), create_time=None, trace_id="", span_id=""
    )


async def test_get_history_reads_the_conversation_by_range(store: StoreRoles) -> None:
    session = await session_with_steps(store, 6)

    history = await store.get_history(session.id)
    assert history == [conversation_of(step) for step in await store.get_steps(session.id)]
    assert [s.sequence for s in await store.get_history(session.id, start=3)] == [3, 4, 5, 6]
    assert [s.sequence for s in await store.get_history(session.id, 2, 4)] == [2, 3, 4]
    assert await store.get_history(session.id, start=7) == []
    with pytest.raises(NotFoundError):
        await store.get_history("sess_missing")


async def test_get_history_since_a_held_step_reads_only_the_steps_after_it(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 6)
    stored = await store.get_steps(session.id)

    after = await store.get_history_since(session.id, HistoryMark(3, stored[2].id))
    assert after.start == 4
    assert after.steps == [conversation_of(step) for step in stored[3:]]
    bounded = await store.get_history_since(session.id, HistoryMark(3, stored[2].id), end=5)
    assert (bounded.start, [s.sequence for s in bounded.steps]) == (4, [4, 5])
    at_end = await store.get_history_since(session.id, HistoryMark(5, stored[4].id), end=5)
    assert (at_end.start, at_end.steps) == (6, [])
    last = await store.get_history_since(session.id, HistoryMark(6, stored[5].id))
    assert (last.start, last.steps) == (7, [])


@pytest.mark.parametrize(
    "mark",
    [None, HistoryMark(2, "step_unknown"), HistoryMark(9, "x"), HistoryMark(0, ""), "past_end"],
)
async def test_get_history_since_a_mark_that_does_not_hold_reads_from_the_start(
    store: StoreRoles, mark: HistoryMark | str | None
) -> None:
    session = await session_with_steps(store, 4)
    stored = await store.get_steps(session.id)
    if mark == "past_end":  # a real step, but after the end of the range asked for
        mark = HistoryMark(4, stored[3].id)
    assert not isinstance(mark, str)

    read = await store.get_history_since(session.id, mark, end=3)

    assert read.start == 1
    assert read.steps == [conversation_of(step) for step in stored[:3]]


async def cut_and_replaced(store: StoreRoles) -> tuple[Session, Step]:
    """A session of four steps whose 3 and 4 were deleted and replaced by two others, and
    the step that was 4th: a caller holding it holds a history that is no longer stored."""
    session = await session_with_steps(store, 4)
    held = (await store.get_steps(session.id))[3]
    await store.delete_steps_from(session.id, 3)
    await store.append_steps([user(session.id, "again"), user(session.id, "and again")])
    return session, held


async def test_get_history_since_a_step_that_was_cut_and_replaced_reads_from_the_start(
    store: StoreRoles,
) -> None:
    session, held = await cut_and_replaced(store)

    read = await store.get_history_since(session.id, HistoryMark(4, held.id))

    assert read.start == 1
    assert [step.content for step in read.steps[2:]] == ["again", "and again"]
    with pytest.raises(NotFoundError):
        await store.get_history_since("sess_missing", HistoryMark(1, held.id))
    with pytest.raises(NotFoundError):
        await store.get_history_since("sess_missing", None)


async def test_reads_longer_than_a_fetch_batch_keep_every_step_in_order(
    store: StoreRoles,
) -> None:
    count = 2 * READ_BATCH + 3  # two whole batches and a part of one
    session = await session_with_steps(store, count)

    steps = await store.get_steps(session.id)
    assert [s.sequence for s in steps] == list(range(1, count + 1))
    assert [s.content for s in steps] == [f"m{i}" for i in range(1, count + 1)]
    assert await store.get_history(session.id) == [conversation_of(s) for s in steps]
    tail = await store.get_history(session.id, start=READ_BATCH)
    assert [s.sequence for s in tail] == list(range(READ_BATCH, count + 1))
    page = await store.get_steps(session.id, 2, limit=READ_BATCH + 1)
    assert [s.sequence for s in page] == list(range(2, READ_BATCH + 3))


async def test_get_steps_by_range_and_limit(store: StoreRoles) -> None:
    session = await session_with_steps(store, 6)

    assert await sequences(store, session.id) == [1, 2, 3, 4, 5, 6]
    assert [s.sequence for s in await store.get_steps(session.id, start=3)] == [3, 4, 5, 6]
    assert [s.sequence for s in await store.get_steps(session.id, 2, 4)] == [2, 3, 4]
    assert [s.sequence for s in await store.get_steps(session.id, 2, limit=2)] == [2, 3]
    assert await store.get_steps(session.id, start=7) == []


async def test_get_steps_of_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.get_steps("sess_missing")


async def test_get_step_and_last_step_and_count(store: StoreRoles) -> None:
    session = await session_with_steps(store, 3)

    assert (await store.get_step(session.id, 2)).content == "m2"
    last = await store.last_step(session.id)
    assert last is not None
    assert last.sequence == 3
    assert await store.step_count(session.id) == 3


async def test_first_user_messages_reads_the_start_of_each_session_s_step_one(
    store: StoreRoles,
) -> None:
    asked = await store.new_session()
    await store.append_steps(
        [
            Step(asked.id, "run_1", Role.USER, content="ü" * 5 + " and more"),
            Step(asked.id, "run_1", Role.ASSISTANT, content="an answer"),
        ]
    )
    answered = await store.new_session()
    await store.append_one(Step(answered.id, "run_1", Role.ASSISTANT, content="hello"))
    empty = await store.new_session()
    ids = [asked.id, answered.id, empty.id, "sess_missing"]

    assert await store.first_user_messages(ids, 5) == {asked.id: "ü" * 5}
    assert await store.first_user_messages([], 5) == {}


async def test_empty_session_has_no_last_step_and_count_zero(store: StoreRoles) -> None:
    session = await store.new_session()

    assert await store.last_step(session.id) is None
    assert await store.step_count(session.id) == 0
    assert await store.get_steps(session.id) == []


async def test_get_step_missing_raises_not_found(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)

    with pytest.raises(NotFoundError) as missing_step:
        await store.get_step(session.id, 3)
    with pytest.raises(NotFoundError) as missing_session:
        await store.get_step("sess_missing", 1)

    assert missing_step.value.kind == "step"
    assert missing_session.value.kind == "session"


# -- deleting steps ------------------------------------------------------------------------


async def test_delete_from_n_keeps_earlier_steps_and_next_append_gets_n(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 5)

    deleted = await store.delete_steps_from(session.id, 3)

    assert deleted == 3
    assert await sequences(store, session.id) == [1, 2]
    assert (await store.get_session(session.id)).step_count == 2
    assert (await store.append_one(user(session.id))).sequence == 3


async def test_delete_from_past_the_last_step_deletes_nothing(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)

    assert await store.delete_steps_from(session.id, 3) == 0
    assert (await store.append_one(user(session.id))).sequence == 3


async def test_delete_from_one_empties_the_session(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)

    assert await store.delete_steps_from(session.id, 1) == 2
    assert await store.step_count(session.id) == 0
    assert (await store.append_one(user(session.id))).sequence == 1


async def test_delete_from_below_one_raises_invalid_range(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)

    with pytest.raises(InvalidRangeError) as error:
        await store.delete_steps_from(session.id, 0)

    assert error.value.last_sequence == 2
    assert await store.step_count(session.id) == 2


async def test_delete_on_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.delete_steps_from("sess_missing", 1)
    with pytest.raises(NotFoundError):
        await store.delete_session("sess_missing")


# -- forking -------------------------------------------------------------------------------


async def test_fork_copies_steps_with_new_ids_and_records_parent(store: StoreRoles) -> None:
    parent = await session_with_steps(store, 4)
    parent_steps = await store.get_steps(parent.id)

    fork = await store.fork_session(parent.id, 3)

    assert fork.id != parent.id
    assert fork.parent_session_id == parent.id
    assert fork.fork_sequence == 3
    assert fork.step_count == 3
    assert await store.get_session(fork.id) == fork
    copied = await store.get_steps(fork.id)
    assert [step.sequence for step in copied] == [1, 2, 3]
    assert [step.content for step in copied] == ["m1", "m2", "m3"]
    assert [step.run_id for step in copied] == [step.run_id for step in parent_steps[:3]]
    assert {step.session_id for step in copied} == {fork.id}
    assert not {step.id for step in copied} & {step.id for step in parent_steps}


async def test_fork_leaves_the_parent_untouched(store: StoreRoles) -> None:
    parent = await session_with_steps(store, 4)
    before = await store.get_steps(parent.id)
    parent_before = await store.get_session(parent.id)

    fork = await store.fork_session(parent.id, 2)
    await store.append_one(user(fork.id))
    await store.delete_steps_from(fork.id, 1)

    assert await store.get_steps(parent.id) == before
    assert await store.get_session(parent.id) == parent_before


async def test_fork_next_append_gets_n_plus_one(store: StoreRoles) -> None:
    parent = await session_with_steps(store, 4)

    fork = await store.fork_session(parent.id, 2)

    assert (await store.append_one(user(fork.id))).sequence == 3
    assert await sequences(store, fork.id) == [1, 2, 3]


async def test_fork_at_zero_is_an_empty_fork(store: StoreRoles) -> None:
    parent = await session_with_steps(store, 2)

    fork = await store.fork_session(parent.id, 0)

    assert fork.step_count == 0
    assert fork.fork_sequence == 0
    assert await store.get_steps(fork.id) == []
    assert (await store.append_one(user(fork.id))).sequence == 1


async def test_fork_past_the_last_step_raises_invalid_range_and_creates_no_session(
    store: StoreRoles,
) -> None:
    parent = await session_with_steps(store, 2)

    with pytest.raises(InvalidRangeError) as error:
        await store.fork_session(parent.id, 3)

    assert error.value.last_sequence == 2
    assert [s.id for s in await store.list_sessions(limit=10)] == [parent.id]


async def test_fork_of_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.fork_session("sess_missing", 0)


async def test_sequences_stay_one_to_n_after_any_mix_of_operations(store: StoreRoles) -> None:
    session = await session_with_steps(store, 3)
    await store.append_steps([assistant(session.id, calls=1), tool(session.id)])
    await store.delete_steps_from(session.id, 4)
    await store.append_one(user(session.id))
    fork = await store.fork_session(session.id, 4)
    await store.delete_steps_from(fork.id, 2)
    await store.append_steps([user(fork.id), user(fork.id)])
    await store.delete_steps_from(session.id, 2)
    await store.append_steps([user(session.id), user(session.id), user(session.id)])

    assert await sequences(store, session.id) == [1, 2, 3, 4]
    assert await sequences(store, fork.id) == [1, 2, 3]
    assert (await store.get_session(session.id)).step_count == 4
    assert (await store.get_session(fork.id)).step_count == 3


# -- context summary -----------------------------------------------------------------------


async def test_context_summary_counts_roles_tool_calls_sequences_and_tokens(
    store: StoreRoles,
) -> None:
    session = await store.new_session()
    await store.append_steps(
        [
            user(session.id),
            assistant(session.id, calls=2, tokens=100),
            tool(session.id, "call_0"),
            tool(session.id, "call_1"),
            assistant(session.id, tokens=30),
            user(session.id),
            assistant(session.id, calls=1, tokens=5),
        ]
    )
    await store.delete_steps_from(session.id, 7)

    summary = await store.context_summary(session.id)

    assert summary.total_steps == 6
    assert summary.user_steps == 2
    assert summary.assistant_steps == 2
    assert summary.tool_steps == 2
    assert summary.tool_calls == 2
    assert summary.min_sequence == 1
    assert summary.max_sequence == 6
    assert summary.total_tokens == 130


async def test_context_summary_of_an_empty_session_is_zero(store: StoreRoles) -> None:
    session = await store.new_session()

    summary = await store.context_summary(session.id)

    assert summary.total_steps == summary.max_sequence == summary.total_tokens == 0
    with pytest.raises(NotFoundError):
        await store.context_summary("sess_missing")


# -- sessions ------------------------------------------------------------------------------


async def test_session_round_trips(store: StoreRoles) -> None:
    created = await store.new_session()

    loaded = await store.get_session(created.id)

    assert loaded == created
    assert loaded.step_count == 0
    assert loaded.parent_session_id == ""
    assert loaded.active_run_id == ""


async def test_get_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError) as error:
        await store.get_session("sess_missing")

    assert error.value.kind == "session"
    assert error.value.key == "sess_missing"


async def test_creating_a_session_twice_raises(store: StoreRoles) -> None:
    session = await store.new_session()

    with pytest.raises(StoreError):
        await store.new_session(session)


async def test_list_sessions_newest_first_in_keyset_pages(store: StoreRoles) -> None:
    base = datetime(2025, 1, 1, tzinfo=UTC)
    # Two share a create_time: the id breaks the tie, so no page repeats or skips one.
    made = [
        Session(id="sess_a", create_time=base),
        Session(id="sess_b", create_time=base + timedelta(seconds=1)),
        Session(id="sess_c", create_time=base + timedelta(seconds=1)),
        Session(id="sess_d", create_time=base + timedelta(seconds=2)),
        Session(id="sess_e", create_time=base + timedelta(seconds=3)),
    ]
    for session in made:
        await store.new_session(session)

    pages: list[list[str]] = []
    after: tuple[datetime, str] | None = None
    while page := await store.list_sessions(limit=2, after=after):
        pages.append([session.id for session in page])
        after = (page[-1].create_time, page[-1].id)

    assert pages == [["sess_e", "sess_d"], ["sess_c", "sess_b"], ["sess_a"]]


async def test_update_time_moves_on_append_and_delete(store: StoreRoles) -> None:
    created = await store.new_session(
        Session(
            create_time=datetime(2025, 1, 1, tzinfo=UTC),
            update_time=datetime(2025, 1, 1, tzinfo=UTC),
        )
    )

    await store.append_one(user(created.id))
    after_append = (await store.get_session(created.id)).update_time
    await store.delete_steps_from(created.id, 1)
    after_delete = (await store.get_session(created.id)).update_time

    assert created.update_time < after_append <= after_delete
    assert (await store.get_session(created.id)).create_time == created.create_time


async def test_delete_session_cascades_to_steps_and_runs(store: StoreRoles) -> None:
    session = await session_with_steps(store, 3)
    run = await store.seed_run(Run(session_id=session.id, agent="default"))
    keeper = await session_with_steps(store, 1)

    assert await store.delete_session(session.id) == 3

    with pytest.raises(NotFoundError):
        await store.get_session(session.id)
    with pytest.raises(NotFoundError):
        await store.get_steps(session.id)
    with pytest.raises(NotFoundError):
        await store.get_run(run.id)
    assert await store.step_count(keeper.id) == 1


async def test_delete_session_keeps_its_forks(store: StoreRoles) -> None:
    parent = await session_with_steps(store, 2)
    fork = await store.fork_session(parent.id, 2)

    await store.delete_session(parent.id)

    assert await sequences(store, fork.id) == [1, 2]
    assert (await store.get_session(fork.id)).parent_session_id == parent.id


# -- runs ----------------------------------------------------------------------------------


async def test_run_create_update_get(store: StoreRoles) -> None:
    session = await store.new_session()
    run = Run(
        session_id=session.id,
        agent="default",
        request_id="req-1",
        trace_id="0af7651916cd43dd8448eb211c80319c",
        metadata={"team": "search"},
        options={"model": "gpt-x", "temperature": 0.2, "client_tools": [{"name": "pick"}]},
    )

    created = await store.seed_run(run)
    assert await store.get_run(run.id) == created

    created.status = RunStatus.COMPLETED
    created.stop_signal = StopSignal(
        reason=StopReason.MAX_STEPS,
        message="stopped after 8 steps",
        source="loop",
        context={"max_steps": 8, "nested": {"ok": True}},
        retryable=True,
        resume_from_sequence=5,
    )
    created.usage = Usage(input_tokens=10, output_tokens=5, total_tokens=15)
    created.step_count = 4
    created.tool_call_count = 2
    created.first_sequence = 1
    created.last_sequence = 4
    created.end_time = datetime.now(UTC)
    created.last_event_seq = 17
    await store.set_run_row(created)

    assert await store.get_run(run.id) == created


async def test_a_run_s_end_does_not_move_its_identity_fields(store: StoreRoles) -> None:
    session = await store.new_session()
    run = await store.seed_run(Run(session_id=session.id, agent="default", request_id="r"))

    changed = dataclasses.replace(
        run, agent="other", request_id="x", create_time=datetime(2020, 1, 1, tzinfo=UTC)
    )
    await store.end_run(changed.ended(StopSignal(StopReason.COMPLETED, "", "loop")))
    updated = await store.get_run(run.id)

    assert (updated.agent, updated.request_id, updated.create_time) == (
        run.agent,
        run.request_id,
        run.create_time,
    )


async def test_a_run_on_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.seed_run(Run(session_id="sess_missing", agent="default"))


async def test_get_or_end_a_missing_run_raises_not_found(store: StoreRoles) -> None:
    session = await store.new_session()

    with pytest.raises(NotFoundError):
        await store.get_run("run_missing")
    missing = Run(session_id=session.id, agent="default")
    with pytest.raises(NotFoundError):
        await store.end_run(missing.ended(StopSignal(StopReason.COMPLETED, "", "loop")))


async def test_list_runs_newest_first_in_keyset_pages(store: StoreRoles) -> None:
    session = await store.new_session()
    other = await store.new_session()
    base = datetime(2025, 1, 1, tzinfo=UTC)
    for index, run_id in enumerate(["run_a", "run_b", "run_c", "run_d", "run_e"]):
        await store.seed_run(
            Run(
                id=run_id,
                session_id=session.id,
                agent="default",
                create_time=base + timedelta(seconds=index // 2),
            )
        )
    await store.seed_run(Run(session_id=other.id, agent="default"))

    pages: list[list[str]] = []
    after: tuple[datetime, str] | None = None
    while page := await store.list_runs(session.id, limit=2, after=after):
        pages.append([run.id for run in page])
        after = (page[-1].create_time, page[-1].id)

    assert pages == [["run_e", "run_d"], ["run_c", "run_b"], ["run_a"]]
    assert await store.list_runs(other.id, limit=0) == []


async def test_list_runs_of_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.list_runs("sess_missing", limit=10)


async def test_list_agent_runs_filters_by_tenant_agent_session_status_and_change(
    store: StoreRoles,
) -> None:
    mine = await store.new_session(Session(tenant="acme"))
    other = await store.new_session(Session(tenant="acme"))
    theirs = await store.new_session(Session(tenant="globex"))
    base = datetime(2025, 1, 1, tzinfo=UTC)

    async def seed(
        run_id: str,
        session: Session,
        agent: str,
        second: int,
        status: RunStatus = RunStatus.RUNNING,
        end_time: datetime | None = None,
    ) -> None:
        at = base + timedelta(seconds=second)
        await store.seed_run(
            Run(
                session.id,
                agent,
                id=run_id,
                tenant=session.tenant,
                create_time=at,
                status=status,
                end_time=end_time,
            )
        )

    await seed("run_a", mine, "assistant", 0, status=RunStatus.COMPLETED, end_time=base)
    await seed("run_b", other, "assistant", 1, status=RunStatus.INTERRUPTED)
    await seed("run_c", mine, "assistant", 1, status=RunStatus.FAILED, end_time=base)
    await seed("run_d", mine, "helper", 2)
    await seed("run_e", theirs, "assistant", 3)
    await seed("run_f", other, "assistant", 4)

    async def ids(
        limit: int = 10,
        after: tuple[datetime, str] | None = None,
        session_id: str | None = None,
        statuses: frozenset[RunStatus] = frozenset(),
        changed_since: datetime | None = None,
    ) -> list[str]:
        runs = await store.list_agent_runs(
            "assistant",
            limit,
            after,
            tenant="acme",
            session_id=session_id,
            statuses=statuses,
            changed_since=changed_since,
        )
        return [run.id for run in runs]

    assert await ids() == ["run_f", "run_c", "run_b", "run_a"]
    assert await ids(2, after=(base + timedelta(seconds=1), "run_c")) == ["run_b", "run_a"]
    assert await ids(session_id=mine.id) == ["run_c", "run_a"]
    assert await ids(session_id=theirs.id) == []
    assert await ids(session_id="sess_missing") == []
    failed = frozenset({RunStatus.FAILED, RunStatus.INTERRUPTED})
    assert await ids(statuses=failed) == ["run_c", "run_b"]
    assert await ids(changed_since=base + timedelta(seconds=1)) == ["run_f", "run_b"]
    assert await ids(0) == []
    with pytest.raises(ValueError, match="aware"):
        await ids(changed_since=datetime(2025, 1, 1))


# -- one active run per session ------------------------------------------------------------


async def test_acquire_refuses_a_second_run_naming_the_active_one(store: StoreRoles) -> None:
    session = await store.new_session()
    await store.take_session(session.id, "run_1")

    with pytest.raises(SessionBusyError) as busy:
        await store.take_session(session.id, "run_2")

    assert busy.value.active_run_id == "run_1"
    assert busy.value.session_id == session.id
    assert (await store.get_session(session.id)).active_run_id == "run_1"


async def test_acquire_is_not_reentrant_for_the_holding_run(store: StoreRoles) -> None:
    session = await store.new_session()
    await store.take_session(session.id, "run_1")

    with pytest.raises(SessionBusyError) as busy:
        await store.take_session(session.id, "run_1")

    assert busy.value.active_run_id == "run_1"


async def test_release_by_another_run_is_a_no_op(store: StoreRoles) -> None:
    session = await store.new_session()
    await store.take_session(session.id, "run_1")

    assert await store.release_session(session.id, "run_2") is False

    assert (await store.get_session(session.id)).active_run_id == "run_1"


async def test_release_frees_the_session_for_the_next_run(store: StoreRoles) -> None:
    session = await store.new_session()
    await store.take_session(session.id, "run_1")

    assert await store.release_session(session.id, "run_1") is True
    assert await store.release_session(session.id, "run_1") is False  # not its any more
    await store.take_session(session.id, "run_2")

    assert (await store.get_session(session.id)).active_run_id == "run_2"


async def test_end_run_stores_the_final_state_and_frees_the_session_together(
    store: StoreRoles,
) -> None:
    session = await store.new_session()
    run = await store.seed_run(Run(session_id=session.id, agent="default"))
    await store.take_session(session.id, run.id)
    await store.request_cancel(run.id, StopSignal(StopReason.CANCELLED, "stop", "client"))
    # A segment ending to wait for the client: the request is spent with it.
    run.status = RunStatus.REQUIRES_ACTION
    run.stop_signal = StopSignal(StopReason.REQUIRES_ACTION, "client tools", "model")
    run.usage = Usage(input_tokens=3, output_tokens=2, total_tokens=5)
    run.last_event_seq = 9

    assert await store.end_run(run) == RunEnd(released=True)

    assert await store.get_run(run.id) == run
    assert not (await store.get_session(session.id)).active_run_id
    run.status = RunStatus.RUNNING  # continued: it must not inherit the spent request
    await store.set_run_row(run)
    assert await store.cancel_requests([run.id]) == {}
    assert await store.end_run(run) == RunEnd(released=False)  # no longer its to release


async def test_counts_are_64_bit_on_every_backend(store: StoreRoles) -> None:
    big = 2**62
    session = await store.new_session()
    run = await store.seed_run(Run(session_id=session.id, agent="default"))
    await store.take_session(session.id, run.id)
    step = assistant(session.id)
    step.metrics = StepMetrics(
        input_tokens=big,
        output_tokens=big,
        total_tokens=big,
        cached_input_tokens=big,
        reasoning_tokens=big,
        duration_ms=big,
        first_token_latency_ms=big,
        tool_exec_time_ms=big,
        retries=big,
    )
    (stored,) = await store.append_steps([step], held_by=run.id)
    assert (await store.get_step(session.id, stored.sequence)).metrics == step.metrics
    run.usage = Usage(input_tokens=big, output_tokens=big, total_tokens=big)
    run.last_event_seq = big
    run.status = RunStatus.COMPLETED
    run.stop_signal = StopSignal(StopReason.COMPLETED, "", "model")
    assert await store.end_run(run) == RunEnd(released=True)
    assert await store.get_run(run.id) == run


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("a\x00b", "a\ufffdb"),
        ("lone \ud800 surrogate", "lone \ufffd surrogate"),
        ("\udfff\x00é", "\ufffd\ufffdé"),
        ("plain é ✓", "plain é ✓"),
    ],
)
async def test_text_no_backend_can_hold_is_stored_with_replacement_characters(
    store: StoreRoles, text: str, stored: str
) -> None:
    session = await store.new_session()
    step = Step(
        session.id,
        "run_1",
        Role.TOOL,
        content=text,
        reasoning_content=text,
        name=text,
        tool_call_id=text,
    )
    (written,) = await store.append_steps([step])
    read = await store.get_step(session.id, written.sequence)
    assert (read.content, read.reasoning_content, read.name, read.tool_call_id) == (stored,) * 4


async def test_end_run_of_a_run_that_lost_its_session_keeps_the_new_holder(
    store: StoreRoles,
) -> None:
    session = await store.new_session()
    run = await store.seed_run(Run(session_id=session.id, agent="default"))
    await store.take_session(session.id, "run_newer")
    run.status = RunStatus.INTERRUPTED

    assert await store.end_run(run) == RunEnd(released=False)

    assert (await store.get_run(run.id)).status is RunStatus.INTERRUPTED
    assert (await store.get_session(session.id)).active_run_id == "run_newer"


async def test_end_run_of_a_missing_run_raises_not_found_and_releases_nothing(
    store: StoreRoles,
) -> None:
    session = await store.new_session()
    ghost = Run(session_id=session.id, agent="default")
    await store.take_session(session.id, ghost.id)

    with pytest.raises(NotFoundError):
        await store.end_run(ghost)

    assert (await store.get_session(session.id)).active_run_id == ghost.id


async def test_concurrent_acquires_let_exactly_one_run_in(
    store: StoreRoles, store_url: str
) -> None:
    other = await open_roles(store_url)
    try:
        session = await store.new_session()
        attempts = [
            (store if index % 2 else other).take_session(session.id, f"run_{index}")
            for index in range(10)
        ]

        results = await asyncio.gather(*attempts, return_exceptions=True)

        winners = [i for i, result in enumerate(results) if result is None]
        assert len(winners) == 1
        assert all(isinstance(r, SessionBusyError) for r in results if r is not None)
        holder = (await other.get_session(session.id)).active_run_id
        assert holder == f"run_{winners[0]}"
    finally:
        await other.close()


async def test_acquire_on_a_missing_session_raises_not_found(store: StoreRoles) -> None:
    with pytest.raises(NotFoundError):
        await store.take_session("sess_missing", "run_1")


# -- starting a run in one transaction -----------------------------------------------------


async def test_start_run_on_a_new_session_stores_session_step_and_run_together(
    store: StoreRoles,
) -> None:
    session = Session()
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(run, [user(session.id, run_id=run.id)], new_session=session)

    assert [step.sequence for step in started.steps] == [1]
    assert started.history == started.steps
    assert (started.run.first_sequence, started.run.last_sequence) == (1, 1)
    assert started.run.step_count == 1
    assert (await store.get_session(session.id)).active_run_id == run.id
    assert await store.get_steps(session.id) == started.steps
    stored_run = await store.get_run(run.id)
    assert (stored_run.first_sequence, stored_run.step_count) == (1, 1)


async def test_start_run_on_an_existing_session_takes_it_and_returns_the_whole_history(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 3)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(run, [user(session.id, "next", run_id=run.id)])

    assert [step.sequence for step in started.history] == [1, 2, 3, 4]
    assert started.history[-1] == started.steps[0]
    assert started.run.first_sequence == started.run.last_sequence == 4
    assert (await store.get_session(session.id)).active_run_id == run.id


async def test_start_run_since_a_held_step_reads_only_the_steps_after_it(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 5)
    stored = await store.get_steps(session.id)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(
        run, [user(session.id, "next", run_id=run.id)], since=HistoryMark(3, stored[2].id)
    )

    assert started.history_start == 4
    assert [step.sequence for step in started.history] == [4, 5, 6]
    assert started.history[:2] == [conversation_of(step) for step in stored[3:]]
    assert started.history[-1] == started.steps[0]


async def test_start_run_since_the_last_step_reads_nothing_before_its_own_steps(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 3)
    last = (await store.get_steps(session.id))[-1]
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(
        run, [user(session.id, run_id=run.id)], since=HistoryMark(3, last.id)
    )

    assert started.history_start == 4
    assert started.history == started.steps


async def test_start_run_since_a_step_that_was_cut_and_replaced_reads_the_whole_history(
    store: StoreRoles,
) -> None:
    session, held = await cut_and_replaced(store)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(
        run, [user(session.id, run_id=run.id)], since=HistoryMark(4, held.id)
    )

    assert started.history_start == 1
    assert [step.content for step in started.history[2:]] == ["again", "and again", "hi"]
    assert [step.sequence for step in started.history] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "mark", [HistoryMark(2, "step_unknown"), HistoryMark(7, "x"), HistoryMark(0, "")]
)
async def test_start_run_since_a_mark_that_does_not_hold_reads_the_whole_history(
    store: StoreRoles, mark: HistoryMark
) -> None:
    session = await session_with_steps(store, 3)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(run, [user(session.id, run_id=run.id)], since=mark)

    assert started.history_start == 1
    assert [step.sequence for step in started.history] == [1, 2, 3, 4]


@pytest.mark.parametrize("count", [0, 3, READ_BATCH + 1])
async def test_start_run_without_a_held_history_returns_it_as_get_history_reads_it(
    store: StoreRoles, count: int
) -> None:
    session = await session_with_steps(store, count)
    before = await store.get_history(session.id)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(run, [user(session.id, "next", run_id=run.id)])

    assert started.history_start == 1
    assert started.history == [*before, *started.steps]
    assert [step.sequence for step in started.steps] == [count + 1]
    assert (await store.get_session(session.id)).active_run_id == run.id


def written_between(session_id: str, how: str) -> list[Any]:
    """What another writer commits between a start's history read and its write: a step
    appended at 3, or the step at 2 cut and written again (the log as long as before)."""
    sequence, step_id = (3, "step_appended") if how == "appended" else (2, "step_rewritten")
    written = insert(steps).values(
        id=step_id,
        session_id=session_id,
        sequence=sequence,
        role="user",
        content=how,
        create_time=datetime.now(UTC),
    )
    if how == "appended":
        return [
            written,
            update(sessions).where(sessions.c.id == session_id).values(last_sequence=3),
        ]
    return [delete(steps).where(steps.c.session_id == session_id, steps.c.sequence == 2), written]


@pytest.mark.parametrize("how", ["appended", "rewritten"])
async def test_a_write_between_a_start_s_history_read_and_its_write_is_in_its_history(
    store: StoreRoles, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    session = await session_with_steps(store, 2)
    read = free_history

    def read_then_written(conn: Connection, session_id: str, tenant: str) -> list[Step]:
        history = read(conn, session_id, tenant)
        for statement in written_between(session_id, how):
            conn.execute(statement)  # committed before the start's write begins
        return history

    monkeypatch.setattr("agio_grpc.store.sql.runs.free_history", read_then_written)
    run = Run(session_id=session.id, agent="helper")

    started = await store.start_run(run, [user(session.id, "next", run_id=run.id)])

    logged = await store.get_history(session.id)
    assert started.history_start == 1
    assert started.history == [*logged[:-1], *started.steps]  # the log as it is now
    assert logged[-1].id == started.steps[0].id
    if how == "appended":
        assert [step.content for step in logged[:3]] == ["m1", "m2", "appended"]
    else:
        assert [step.id for step in logged][1] == "step_rewritten"
    assert started.run.first_sequence == started.steps[0].sequence == len(logged)


async def test_a_start_s_history_read_reads_only_a_free_session_of_the_run_s_tenant(
    store: StoreRoles,
) -> None:
    session = await session_with_steps(store, 2)
    held = await session_with_steps(store, 2)
    await store.take_session(held.id, "run_holder")

    async def read(session_id: str, tenant: str = DEFAULT_TENANT) -> list[Step]:
        return await store._database.read_statement(
            lambda conn: free_history(conn, session_id, tenant)
        )

    assert await read(session.id) == await store.get_history(session.id)
    assert await read(session.id, tenant="other") == []  # nothing of another tenant's
    assert await read(held.id) == []  # a held session: the start's transaction decides
    assert await read("sess_missing") == []


async def test_start_run_on_a_busy_session_writes_nothing(store: StoreRoles) -> None:
    session = await session_with_steps(store, 2)
    await store.take_session(session.id, "run_holder")
    run = Run(session_id=session.id, agent="helper")

    with pytest.raises(SessionBusyError):
        await store.start_run(run, [user(session.id, run_id=run.id)])

    assert await sequences(store, session.id) == [1, 2]
    with pytest.raises(NotFoundError):
        await store.get_run(run.id)
    assert (await store.get_session(session.id)).active_run_id == "run_holder"


async def test_start_run_on_a_missing_session_raises_not_found_and_writes_nothing(
    store: StoreRoles,
) -> None:
    run = Run(session_id="sess_missing", agent="helper")

    with pytest.raises(NotFoundError):
        await store.start_run(run, [user("sess_missing", run_id=run.id)])

    with pytest.raises(NotFoundError):
        await store.get_run(run.id)


async def test_start_run_with_a_taken_new_session_id_writes_nothing(store: StoreRoles) -> None:
    existing = await store.new_session()
    run = Run(session_id=existing.id, agent="helper")

    with pytest.raises(StoreError):
        await store.start_run(
            run, [user(existing.id, run_id=run.id)], new_session=Session(id=existing.id)
        )

    assert await sequences(store, existing.id) == []
    assert (await store.get_session(existing.id)).active_run_id == ""


# -- time, schema, connections -------------------------------------------------------------


async def test_timestamps_are_aware_utc(store: StoreRoles) -> None:
    elsewhere = timezone(timedelta(hours=5, minutes=30))
    moment = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=elsewhere)
    session = await store.new_session(Session(create_time=moment, update_time=moment))
    await store.append_one(user(session.id))
    await store.seed_run(Run(session_id=session.id, agent="a", create_time=moment, end_time=moment))

    loaded = await store.get_session(session.id)
    step = await store.get_step(session.id, 1)
    run = (await store.list_runs(session.id, limit=1))[0]

    assert loaded.create_time == moment
    assert loaded.create_time.tzinfo == UTC
    assert is_aware_utc(loaded.update_time)
    assert is_aware_utc(step.create_time)
    assert run.create_time == moment
    assert run.create_time.tzinfo == UTC
    assert run.end_time is not None
    assert run.end_time.tzinfo == UTC


async def test_naive_datetimes_are_refused(store: StoreRoles) -> None:
    naive = datetime(2025, 1, 1)

    with pytest.raises(ValueError, match="timezone-aware"):
        await store.new_session(Session(create_time=naive))
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.list_sessions(limit=1, after=(naive, "sess_x"))


async def test_opening_the_store_twice_on_one_database_is_idempotent(
    store: StoreRoles, store_url: str
) -> None:
    session = await session_with_steps(store, 2)

    again = await open_roles(store_url)
    try:
        assert await again.step_count(session.id) == 2
        assert (await again.append_one(user(session.id))).sequence == 3
    finally:
        await again.close()


async def test_schema_matches_the_table_definitions(store: StoreRoles, store_url: str) -> None:
    def differences(conn: Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        assert context.get_current_revision() == head_revision()
        return list(compare_metadata(context, metadata))

    engine = create_async_engine(store_url)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(differences)
            names = set((await conn.execute(select(sessions.c.id))).scalars())
    finally:
        await engine.dispose()

    assert diff == []
    assert names == set()


async def test_a_database_at_head_opens_without_running_alembic(
    store: StoreRoles, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def upgrade(*args: object, **kwargs: object) -> None:
        raise AssertionError("Alembic ran on a database at head")

    monkeypatch.setattr(alembic.command, "upgrade", upgrade)
    again = await open_roles(store_url)
    await again.close()


async def test_a_schema_newer_than_this_version_is_refused_and_left_as_it_is(
    store: StoreRoles, store_url: str
) -> None:
    session = await session_with_steps(store, 1)
    await set_version(store_url, "0099_from_a_newer_release")

    with pytest.raises(SchemaTooNewError) as refused:
        await open_roles(store_url)

    assert refused.value.revisions == ("0099_from_a_newer_release",)
    assert refused.value.head == head_revision()
    assert "a newer version migrated it" in str(refused.value)
    assert await versions_of(store_url) == ["0099_from_a_newer_release"]
    assert await store.step_count(session.id) == 1


async def test_a_closed_store_refuses_reads_and_writes_and_writes_nothing(
    store: StoreRoles, store_url: str
) -> None:
    session = await session_with_steps(store, 1)
    closed = await open_roles(store_url)
    await closed.close()

    # A brief write (a step), a transaction on the writer (a session) and a read.
    with pytest.raises(StoreUnavailableError, match="the store is closed"):
        await closed.append_steps([user(session.id)])
    with pytest.raises(StoreUnavailableError, match="the store is closed"):
        await closed.new_session()
    with pytest.raises(StoreUnavailableError, match="the store is closed"):
        await closed.get_session(session.id)

    assert await store.step_count(session.id) == 1
    assert [each.id for each in await store.list_sessions(limit=10)] == [session.id]
    await closed.close()  # a second close is harmless


async def test_unreachable_postgres_raises_store_unavailable() -> None:
    closed_port = free_local_port()

    with pytest.raises(StoreUnavailableError):
        await open_roles(f"postgresql+asyncpg://agio@127.0.0.1:{closed_port}/agio")


async def test_unopenable_sqlite_file_raises_store_unavailable(tmp_path: object) -> None:
    with pytest.raises(StoreUnavailableError):
        await open_roles(f"sqlite+aiosqlite:///{tmp_path}/missing-dir/agio.db")


@pytest.mark.parametrize(
    "url",
    ["mysql+aiomysql://u@127.0.0.1/db", "sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"],
)
async def test_open_store_refuses_unsupported_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"SQLite file|unsupported"):
        await open_roles(url)


def test_the_store_knows_every_field_of_the_domain_types() -> None:
    # A field added to the domain needs a column and a migration, or it is silently lost.
    assert {f.name for f in dataclasses.fields(Step)} == {
        "id", "session_id", "run_id", "sequence", "role", "content", "reasoning_content",
        "tool_calls", "tool_call_id", "name", "is_error", "metrics", "create_time",
        "trace_id", "span_id", "summary_first_sequence", "summary_last_sequence", "approval",
    }  # fmt: skip
    assert {f.name for f in dataclasses.fields(StepMetrics)} <= set(steps.c.keys())
    assert {f.name for f in dataclasses.fields(Run)} - {"usage"} <= set(runs.c.keys())
    assert {f.name for f in dataclasses.fields(Session)} == {
        "id", "parent_session_id", "fork_sequence", "create_time", "update_time",
        "step_count", "active_run_id", "tenant",
    }  # fmt: skip


async def test_a_server_secret_is_made_once_and_shared_by_every_store(
    store: StoreRoles, store_url: str
) -> None:
    other = await open_roles(store_url)
    try:
        first, second = await asyncio.gather(
            store.server_secret("page_tokens"), other.server_secret("page_tokens")
        )
        assert first == second
        assert len(first) == 32
        assert await store.server_secret("page_tokens") == first
        assert await other.server_secret("another") != first
    finally:
        await other.close()


async def test_appending_to_an_idle_session_needs_it_idle_unchanged_and_the_callers(
    store: StoreRoles,
) -> None:
    # CompactSession's write: refused, with nothing written, for a held session, a log that
    # moved on since it was read, or another tenant's session.
    session = await session_with_steps(store, 2)
    last = await store.last_step(session.id)
    assert last is not None
    mark = HistoryMark(last.sequence, last.id)
    summary = Step(session.id, "", Role.SUMMARY, content="s", summary_first_sequence=1,
                   summary_last_sequence=1)  # fmt: skip

    await store.take_session(session.id, "run_holding")
    with pytest.raises(SessionBusyError):
        await store.append_to_idle_session(summary, after=mark)
    await store.release_session(session.id, "run_holding")
    with pytest.raises(NotFoundError):
        await store.append_to_idle_session(summary, after=mark, tenant="another")
    with pytest.raises(HistoryChangedError):
        await store.append_to_idle_session(summary, after=HistoryMark(1, last.id))
    assert await sequences(store, session.id) == [1, 2]

    stored = await store.append_to_idle_session(summary, after=mark, tenant=session.tenant)
    assert (stored.sequence, stored.summary_last_sequence) == (3, 1)
    assert (await store.get_session(session.id)).active_run_id == ""  # let go again
    with pytest.raises(HistoryChangedError):  # the mark is no longer the log's end
        await store.append_to_idle_session(summary, after=mark)
