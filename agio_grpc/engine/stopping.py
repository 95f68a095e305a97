"""`RunStops`: stopping a run wherever it is (`Runtime.stop`, and a queued run's caller at
its deadline).

A run live here stops with it (engine/live.py: its control asked, its end waited for); one
another process runs gets a cancel request on its row (the lease keeper's
`cancel_elsewhere`), or is ended INTERRUPTED when its process died; a run waiting for its
client or queued is ended by the lifecycle (`end_idle`), a waiting one on the log as this
process last saw it, checked by the write. A run that started or went on between the look
and the end is looked at again, for up to the wait. Never imports grpc; storage only
through the store's roles and the lifecycle.
"""

from __future__ import annotations

import asyncio

from agio_grpc.domain import Run, RunStatus, Step, StopSignal
from agio_grpc.engine.history import HistoryCache
from agio_grpc.engine.leases import LeaseKeeper
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.engine.live import LiveRuns
from agio_grpc.store import HistoryChangedError, SessionBusyError
from agio_grpc.store.log import SessionLog
from agio_grpc.store.runs import RunRecords

_CANCEL_AGAIN_S = 0.01  # how soon a cancel looks again at a run that was just continued


class RunStops:
    """Stops runs, here or elsewhere, running, waiting or queued (module docstring)."""

    def __init__(
        self,
        log: SessionLog,
        runs: RunRecords,
        live: LiveRuns,
        lifecycle: Lifecycle,
        histories: HistoryCache,
        keeper: LeaseKeeper | None,
        wait_s: float,
    ) -> None:
        """`wait_s`: how long a stop waits for the run's end (`cancel_wait_s`)."""
        self._log = log
        self._runs = runs
        self._live = live
        self._lifecycle = lifecycle
        self._histories = histories
        self._keeper = keeper
        self._wait_s = wait_s

    async def stop(self, run_id: str, signal: StopSignal, *, tenant: str | None = None) -> Run:
        """Stop a run with `signal`; idempotent. Returns the run as stored afterwards (see
        `Runtime.stop`). Raises NotFoundError, also for another `tenant`'s run."""
        wait_s = self._wait_s
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            if await self._live.stop(run_id, signal, wait_s, tenant=tenant):
                return await self._runs.get_run(run_id)
            run = await self._runs.get_run(run_id, tenant=tenant)
            if run.status is RunStatus.RUNNING and self._keeper is not None:
                run = await self._keeper.cancel_elsewhere(run, signal, wait_s)
            if run.status not in (RunStatus.REQUIRES_ACTION, RunStatus.QUEUED):
                return run
            try:
                if ended := await self._end_idle(run, signal):
                    return ended
            except (SessionBusyError, HistoryChangedError):
                pass  # a submit is continuing it right now: cancel what it runs
            if asyncio.get_running_loop().time() >= deadline:
                return run
            await asyncio.sleep(_CANCEL_AGAIN_S)  # it started or went on just now: again

    async def _end_idle(self, run: Run, signal: StopSignal) -> Run | None:
        async def end(history: list[Step] | None, _: int = 0) -> Run | None:
            ended = await self._lifecycle.end_idle(run, signal, history)
            if ended is not None and history is not None:  # the log, checked by the write
                self._histories.remember(
                    run.session_id, [*history, *ended.steps], tenant=run.tenant
                )
            return ended.run if ended is not None else None

        waits = run.status is RunStatus.REQUIRES_ACTION
        return await (
            self._histories.decide(self._log, run.session_id, end) if waits else end(None)
        )
