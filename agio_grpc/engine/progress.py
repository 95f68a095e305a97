"""`ProgressRelay`: the way a server tool call's progress (`ToolContext.report_progress`)
reaches its run's stream.

Progress is published only while the run's calls are running: the run's task is then
waiting for them, never writing, and the channel is open (a write's journal must not see an
event published meanwhile: engine/channel.py). What a call reports after that (a context
kept past the call, a thread still going after a cancel) is dropped. A sync tool reports
from its worker thread: the event is handed to the event loop first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.events import ToolProgress


class ProgressRelay:
    """Publishes the progress of the calls running now, from any thread."""

    def __init__(self, channel: RunChannel) -> None:
        self._channel = channel
        self._running: frozenset[str] = frozenset()
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextmanager
    def running(self, call_ids: Collection[str]) -> Iterator[None]:
        """While the block runs, progress of `call_ids` is published."""
        self._loop = asyncio.get_running_loop()
        self._running = frozenset(call_ids)
        try:
            yield
        finally:
            self._running = frozenset()

    def report(self, event: ToolProgress) -> None:
        """A call's progress (`ToolContext.progress`), from the loop or a worker thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._publish(event)
        else:
            loop.call_soon_threadsafe(self._publish, event)

    def _publish(self, event: ToolProgress) -> None:
        if event.tool_call_id in self._running:
            self._channel.publish(event)
