"""RunControl: stop requests reach the loop only at safe points."""

from __future__ import annotations

import asyncio

import pytest

from agio_grpc.domain import StopReason, StopSignal
from agio_grpc.engine.control import RunControl, StopRequested

CANCEL = StopSignal(StopReason.CANCELLED, "stop", "client")
SHUTDOWN = StopSignal(StopReason.INTERRUPTED, "bye", "server")
TIMEOUT = StopSignal(StopReason.TIMEOUT, "late")


async def test_a_request_before_the_loop_starts_stops_it_at_start() -> None:
    control = RunControl()
    control.request_stop(CANCEL)
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(StopRequested):
        control.start(task)
    assert control.signal is CANCEL


async def test_a_request_interrupts_the_running_loop() -> None:
    control = RunControl()
    waiting = asyncio.Event()

    async def loop() -> str:
        task = asyncio.current_task()
        assert task is not None
        control.start(task)
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "interrupted"
        return "not reached"

    task = asyncio.create_task(loop())
    await waiting.wait()
    control.request_stop(CANCEL)
    assert await task == "interrupted"


async def test_a_request_during_a_protected_section_waits_for_its_end() -> None:
    control = RunControl()
    inside = asyncio.Event()
    proceed = asyncio.Event()
    finished_write = False

    async def loop() -> None:
        nonlocal finished_write
        task = asyncio.current_task()
        assert task is not None
        control.start(task)
        with control.protected():
            inside.set()
            await proceed.wait()  # a store write in progress
            finished_write = True

    task = asyncio.create_task(loop())
    await inside.wait()
    control.request_stop(CANCEL)
    proceed.set()
    with pytest.raises(StopRequested):
        await task
    assert finished_write


def test_the_strongest_request_is_kept() -> None:
    control = RunControl()
    control.request_stop(TIMEOUT)
    control.request_stop(SHUTDOWN)
    control.request_stop(CANCEL)
    assert control.signal is SHUTDOWN


def test_requests_after_finish_change_nothing() -> None:
    control = RunControl()
    control.finish()
    control.request_stop(CANCEL)
    assert control.signal is None
