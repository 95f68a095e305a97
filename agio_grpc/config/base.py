"""What every part of the settings shares: limits, sizes and the strict base model."""

from __future__ import annotations

import os

from pydantic import (
    BaseModel,
    ConfigDict,
)

DEFAULT_INSTRUCTIONS = (
    "You are a helpful assistant. Use the tools when they help; answer concisely."
)
MAX_STEPS_LIMIT = 1000
"""The highest `max_steps` an agent or a run's overrides may set."""
KIB = 1024
MIB = 1024 * KIB
MAX_WORKERS = 1024
"""The most worker processes `server.workers` may ask for."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and `taskset`
    narrow), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_workers(value: object) -> object:
    """`server.workers` as written: `auto` is the number of available cores, a numeral its
    number; anything else is refused with a message naming both forms."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return available_cores()
        if not text.isdigit():
            raise ValueError(
                f"must be a number of worker processes (1..{MAX_WORKERS}) or auto, got {value!r}"
            )
        return int(text)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
