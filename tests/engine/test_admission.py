"""`RunSlots`: at most `limit` runs at once, waiters served in arrival order, and no slot
lost to a waiter that gave up (timed out or cancelled) at any moment."""

from __future__ import annotations

import asyncio

import pytest

from agio_grpc.engine.admission import RunSlots
from agio_grpc.engine.errors import ServerBusyError


async def test_slots_up_to_the_limit_are_taken_at_once() -> None:
    slots = RunSlots(2, wait_s=60)
    first, second = await slots.take(None), await slots.take(None)
    assert slots.taken == 2
    first.give()
    first.give()  # once only
    assert slots.taken == 1
    second.give()
    assert slots.taken == 0


async def test_a_freed_slot_goes_to_the_longest_waiter() -> None:
    slots = RunSlots(1, wait_s=60)
    held = await slots.take(None)
    order: list[str] = []

    async def wait(name: str) -> None:
        with await slots.take(None):
            order.append(name)

    waiters = [asyncio.create_task(wait(name)) for name in ("a", "b", "c")]
    await asyncio.sleep(0)  # all three queued
    late = asyncio.create_task(wait("newcomer"))
    await asyncio.sleep(0)
    held.give()
    await asyncio.gather(*waiters, late)
    assert order == ["a", "b", "c", "newcomer"]
    assert slots.taken == 0


async def test_a_waiter_gives_up_before_its_deadline() -> None:
    slots = RunSlots(1, wait_s=60)
    held = await slots.take(None)
    started = asyncio.get_running_loop().time()
    with pytest.raises(ServerBusyError) as busy:
        await slots.take(deadline_at=started + 0.2)  # waits half of it at most
    assert (busy.value.limit, busy.value.running, busy.value.waiting) == (1, 1, 0)
    with pytest.raises(ServerBusyError):
        await slots.take(deadline_at=started)  # already due: refused at once
    held.give()
    assert slots.taken == 0


async def test_a_waiter_without_a_deadline_waits_wait_s() -> None:
    slots = RunSlots(1, wait_s=0.05)
    held = await slots.take(None)
    with pytest.raises(ServerBusyError):
        await slots.take(None)
    held.give()
    assert (slots.taken, await slots.take(None) is not None) == (0, True)


async def test_a_waiter_with_a_far_deadline_waits_wait_s_at_most() -> None:
    """The shorter of half the time to the deadline and wait_s: here wait_s."""
    slots = RunSlots(1, wait_s=0.05)
    held = await slots.take(None)
    far = asyncio.get_running_loop().time() + 600  # half of it: 300 s
    async with asyncio.timeout(30):
        with pytest.raises(ServerBusyError):
            await slots.take(deadline_at=far)
    held.give()
    assert slots.taken == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_loses_no_slot() -> None:
    slots = RunSlots(1, wait_s=60)
    held = await slots.take(None)
    waiter = asyncio.create_task(slots.take(None))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held.give()
    assert slots.taken == 0


async def test_a_slot_handed_to_a_waiter_cancelled_meanwhile_is_passed_on() -> None:
    slots = RunSlots(1, wait_s=60)
    held = await slots.take(None)
    gone = asyncio.create_task(slots.take(None))
    next_in_line = asyncio.create_task(slots.take(None))
    await asyncio.sleep(0)
    held.give()  # handed to `gone`, which has not run yet
    gone.cancel()  # and leaves before it could
    with pytest.raises(asyncio.CancelledError):
        await gone
    kept = await asyncio.wait_for(next_in_line, 5)
    assert slots.taken == 1
    kept.give()
    assert slots.taken == 0


async def test_a_slot_not_kept_by_a_segment_is_given_back_when_the_block_ends() -> None:
    slots = RunSlots(1, wait_s=60)
    with await slots.take(None):
        pass  # refused, queued or failed: no segment kept it
    with pytest.raises(RuntimeError), await slots.take(None):
        raise RuntimeError("the start failed")
    with await slots.take(None) as slot:
        slot.keep()  # a segment took it: its task's end gives it back
    assert slots.taken == 1
    slot.give()
    assert slots.taken == 0


async def test_runs_already_accepted_take_a_slot_past_the_limit() -> None:
    slots = RunSlots(1, wait_s=60)
    held = await slots.take(None)
    queued = slots.take_now()
    assert slots.taken == 2
    queued.give()
    held.give()
    assert slots.taken == 0
