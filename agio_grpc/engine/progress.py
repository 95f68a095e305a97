"""`ProgressRelay`: the way a server tool call's progress (`ToolContext.report_progress`)
reaches its run's stream.

Progress is published only while the run's calls are running: the run's task is then
waiting for them, never writing, and the channel is open (a write's journal must not see an
event published meanwhile: engine/channel.py). What a call reports after that (a context
kept past the call, a thread still going after a cancel) is dropped, and so is what a call
reports past `MAX_PROGRESS_PER_CALL` events (a run's events stay in memory until it ends; a
remote agent must not fill it). A sync tool reports from its worker thread: the event is
handed to the event loop first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.events import ToolProgress

MAX_PROGRESS_PER_CALL = 1000
"""The most `tool_progress` events one call publishes; later ones are dropped."""


class ProgressRelay:
    """Publishes the progress of the calls running now, from any thread."""

    def __init__(self, channel: RunChannel) -> None:
        self._channel = channel
        self._running: dict[str, int] = {}  # call id -> events published
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextmanager
    def running(self, call_ids: Collection[str]) -> Iterator[None]:
        """While the block runs, progress of `call_ids` is published."""
        self._loop = asyncio.get_running_loop()
        self._running = dict.fromkeys(call_ids, 0)
        try:
            yield
        finally:
            self._running = {}

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
        published = self._running.get(event.tool_call_id)
        if published is not None and published < MAX_PROGRESS_PER_CALL:
            self._running[event.tool_call_id] = published + 1
            self._channel.publish(event)
