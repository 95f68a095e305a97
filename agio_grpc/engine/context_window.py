"""A provider's refusal of a prompt longer than the model's context window, and the windows
learned from such refusals (engine/compaction.py compacts with them).

**Recognition.** `context_refusal` reads a failed call's HTTP status, error code and message:
OpenAI's code `context_length_exceeded` (also sent in a stream's error object), or an
HTTP 400, 413 or 422 whose message is one of those vLLM, llama.cpp, Mistral, TGI, Gemini's
and Anthropic-compatible servers send. It also reads the window the message states, when it
does ("This model's maximum context length is 8192 tokens", "request (4476 tokens) exceeds
the available context size (4096 tokens)", "prompt is too long: 210000 tokens > 200000
maximum").

**Learning.** A window the configuration assumes (`context_window_tokens`, else the model
family's, else 128,000) can be larger than the real one: a session moved to a smaller
model, an unknown model. `LEARNED_WINDOWS` keeps the window a refusal states, by model
name, for the rest of the process's life, and logs it once (an operator should then set
`context_window_tokens`); a learned window only ever lowers the configured one.

Takes the error as any object with `status_code`, `error_code` and `message` (the model
driver's `ModelError`), so it depends on no driver module. Never imports grpc.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Protocol

log = logging.getLogger(__name__)

CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
"""OpenAI's error code for a request longer than the model's context window."""

_REFUSAL_STATUSES: Final = (400, 413, 422)

_TOO_LONG: Final = re.compile(
    r"maximum context length|context length|context window|context size|context limit"
    r"|prompt is too long|exceeds? the (?:model'?s? )?context"
    r"|maximum number of tokens allowed|max_new_tokens`? must be <=",
    re.IGNORECASE,
)
"""What the messages of a refusal for length say (besides OpenAI's code)."""

_NUMBER: Final = r"(\d[\d,]*)"
_STATED_WINDOW: Final = re.compile(
    "|".join(
        (
            # OpenAI, vLLM, DeepSeek: "This model's maximum context length is 8192 tokens."
            rf"maximum context length is {_NUMBER}",
            # Mistral: "too large for model with 32768 maximum context length"
            rf"model with {_NUMBER} maximum context length",
            # llama.cpp: "request (4476 tokens) exceeds the available context size (4096 tokens)"
            rf"context size \({_NUMBER} tokens\)",
            # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum";
            # "input length and `max_tokens` exceed context limit: 197626 + 21333 > 200000"
            rf"> {_NUMBER} maximum",
            rf"context limit: [\d, +]+> {_NUMBER}",
            # Gemini: "exceeds the maximum number of tokens allowed (1048576)"
            rf"maximum number of tokens allowed \({_NUMBER}\)",
            # TGI: "`inputs` tokens + `max_new_tokens` must be <= 4096"
            rf"max_new_tokens`? must be <= {_NUMBER}",
        )
    ),
    re.IGNORECASE,
)


class FailedCall(Protocol):
    """What a refusal is read from: the model driver's `ModelError`."""

    @property
    def status_code(self) -> int | None: ...

    @property
    def error_code(self) -> str | None: ...

    @property
    def message(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ContextRefusal:
    """The provider refused a request as longer than the model's context window."""

    window_tokens: int | None
    """The window the refusal states, in the provider's tokens; None when it states none."""


def context_refusal(error: FailedCall) -> ContextRefusal | None:
    """The refusal `error` is when the provider refused the request as too long (see the
    module docstring), else None."""
    if error.error_code != CONTEXT_LENGTH_EXCEEDED and not (
        error.status_code in _REFUSAL_STATUSES and _TOO_LONG.search(error.message)
    ):
        return None
    return ContextRefusal(stated_window(error.message))


def stated_window(message: str) -> int | None:
    """The context window a refusal's message states, if it states one."""
    found = _STATED_WINDOW.search(message)
    if found is None:
        return None
    number = next(group for group in found.groups() if group is not None)
    window = int(number.replace(",", ""))
    return window if window > 0 else None


class LearnedWindows:
    """The context windows providers stated in refusals, by model name (for the process's
    life; the oldest model is forgotten past `most_models`)."""

    def __init__(self, most_models: int = 1_024) -> None:
        self._windows: OrderedDict[str, int] = OrderedDict()
        self._most_models = most_models

    def learn(self, model: str, refusal: ContextRefusal) -> None:
        """Keep the window `refusal` states as `model`'s, when it is smaller than the one
        kept (a refusal stating none teaches nothing)."""
        window = refusal.window_tokens
        known = self._windows.get(model)
        if window is None or (known is not None and known <= window):
            return
        self._windows[model] = window
        self._windows.move_to_end(model)
        if len(self._windows) > self._most_models:
            self._windows.popitem(last=False)
        log.warning(
            "model %s: the provider states a context window of %d tokens; compaction keeps "
            "to it from now on in this process (an agent's context_window_tokens can say so)",
            model,
            window,
        )

    def window(self, model: str, configured: int) -> int:
        """`model`'s context window: `configured`, or the smaller one a refusal stated."""
        learned = self._windows.get(model)
        return configured if learned is None else min(configured, learned)

    def forget(self) -> None:
        """Forget every learned window (a test's fresh start)."""
        self._windows.clear()


LEARNED_WINDOWS: Final = LearnedWindows()
"""The windows this process learned."""
