"""Who is calling: the `Caller` an authenticated call runs as, current for its handler.

The authentication interceptor establishes the caller of each `agio.v1` call and makes it
current for the handler (`calling_as`); servicers read `current_caller().tenant` and hand it
to the store, which filters by it. A call nothing authenticated (`auth.mode: none`, or code
that runs outside a call) is `ANONYMOUS`, in the default tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from agio_grpc.domain import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller."""

    tenant: str
    """Whose sessions and runs the call may see and change."""
    subject: str = ""
    """Who, within the tenant: an API key's id, a JWT's `sub`, a certificate's subject; ""
    when no one was authenticated."""
    mode: str = "none"
    """How: `none`, `api_key`, `jwt` or `mtls`."""


ANONYMOUS = Caller(DEFAULT_TENANT)

_current: ContextVar[Caller] = ContextVar("agio_caller", default=ANONYMOUS)


def current_caller() -> Caller:
    """The caller of the call being handled (ANONYMOUS outside one)."""
    return _current.get()


@contextmanager
def calling_as(caller: Caller) -> Iterator[Caller]:
    """Make `caller` current for the block (a handler's run)."""
    token = _current.set(caller)
    try:
        yield caller
    finally:
        _current.reset(token)
