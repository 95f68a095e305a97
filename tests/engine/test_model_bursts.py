"""The model driver's turns of the event loop while it reports a burst of deltas it already
read: one after each until its listener says the call's first delta is out, then in turns."""

from __future__ import annotations

import asyncio
import itertools
import json

from agio_grpc.engine.models import ModelDelta, ModelEvent
from agio_grpc.engine.models.openai_chat import DELTAS_PER_TURN, OpenAIModelDriver
from tests.engine.harness import FAST_RETRIES
from tests.engine.test_model import HELLO, RawHttpServer


def burst_server(count: int) -> RawHttpServer:
    """A server that sends a reply of `count` one-word deltas in one write: one burst."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": f"{n} "}}]} for n in range(count)]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks)
    body += b"data: [DONE]\n\n"
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}"
    return RawHttpServer(f"{head}\r\n\r\n".encode() + body)


async def turns_at_each_delta(count: int, out_after: int | None) -> list[int]:
    """For each delta of a burst of `count`, how many turns another task had had when the
    driver reported it; the listener says the first delta is out from delta `out_after` on
    (None: it never answers, as a listener of no channel)."""
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    at: list[int] = []

    def listener(event: ModelEvent) -> bool | None:
        if not isinstance(event, ModelDelta):
            return False
        at.append(turns)
        return None if out_after is None else len(at) >= out_after

    async with burst_server(count) as base_url:
        driver = OpenAIModelDriver(base_url=base_url, api_key="k", retry=FAST_RETRIES)
        other = asyncio.create_task(other_task())
        try:
            reply = await driver.complete(HELLO, listener)
        finally:
            other.cancel()
            await driver.close()
    assert reply.content == "".join(f"{n} " for n in range(count))
    assert len(at) == count
    return at


async def test_a_burst_goes_a_delta_a_turn_until_the_first_is_out_then_in_turns() -> None:
    """Until the listener says the first delta is out, other tasks get a turn after each
    (the relay sends it, and what is ahead of it, at once); after that a burst already read
    is reported without a turn per delta (the channel merges it), though never more than
    DELTAS_PER_TURN of it."""
    count = 3 * DELTAS_PER_TURN + 5
    at = await turns_at_each_delta(count, out_after=3)
    assert at[0] < at[1] < at[2]  # a turn after each until the third, answered "out"
    runs = [len(list(group)) for _, group in itertools.groupby(at[2:])]
    assert max(runs) <= DELTAS_PER_TURN  # never more without a turn for the others
    assert len(runs) < count - 2  # but not a turn per delta


async def test_a_listener_that_never_says_the_first_delta_is_out_gets_a_turn_per_delta() -> None:
    at = await turns_at_each_delta(2 * DELTAS_PER_TURN, out_after=None)
    assert all(before < after for before, after in itertools.pairwise(at))
