"""How a model call is retried, the same for every adapter: the policy, the kinds of a
failed attempt, the one rule that says whether a failure may pass, and the retry loop.

Every retry is ours: counted in `StepMetrics.retries` and reported as a `ModelRetry` event.
- An attempt fails as `FinalFailure` when trying again cannot help: the call fails at once,
  not retryable (a refused request, a malformed chunk).
- It fails as `TransientFailure` before anything streamed: retried with exponential backoff
  and jitter, honouring `Retry-After` up to a cap (`RetryPolicy`).
- It fails as `StreamBroken` after the first delta: the call restarts ONCE (by default); the
  caller gets `ModelRestart` and must discard the step's deltas so far. If the restarted call
  fails too, the call fails with a retryable `ModelError`. Partial output is never a reply.
`is_transient` classifies an error answer's HTTP status, or an in-band error's codes, into
the second kind or the first: one rule for both.

Never imports a transport or an adapter.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Self

from agio_grpc.engine.models import (
    ModelError,
    ModelListener,
    ModelReply,
    ModelRestart,
    ModelRetry,
)

_TRANSIENT_STATUS = frozenset({408, 409, 429})
# In-band error codes and types (OpenAI's, Anthropic-style and vLLM's names) that decide
# without a status: a retry cannot fix the first kind, and may fix the second.
_FINAL_ERROR_CODES = frozenset(
    {
        "invalid_api_key",
        "authentication_error",
        "permission_error",
        "permission_denied",
        "model_not_found",
        "not_found_error",
        "invalid_request_error",
        "context_length_exceeded",
    }
)
_TRANSIENT_ERROR_CODES = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "server_error",
        "api_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
        "timeout",
    }
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How model calls are retried."""

    max_retries: int = 3
    """Retries of a call that failed before streaming anything."""
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    jitter: float = 0.25
    """Each backoff is shortened by a random share up to this."""
    max_retry_after_s: float = 30.0
    """A longer `Retry-After` is capped to this."""
    stream_restarts: int = 1
    """Restarts of a call whose stream broke after deltas."""

    def backoff_s(self, retry: int, retry_after_s: float | None) -> float:
        """The wait before retry number `retry` (0-based)."""
        if retry_after_s is not None:
            return max(0.0, min(retry_after_s, self.max_retry_after_s))
        delay = min(self.max_backoff_s, self.initial_backoff_s * 2.0**retry)
        return delay * (1 - random.random() * self.jitter)


class AttemptFailure(Exception):  # noqa: N818 - internal control flow
    """A failed attempt; its kind (the subclass) says what `complete_with_retries` does next."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_code = error_code
        self.retry_after_s = retry_after_s

    def redacted(self, redact: Callable[[str], str]) -> Self:
        """This failure with its message and error code passed through `redact`."""
        return type(self)(
            redact(self.message),
            status_code=self.status_code,
            error_code=None if self.error_code is None else redact(self.error_code),
            retry_after_s=self.retry_after_s,
        )

    def error(self, *, retryable: bool, retries: int, after: str = "") -> ModelError:
        """The call's `ModelError`, its message prefixed with `after` (what was tried)."""
        return ModelError(
            f"{after}: {self.message}" if after else self.message,
            retryable=retryable,
            status_code=self.status_code,
            error_code=self.error_code,
            retries=retries,
        )


class FinalFailure(AttemptFailure):
    """Trying again cannot help: a refused request, a malformed chunk."""


class TransientFailure(AttemptFailure):
    """Retried after a backoff (nothing streamed yet)."""


class StreamBroken(AttemptFailure):
    """The stream failed after deltas: the call restarts."""


def failed_attempt(failure: TransientFailure, *, streamed: bool) -> TransientFailure | StreamBroken:
    """A failed attempt: retried while nothing streamed, else the stream restarts."""
    if not streamed:
        return failure
    return StreamBroken(
        failure.message, status_code=failure.status_code, error_code=failure.error_code
    )


def is_transient(status: int | None, codes: tuple[str, ...] = ()) -> bool:
    """Whether a failure with this HTTP status, or else these error codes and types (most
    telling first), may pass on a retry. The one rule for error answers and in-band errors:
    - 408, 409, 429 and 5xx: yes; other statuses (400, 401, 403, 404, 422): no;
    - `_FINAL_ERROR_CODES` (authentication, unknown model, invalid request): no;
      `_TRANSIENT_ERROR_CODES` (rate limits, server errors, overload): yes;
    - nothing known: yes, as for a dropped connection.
    """
    if status is not None:
        return status in _TRANSIENT_STATUS or status >= 500
    for code in codes:
        if code.lower() in _FINAL_ERROR_CODES:
            return False
        if code.lower() in _TRANSIENT_ERROR_CODES:
            return True
    return True


async def complete_with_retries(
    attempt: Callable[[], Awaitable[ModelReply]], policy: RetryPolicy, on_event: ModelListener
) -> ModelReply:
    """The reply of the first `attempt` that succeeds, its `metrics.retries` set; retries and
    restarts as `policy` allows, each reported to `on_event`; raises `ModelError` when the
    call fails for good."""
    retries = restarts = 0
    while True:
        try:
            reply = await attempt()
        except FinalFailure as failure:
            raise failure.error(retryable=False, retries=retries + restarts) from None
        except TransientFailure as failure:
            if retries >= policy.max_retries:
                raise failure.error(
                    retryable=True,
                    retries=retries + restarts,
                    after=f"model call failed after {retries} retries",
                ) from None
            delay = policy.backoff_s(retries, failure.retry_after_s)
            retries += 1
            on_event(ModelRetry(retries, delay, failure.message))
            await asyncio.sleep(delay)
            continue
        except StreamBroken as failure:
            if restarts >= policy.stream_restarts:
                raise failure.error(
                    retryable=True,
                    retries=retries + restarts,
                    after=f"model stream failed after {restarts} restart(s)",
                ) from None
            restarts += 1
            on_event(ModelRestart(failure.message))
            continue
        reply.metrics.retries = retries + restarts
        return reply
