"""`LeaseKeeper`: this process's side of the session leases shared with other replicas.

The store holds each session for its run under a lease (store/leases.py). One task
renews the leases of every run live in this process (engine/live.py) every third of the
lease, so a session outlives a crashed process by at most one lease; a run whose lease was
found taken over (this process stalled past it) is stopped as INTERRUPTED. After each
renewal it looks for the queues a crash left with no one to start them (a session free, a
run queued on it), and frees their sessions here (`LiveRuns.session_freed`). Another task
polls for cancel requests other replicas recorded for the runs live here.
`cancel_elsewhere` is the other direction: a CancelRun here for a run another process
runs; the owner is told through `RemoteRuns` (engine/remote.py), so that it acts on the
request at once instead of at its next poll. Never imports grpc.
"""

from __future__ import annotations

import asyncio
import logging

from agio_grpc.domain import Run, StopSignal
from agio_grpc.engine.lifecycle import Lifecycle, lease_lost
from agio_grpc.engine.live import LiveRuns
from agio_grpc.engine.remote import RemoteRuns
from agio_grpc.store.errors import StoreError
from agio_grpc.store.leases import SessionLeases
from agio_grpc.store.log import SessionLog
from agio_grpc.store.runs import RunRecords

logger = logging.getLogger(__name__)

_CANCEL_WAIT_POLL_S = 0.1  # how often a cancel for a run elsewhere rereads the run


class LeaseKeeper:
    """Renews the leases of live runs and passes cancel requests between replicas."""

    def __init__(
        self,
        leases: SessionLeases,
        log: SessionLog,
        runs: RunRecords,
        lifecycle: Lifecycle,
        live: LiveRuns,
        cancel_poll_s: float,
        remote: RemoteRuns | None = None,
    ) -> None:
        self.leases = leases
        self._log = log
        self._runs = runs
        self._lifecycle = lifecycle
        self._live = live
        self._cancel_poll_s = cancel_poll_s
        self._remote = remote
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the renewal and cancel-request tasks, once (they need a running loop)."""
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._renew_forever(), name="agio session lease renewal"),
            asyncio.create_task(self._watch_cancel_requests(), name="agio cancel requests"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def cancel_elsewhere(self, run: Run, signal: StopSignal, wait_s: float) -> Run:
        """Stop a run another process runs: a run whose process died (its lease expired, or
        it let go of the session without storing the run's end) is ended INTERRUPTED, as a
        take-over would end it; else a cancel request is recorded for that process, and this
        waits up to `wait_s` for the run to end and let go of its session, as a local cancel
        does. Returns the run as last read."""
        if await self._lifecycle.interrupt_abandoned(run.id):
            return await self._runs.get_run(run.id)
        logger.info("run %s runs elsewhere: cancel requested", run.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        # Asked again at every look: the run may have waited for its client (which spends
        # a request) and been continued since.
        tell = self._remote
        while await self.leases.request_cancel(run.id, signal.copied()):
            if tell is not None:  # once the request stands: acted on now, not at a poll
                await tell.tell_owner(run.id, max(deadline - loop.time(), 0.0))
                tell = None
                continue
            if loop.time() >= deadline:
                return await self._runs.get_run(run.id)
            await asyncio.sleep(_CANCEL_WAIT_POLL_S)
        while (await self._log.get_session(run.session_id)).active_run_id == run.id:
            if loop.time() >= deadline:
                break
            await asyncio.sleep(_CANCEL_WAIT_POLL_S)
        return await self._runs.get_run(run.id)

    async def _renew_forever(self) -> None:
        # A third of the lease: a renewal may fail (or be slow) twice before the lease ends.
        interval = self.leases.session_lease_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._renew()
                for session_id in await self._runs.ready_queues():
                    self._live.session_freed(session_id)
            except StoreError as error:
                logger.warning("could not renew session leases (will retry): %s", error)
            except Exception:
                logger.exception("could not renew session leases (will retry)")

    async def _renew(self) -> None:
        live = dict(self._live.controls())
        if not live:
            return
        renewed = await self.leases.renew_leases(
            {session_id: run_id for run_id, (session_id, _) in live.items()}
        )
        for run_id, (session_id, control) in live.items():
            if session_id in renewed or control.finishing:  # a finishing run released it
                continue
            # Taken over after this process stalled past the lease: no longer ours.
            logger.warning("run %s lost its lease on session %s", run_id, session_id)
            control.request_stop(lease_lost())

    async def _watch_cancel_requests(self) -> None:
        """Stop live runs here that another replica was asked to cancel."""
        failing = False
        while True:
            await asyncio.sleep(self._cancel_poll_s)
            try:
                live = dict(self._live.controls())
                requests = await self.leases.cancel_requests(live.keys()) if live else {}
                for run_id, signal in requests.items():
                    control = live[run_id][1]
                    if control.signal is None:  # not already on its way out
                        logger.info("run %s: cancel requested through another replica", run_id)
                        control.request_stop(signal)
            except Exception as error:
                if not failing:  # once per outage, not every poll
                    logger.warning("could not act on cancel requests (will retry): %s", error)
                failing = True
            else:
                failing = False
