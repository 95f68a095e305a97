"""The run event journal's write cost per run.

A run of the shape B1 measures writes three transactions: its start (the session, the user
step, the run), its reply, its end. With the journal each also stores the events it
announces (`run_started` and the input's `step_completed`; the reply's `step_completed`; the
terminal event). This times the three transactions of a run with their journal records and
without, the two alternated run by run in one process on one store, after a warm-up; it
prints the p50 of each and their difference.

    python -m bench.journal [--url URL] [--runs 500]   # default: a temporary SQLite file
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from agio_grpc.domain import Role, Run, Session, Step, StopReason, StopSignal
from agio_grpc.engine.channel import Announce, RunChannel
from agio_grpc.engine.lifecycle import closed, completed, opened
from agio_grpc.store.records import Journal
from agio_grpc.store.sql import SqlStore, open_store

WARM_UP = 50


async def one_run(store: SqlStore, journaled: bool) -> float:
    """A run's three writes, in ms: with its journal records or without."""
    session = Session()
    run = Run(session_id=session.id, agent="assistant")
    channel = RunChannel(run.id, session.id)

    def journal(announce: Announce) -> Journal | None:
        return channel.journal_for(announce) if journaled else None

    began = time.perf_counter()
    started = await store.ledger.start_run(
        run,
        [Step(session.id, run.id, Role.USER, content="What is 12 * 7?")],
        new_session=session,
        journal=journal(opened),
    )
    channel.publish_journaled()
    reply = Step(session.id, run.id, Role.ASSISTANT, content="The result is 84.")
    await store.log.append_steps([reply], held_by=run.id, journal=journal(completed))
    channel.publish_journaled()
    ended = started.run.ended(StopSignal(StopReason.COMPLETED))
    ended.last_event_seq = channel.last_seq + 1
    await store.ledger.end_run(ended, journal=journal(closed))
    return (time.perf_counter() - began) * 1000


async def measure(url: str, runs: int) -> tuple[float, float]:
    """p50 ms of a run's writes (with the journal, without)."""
    store = await open_store(url)
    try:
        for _ in range(WARM_UP):
            await one_run(store, True)
            await one_run(store, False)
        with_journal, without = [], []
        for _ in range(runs):
            with_journal.append(await one_run(store, True))
            without.append(await one_run(store, False))
    finally:
        await store.close()
    return statistics.median(with_journal), statistics.median(without)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="", help="a database URL (default: temporary SQLite)")
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    url = args.url or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/journal.db"
    with_journal, without = asyncio.run(measure(url, args.runs))
    print("| backend | runs | writes p50, journal | writes p50, none | journal cost |")
    print("|---|---|---|---|---|")
    print(
        f"| {url.split('+')[0].split(':')[0]} | {args.runs} | {with_journal:.3f} ms | "
        f"{without:.3f} ms | {with_journal - without:+.3f} ms |"
    )


if __name__ == "__main__":
    main()
