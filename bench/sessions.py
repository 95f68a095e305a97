"""Sessions of a given size for the store benchmarks, stored as the service stores them: a
run's start on a new session with the first thousand steps, the rest appended by that run
in batches of a thousand, then the run's end."""

from __future__ import annotations

from collections.abc import Callable

from agio_grpc.domain import Run, Session, Step, StopReason, StopSignal
from agio_grpc.store.sql import SqlStore

BATCH = 1000


async def stored_session(store: SqlStore, steps_of: Callable[[str], list[Step]]) -> str:
    """The id of a new session holding `steps_of(its id)` (at least one step)."""
    session = Session()
    run = Run(session_id=session.id, agent="bench")
    steps = steps_of(session.id)
    started = await store.ledger.start_run(run, steps[:BATCH], new_session=session)
    for start in range(BATCH, len(steps), BATCH):
        await store.log.append_steps(steps[start : start + BATCH], held_by=run.id)
    await store.ledger.end_run(started.run.ended(StopSignal(StopReason.COMPLETED)))
    return session.id
