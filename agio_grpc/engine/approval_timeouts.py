"""`ApprovalTimeouts`: the server's rejection of calls that waited for approval too long.

A run whose calls wait for approval under an agent's `approval_timeout_s` stores when the
wait ends (`runs.approval_deadline`, from its stop signal). Every process sweeps for runs
past it: at the earliest deadline it read, and at least every `approval_poll_s` (a wait
another member started, or one that began after the last read). Each one is answered as
the run's own SubmitToolOutputs would be, by the server (`Answers.timed_out`): one member
wins the transition, the others find the run no longer waiting and leave it. A restart
loses nothing: the deadline is in the store.

Never imports grpc or the store; reads the deadlines through the lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from agio_grpc.domain import Run, utc_now
from agio_grpc.engine.errors import EngineError
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.store.errors import StoreError

logger = logging.getLogger(__name__)


class ApprovalTimeouts:
    """Times out the approval waits past their deadline, wherever they started."""

    def __init__(
        self, lifecycle: Lifecycle, expire: Callable[[Run], Awaitable[None]], poll_s: float
    ) -> None:
        """`expire` answers one run's wait as the server (`Runtime`'s timed-out submit)."""
        self._lifecycle = lifecycle
        self._expire = expire
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._sweep(), name="agio approval timeouts")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sweep(self) -> None:
        while True:
            try:
                await self.expire_due()
                pause = await self._pause()
            except StoreError as error:  # the store is down: try again later
                logger.warning("approval timeouts: %s", type(error).__name__)
                pause = self._poll_s
            except Exception:  # a sweep that stopped would leave every wait undecided
                logger.exception("approval timeouts: the sweep failed; trying again")
                pause = self._poll_s
            await asyncio.sleep(pause)

    async def expire_due(self) -> int:
        """Answer every wait past its deadline now; how many this process answered."""
        answered = 0
        for run in await self._lifecycle.runs_past_approval_deadline(utc_now()):
            try:
                await self._expire(run)
            except (EngineError, StoreError) as error:
                # Decided, cancelled or timed out by another member meanwhile.
                logger.info("run %s: approval timeout not applied: %s", run.id, error)
                continue
            answered += 1
        return answered

    async def _pause(self) -> float:
        deadline = await self._lifecycle.next_approval_deadline()
        left = None if deadline is None else (deadline - utc_now()).total_seconds()
        # One still past its deadline could not be answered just now: tried at the next poll.
        if left is None or left <= 0:
            return self._poll_s
        return min(self._poll_s, left)
