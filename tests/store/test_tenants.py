"""Tenants in the store, on a SQLite file and on PostgreSQL: every lookup a caller makes
finds only its tenant's sessions and runs (another tenant's answers exactly as a missing
one, busy or not, and is left as it was), what a tenant makes is its own, and the quotas of
`TenantQuotas` hold across concurrent starts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from agio_grpc.domain import (
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
    StopSignal,
    ToolCall,
    new_id,
    utc_now,
)
from agio_grpc.store import NotFoundError, StoreError, TenantQuotaError, TenantQuotas
from agio_grpc.store.records import HistoryMark, JournalRecord, QueueRequest, RunStart
from tests.roles import StoreRoles, open_roles

A = "tenant-a"
B = "tenant-b"
DONE = StopSignal(StopReason.COMPLETED, "done", "model")


def user(session_id: str, run_id: str, text: str = "hi") -> Step:
    return Step(session_id=session_id, run_id=run_id, role=Role.USER, content=text)


async def start(
    store: StoreRoles,
    tenant: str,
    session_id: str = "",
    queue: QueueRequest | None = None,
) -> RunStart:
    """A run of `tenant`'s started on `session_id` (a new session of its own when "")."""
    fresh = None if session_id else Session(tenant=tenant)
    run = Run(fresh.id if fresh else session_id, "assistant", tenant=tenant)
    steps = [user(run.session_id, run.id)]
    return await store.start_run(run, steps, new_session=fresh, queue=queue)


async def conversation(store: StoreRoles, tenant: str) -> Run:
    """A session of `tenant`'s with a user step and a reply, by a run that completed."""
    started = await start(store, tenant)
    run = started.run
    reply = Step(run.session_id, run.id, Role.ASSISTANT, content="hello")
    await store.append_steps([reply], held_by=run.id)
    await store.end_run(run.ended(DONE))
    return await store.get_run(run.id)


def refusal(error: BaseException, key: str) -> tuple[object, ...]:
    """What a caller learns from a refusal, with the id it named left out."""
    assert isinstance(error, StoreError)
    kind = getattr(error, "kind", "")
    return type(error), kind, str(error).replace(key, "<id>")


async def refused(call: Awaitable[Any]) -> BaseException:
    with pytest.raises(StoreError) as caught:
        await call
    return caught.value


Lookup = Callable[[StoreRoles, str, str], Awaitable[Any]]

SESSION_LOOKUPS: dict[str, Lookup] = {
    "get_session": lambda s, sid, t: s.get_session(sid, tenant=t),
    "get_steps": lambda s, sid, t: s.get_steps(sid, tenant=t),
    "get_step": lambda s, sid, t: s.get_step(sid, 1, tenant=t),
    "get_history_since": lambda s, sid, t: s.get_history_since(sid, None, tenant=t),
    "context_summary": lambda s, sid, t: s.context_summary(sid, tenant=t),
    "list_runs": lambda s, sid, t: s.list_runs(sid, 10, tenant=t),
    "fork_session": lambda s, sid, t: s.fork_session(sid, 1, tenant=t),
    "delete_steps_from": lambda s, sid, t: s.delete_steps_from(sid, 1, tenant=t),
    "delete_session": lambda s, sid, t: s.delete_session(sid, tenant=t),
}


@pytest.mark.parametrize("lookup", list(SESSION_LOOKUPS))
async def test_another_tenants_session_answers_as_a_missing_one_and_stays_as_it_was(
    store: StoreRoles, lookup: str
) -> None:
    run = await conversation(store, A)
    session_id = run.session_id
    before = (await store.get_session(session_id), await store.get_steps(session_id))
    made_up = new_id("sess")
    call = SESSION_LOOKUPS[lookup]

    theirs = await refused(call(store, session_id, B))
    missing = await refused(call(store, made_up, B))

    assert isinstance(theirs, NotFoundError)
    assert refusal(theirs, session_id) == refusal(missing, made_up)
    assert (await store.get_session(session_id), await store.get_steps(session_id)) == before
    assert await store.list_sessions(10, tenant=B) == []  # a refused fork made nothing
    await call(store, session_id, A)  # its own tenant's call goes through


async def test_another_tenants_run_answers_as_a_missing_one(store: StoreRoles) -> None:
    run = await conversation(store, A)
    made_up = new_id("run")

    theirs = await refused(store.get_run(run.id, tenant=B))
    missing = await refused(store.get_run(made_up, tenant=B))

    assert refusal(theirs, run.id) == refusal(missing, made_up)
    assert await store.get_run(run.id, tenant=A) == run
    assert await store.get_run(run.id) == run  # the engine's own read: any tenant


