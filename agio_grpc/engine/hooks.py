"""Hooks: operator-supplied Python callables called at fixed points of every run.

Configured as `package.module:function` lists (sync or async functions):
- `on_run_start(run)` once a run (or a continuation) starts;
- `before_model_call(run, messages)` with the exact message list about to be sent
  (inspect it; mutating it is not supported);
- `after_step(run, step)` after each step is durably stored (the run and the step are
  copies: changing them changes nothing);
- `on_run_end(run)` with the final run row.

A hook ends the run by raising `StopRun(signal)` (its source becomes `hook` unless set);
the loop catches it at one boundary and finishes the run with that signal. `StopRun` from
`on_run_end` is ignored: the run has already ended.

Any other exception from a hook is logged with its traceback and the run goes on (a
`HOOK_FAILED` error event tells the client): hooks are observers and policy checks, and a
broken metrics hook must not take every run down with it. A policy hook that must fail
closed catches its own errors and raises `StopRun`.

Never imports grpc; hooks receive domain objects, never protobuf.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agio_grpc.domain import StopSignal
from agio_grpc.engine.loading import import_object

logger = logging.getLogger(__name__)

Hook = Callable[..., Any]
"""A sync or async function; its arguments depend on the hook point."""


class StopRun(Exception):  # noqa: N818 - it is a signal, not an error
    """Raise from a hook to end the run with `signal`."""

    def __init__(self, signal: StopSignal) -> None:
        super().__init__(signal.message or signal.reason.value)
        if signal.source in ("", "loop"):
            signal.source = "hook"
        self.signal = signal


@dataclass(slots=True)
class Hooks:
    """The hook functions of each point, called in order."""

    on_run_start: list[Hook] = field(default_factory=list)
    before_model_call: list[Hook] = field(default_factory=list)
    after_step: list[Hook] = field(default_factory=list)
    on_run_end: list[Hook] = field(default_factory=list)

    @classmethod
    def load(
        cls,
        *,
        on_run_start: Sequence[str] = (),
        before_model_call: Sequence[str] = (),
        after_step: Sequence[str] = (),
        on_run_end: Sequence[str] = (),
    ) -> Hooks:
        """Hooks named `package.module:function`. Raises ValueError for a bad name."""
        return cls(
            on_run_start=[_load(spec) for spec in on_run_start],
            before_model_call=[_load(spec) for spec in before_model_call],
            after_step=[_load(spec) for spec in after_step],
            on_run_end=[_load(spec) for spec in on_run_end],
        )


async def call_hooks(
    hooks: Sequence[Hook], *args: object, on_failure: Callable[[str], None]
) -> None:
    """Call each hook with `args`. `StopRun` propagates; any other error is logged, reported
    through `on_failure(message)`, and skipped.
    """
    for hook in hooks:
        try:
            result = hook(*args)
            if inspect.isawaitable(result):
                await result
        except StopRun:
            raise
        except Exception as error:
            name = getattr(hook, "__qualname__", repr(hook))
            logger.exception("hook %s failed; the run goes on", name)
            on_failure(f"hook {name} failed: {type(error).__name__}: {error}")


def _load(spec: str) -> Hook:
    target = import_object(spec)
    if not callable(target) or ":" not in spec:
        raise ValueError(f"hook {spec!r} is not a 'package.module:function'")
    return target
