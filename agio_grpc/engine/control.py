"""`RunControl`: how a running loop is stopped from outside (cancel, timeout, shutdown).

A stop request records a StopSignal (the strongest by priority wins) and interrupts the loop
task with `Task.cancel()` — but never inside a protected section (a store write), so a step
is either stored or not, never half-written. A request that arrives during a protected
section is delivered as `StopRequested` when the section ends; one that arrives before the
loop starts is seen by the loop's first check. The loop turns either into its stop signal at
its one boundary. Never imports grpc or the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from agio_grpc.domain import StopSignal, pick_stop_signal


class StopRequested(Exception):  # noqa: N818 - a signal, not an error
    """Raised in the loop when a stop request is pending at a safe point."""


class RunControl:
    """Stop requests for one run segment's loop task."""

    def __init__(self) -> None:
        self.signal: StopSignal | None = None
        self._task: asyncio.Task[object] | None = None
        self._protected = 0
        self._delivered = False

    @property
    def delivered(self) -> bool:
        """Whether the loop has been interrupted for the pending request."""
        return self._delivered

    @property
    def finishing(self) -> bool:
        """Whether the loop is finishing (or finished): stop requests change nothing now."""
        return self._delivered and self._task is None

    def start(self, task: asyncio.Task[object]) -> None:
        """Called by the loop as it starts: from now on requests interrupt `task`."""
        self._task = task
        self.check()

    def finish(self) -> None:
        """Called by the loop as it starts finishing: later requests change nothing."""
        self._task = None
        self._delivered = True

    def request_stop(self, signal: StopSignal) -> None:
        """Ask the loop to stop with `signal` (a stronger pending signal is kept)."""
        if self.finishing:
            return
        self.signal = pick_stop_signal([s for s in (self.signal, signal) if s is not None])
        if not self._delivered and self._task is not None and self._protected == 0:
            self._delivered = True
            self._task.cancel()

    def check(self) -> None:
        """Raise StopRequested if a stop was requested (even one already delivered as a
        cancel: code that swallowed the CancelledError does not get to carry on).
        """
        if self.signal is not None:
            self._delivered = True
            raise StopRequested

    @contextmanager
    def protected(self) -> Iterator[None]:
        """A section a stop request must not interrupt (delivered when it ends)."""
        self._protected += 1
        try:
            yield
        finally:
            self._protected -= 1
        if self._protected == 0:
            self.check()