async def test_a_busy_session_of_another_tenant_is_missing_not_busy(store: StoreRoles) -> None:
    running = (await start(store, A)).run  # holds its session
    session_id = running.session_id
    made_up = new_id("sess")
    other = Run(session_id, "assistant", tenant=B)
    invented = Run(made_up, "assistant", tenant=B)
    enqueue = QueueRequest(max_queued=10)
    writes: list[tuple[Callable[[str, Run], Awaitable[Any]], str]] = [
        (lambda sid, _: store.delete_session(sid, tenant=B), "delete_session"),
        (lambda sid, _: store.delete_steps_from(sid, 1, tenant=B), "delete_steps_from"),
        (lambda sid, run: store.start_run(run, [user(sid, run.id)]), "start_run"),
        (
            lambda sid, run: store.start_run(run, [user(sid, run.id)], queue=enqueue),
            "start_run, queued",
        ),
        (lambda _, run: store.restart_run(run, 1), "restart_run"),
        (lambda _, run: store.seed_run(run), "seed_run"),
    ]
    for write, name in writes:
        theirs = await refused(write(session_id, other))
        missing = await refused(write(made_up, invented))
        assert isinstance(theirs, NotFoundError), name
        assert refusal(theirs, session_id) == refusal(missing, made_up), name

    assert (await store.get_session(session_id)).active_run_id == running.id
    assert await store.list_runs(session_id, 10) == [await store.get_run(running.id)]
    assert [step.content for step in await store.get_steps(session_id)] == ["hi"]


async def test_lists_show_only_the_tenants_own_rows(store: StoreRoles) -> None:
    theirs = [await conversation(store, A) for _ in range(3)]
    mine = [await conversation(store, B) for _ in range(2)]

    pages: list[list[str]] = []
    after = None
    while page := await store.list_sessions(2, after, tenant=A):
        pages.append([session.id for session in page])
        after = (page[-1].create_time, page[-1].id)

    assert sorted(sid for page in pages for sid in page) == sorted(r.session_id for r in theirs)
    assert [len(page) for page in pages] == [2, 1]
    listed = await store.list_sessions(10, tenant=B)
    assert {session.id for session in listed} == {run.session_id for run in mine}
    assert await store.list_sessions(10, tenant="tenant-c") == []
    assert len(await store.list_sessions(10)) == 5  # any tenant's: the engine's own
    assert await store.list_runs(mine[0].session_id, 10, tenant=B) == [mine[0]]


async def test_what_a_tenant_makes_is_its_own(store: StoreRoles) -> None:
    fresh = Session(tenant=A)
    started = Run(fresh.id, "assistant", tenant=A)

    def journal(run: Run | None, steps: Sequence[Step]) -> list[JournalRecord]:
        return [JournalRecord(1, utc_now(), "run_started", run=run)]

    await store.start_run(started, [user(fresh.id, started.id)], new_session=fresh, journal=journal)
    run = await store.get_run(started.id, tenant=A)
    session = await store.get_session(run.session_id, tenant=A)
    fork = await store.fork_session(session.id, 1, tenant=A)
    made = await store.new_session(Session(tenant=B))

    assert (session.tenant, run.tenant) == (A, A)
    assert (await store.get_session(fork.id, tenant=A)).tenant == A
    assert fork.tenant == A  # the parent's
    assert (await store.get_session(made.id, tenant=B)).tenant == B
    (record,) = await store.read_journal(run.id)
    assert record.run is not None
    assert record.run.tenant == A


async def test_a_new_session_must_be_its_runs_tenants(store: StoreRoles) -> None:
    fresh = Session(tenant=A)
    run = Run(fresh.id, "assistant", tenant=B)

    with pytest.raises(ValueError, match="tenant"):
        await store.start_run(run, [user(fresh.id, run.id)], new_session=fresh)


async def test_a_request_id_is_looked_up_on_the_tenants_own_session_only(
    store: StoreRoles,
) -> None:
    theirs = (await start(store, A)).run
    await store.end_run(theirs.ended(DONE))
    used = Run(theirs.session_id, "assistant", tenant=A, request_id="req-1")
    await store.start_run(used, [user(used.session_id, used.id)])
    await store.end_run(used.ended(DONE))
    mine = await conversation(store, B)

    reused = Run(theirs.session_id, "assistant", tenant=B, request_id="req-1")
    error = await refused(store.start_run(reused, [user(reused.session_id, reused.id)]))
    again = Run(mine.session_id, "assistant", tenant=B, request_id="req-1")
    started = await store.start_run(again, [user(again.session_id, again.id)])

    assert isinstance(error, NotFoundError)  # not DUPLICATE_REQUEST naming the tenant's run
    assert started.run.request_id == "req-1"


