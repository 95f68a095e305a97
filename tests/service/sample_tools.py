"""Server tools the end-to-end tests load through `tool_modules`, as a user's module would be."""

from __future__ import annotations

import asyncio


async def slow_echo(text: str, delay_s: float) -> str:
    """Return the text after a delay.

    Args:
        text: The text to return.
        delay_s: Seconds to wait first.
    """
    await asyncio.sleep(delay_s)
    return text


def explode(message: str) -> str:
    """Always fails.

    Args:
        message: The error message.
    """
    raise RuntimeError(message)


async def hang() -> str:
    """Never returns."""
    await asyncio.Event().wait()
    return "unreachable"


TOOLS = [slow_echo, explode, hang]
