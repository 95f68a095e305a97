"""`instrumented(role, instruments)`: any role of the store (store/__init__.py), with each
operation's latency, the steps it wrote and the forks it made recorded as metrics.

One decorator for every role, written once: it wraps the role's coroutine methods as they
are first used, so a role's protocol is stated in its own module only, and a method added
to a role is measured without an edit here. Every call goes straight to the wrapped role.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar, cast

from opentelemetry.semconv.attributes import error_attributes

from agio_grpc.domain import Step
from agio_grpc.telemetry import attributes as agio
from agio_grpc.telemetry.instruments import Instruments

R = TypeVar("R")

Method = Callable[..., Coroutine[Any, Any, Any]]


def _result_steps(result: Any) -> Iterable[Step]:
    """The steps a write returns: a `Step`, a list of them, or a value with `steps` (what a
    run's start, continuation or idle end stored); none for None."""
    if isinstance(result, Step):
        return (result,)
    if isinstance(result, list):
        return cast("list[Step]", result)
    return cast("Iterable[Step]", getattr(result, "steps", ()))


_STEP_WRITES = frozenset(
    {
        "append_steps",
        "append_to_idle_session",
        "start_run",
        "start_queued_run",
        "continue_run",
        "end_idle_run",
    }
)
"""The operations whose result holds the steps they stored (`agio.steps.written`)."""


def instrumented(role: R, instruments: Instruments) -> R:
    """`role`, recording `agio.store.operation.duration` per operation (with `error.type`
    when it raised), `agio.steps.written` by role and `agio.sessions.forks`."""
    return cast(R, _Instrumented(role, instruments))


class _Instrumented:
    def __init__(self, inner: object, instruments: Instruments) -> None:
        self._inner = inner
        self._instruments = instruments

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute  # a property's value, or a plain method
        timed = self._timed(name, attribute)
        setattr(self, name, timed)  # made once: later calls find it without __getattr__
        return timed

    def _timed(self, operation: str, method: Method) -> Method:
        instruments = self._instruments
        duration, written, forks = (
            instruments.store_duration,
            instruments.steps_written,
            instruments.forks,
        )
        counts_steps = operation in _STEP_WRITES
        forking = operation == "fork_session"

        async def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            attributes = {agio.STORE_OPERATION: operation}
            try:
                result = await method(*args, **kwargs)
            except BaseException as error:
                attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
                raise
            finally:
                duration.record(time.perf_counter() - started, attributes)
            if counts_steps and result is not None:
                for step in _result_steps(result):
                    written.add(1, {agio.STEP_ROLE: step.role.value})
            if forking:
                forks.add(1)
            return result

        return call