# -- quotas -------------------------------------------------------------------------------


@pytest.fixture
async def quota_store(store_url: str) -> AsyncIterator[StoreRoles]:
    """A store where each tenant may run one run at a time and queue one."""
    opened = await open_roles(store_url, quotas=TenantQuotas(max_running_runs=1, max_queued_runs=1))
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_tenant_at_its_running_quota_starts_no_other_run_until_one_ends(
    quota_store: StoreRoles,
) -> None:
    store = quota_store
    done = await conversation(store, A)  # ended: not counted
    running = (await start(store, A)).run

    fresh = await refused(start(store, A))
    existing = await refused(start(store, A, done.session_id))
    restart = Run(done.session_id, "assistant", tenant=A)
    last = (await store.get_steps(done.session_id))[-1]
    retried = await refused(store.restart_run(restart, 2, expect=HistoryMark(2, last.id)))
    other = await start(store, B)  # another tenant's quota is its own

    for error in (fresh, existing, retried):
        assert isinstance(error, TenantQuotaError)
        assert (error.tenant, error.status, error.limit) == (A, "RUNNING", 1)
    assert len(await store.list_sessions(10, tenant=A)) == 2  # the refused start made none
    assert [step.content for step in await store.get_steps(done.session_id)] == ["hi", "hello"]
    assert other.run.status is RunStatus.RUNNING
    await store.end_run(running.ended(DONE))
    assert (await start(store, A, done.session_id)).run.status is RunStatus.RUNNING


async def test_a_continuation_counts_against_the_running_quota(
    quota_store: StoreRoles,
) -> None:
    store = quota_store
    waiting = (await start(store, A)).run
    call = Step(
        waiting.session_id,
        waiting.id,
        Role.ASSISTANT,
        tool_calls=[ToolCall("call_1", "lookup", "{}")],
    )
    stored = await store.append_steps([call], held_by=waiting.id)
    wait = StopSignal(StopReason.REQUIRES_ACTION, "client tools", "loop")
    await store.end_run(waiting.ended(wait))
    running = (await start(store, A)).run
    output = Step(waiting.session_id, waiting.id, Role.TOOL, content="42", tool_call_id="call_1")
    expect = HistoryMark(stored[-1].sequence, stored[-1].id)

    error = await refused(
        store.continue_run(await store.get_run(waiting.id), [output], expect=expect)
    )

    assert isinstance(error, TenantQuotaError)
    assert (await store.get_run(waiting.id)).status is RunStatus.REQUIRES_ACTION
    await store.end_run(running.ended(DONE))
    continued = await store.continue_run(await store.get_run(waiting.id), [output], expect=expect)
    assert continued.run.status is RunStatus.RUNNING


async def test_a_tenant_at_its_queued_quota_queues_no_other_run(
    quota_store: StoreRoles,
) -> None:
    store = quota_store
    enqueue = QueueRequest(max_queued=10)
    first = (await start(store, A)).run
    queued = await start(store, A, first.session_id, queue=enqueue)
    await store.end_run(first.ended(DONE))  # the session's queue waits; nothing runs
    busy = (await start(store, A)).run

    error = await refused(start(store, A, busy.session_id, queue=enqueue))
    theirs = await start(store, B, (await start(store, B)).run.session_id, queue=enqueue)

    assert queued.run.status is RunStatus.QUEUED
    assert isinstance(error, TenantQuotaError)
    assert (error.status, error.limit) == ("QUEUED", 1)
    assert theirs.run.status is RunStatus.QUEUED
    assert await store.list_runs(busy.session_id, 10) == [await store.get_run(busy.id)]


async def test_concurrent_starts_never_pass_the_running_quota(store_url: str) -> None:
    """Starts on different sessions at once (each store its own connections, as replicas):
    each counts what the ones before it committed."""
    stores = [
        await open_roles(store_url, quotas=TenantQuotas(max_running_runs=2)) for _ in range(4)
    ]
    try:
        outcomes = await asyncio.gather(
            *(start(stores[index % 4], A) for index in range(12)), return_exceptions=True
        )
    finally:
        for opened in stores:
            await opened.close()

    started = [outcome for outcome in outcomes if isinstance(outcome, RunStart)]
    refusals = [outcome for outcome in outcomes if isinstance(outcome, TenantQuotaError)]
    assert (len(started), len(refusals)) == (2, 10)
