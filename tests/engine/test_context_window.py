"""Recognising a provider's refusal of a request longer than the model's context window,
reading the window it states, and keeping it for the model (engine/context_window.py).

The messages are the ones each kind of server sends; the driver's `ModelError` carries them
as `HTTP <status>: <message>` (engine/models/openai_chat.py).
"""

from __future__ import annotations

import logging

import pytest

from agio_grpc.engine.context_window import ContextRefusal, LearnedWindows, context_refusal
from agio_grpc.engine.models import ModelError


def refused(message: str, status: int | None = 400, code: str | None = None) -> ModelError:
    text = f"HTTP {status}: {message}" if status is not None else message
    return ModelError(text, retryable=False, status_code=status, error_code=code)


@pytest.mark.parametrize(
    ("error", "window"),
    [
        pytest.param(
            refused(
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9016 tokens. Please reduce the length of the messages.",
                code="context_length_exceeded",
            ),
            8192,
            id="openai",
        ),
        pytest.param(
            refused(
                "This model's maximum context length is 4096 tokens. However, you requested "
                "5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the "
                "length of the messages or completion."
            ),
            4096,
            id="vllm",
        ),
        pytest.param(
            refused(
                "Prompt contains 40000 tokens and 0 draft tokens, too large for model with "
                "32768 maximum context length"
            ),
            32768,
            id="mistral",
        ),
        pytest.param(
            refused("request (4476 tokens) exceeds the available context size (4096 tokens)"),
            4096,
            id="llama.cpp",
        ),
        pytest.param(
            refused("the request exceeds the available context size, try increasing it"),
            None,
            id="llama.cpp-unstated",
        ),
        pytest.param(
            refused("prompt is too long: 210000 tokens > 200000 maximum"),
            200_000,
            id="anthropic",
        ),
        pytest.param(
            refused(
                "input length and `max_tokens` exceed context limit: 197626 + 21333 > 200000, "
                "decrease input length or `max_tokens` and try again"
            ),
            200_000,
            id="anthropic-max-tokens",
        ),
        pytest.param(
            refused(
                "The input token count (1200000) exceeds the maximum number of tokens allowed "
                "(1048576)."
            ),
            1_048_576,
            id="gemini",
        ),
        pytest.param(
            refused(
                "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
                "Given: 4000 `inputs` tokens and 1000 `max_new_tokens`",
                status=422,
            ),
            4096,
            id="tgi",
        ),
        pytest.param(
            refused(
                "the model stream reported an error (context_length_exceeded)",
                status=None,
                code="context_length_exceeded",
            ),
            None,
            id="in-band-code",
        ),
    ],
)
def test_a_refusal_for_length_is_recognised_with_the_window_it_states(
    error: ModelError, window: int | None
) -> None:
    assert context_refusal(error) == ContextRefusal(window)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(refused("Invalid 'messages[1].content': string too long."), id="other-400"),
        pytest.param(refused("maximum context length is 8192 tokens", status=500), id="a-500"),
        pytest.param(
            refused("The model `gpt-9` does not exist", status=404, code="model_not_found"),
            id="unknown-model",
        ),
        pytest.param(
            refused("the model stream reported an error: context window", status=None),
            id="in-band-without-the-code",
        ),
    ],
)
def test_other_errors_are_no_refusal_for_length(error: ModelError) -> None:
    assert context_refusal(error) is None


def test_a_learned_window_only_ever_lowers_the_configured_one_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    windows = LearnedWindows()
    assert windows.window("small-model", 128_000) == 128_000
    with caplog.at_level(logging.WARNING, logger="agio_grpc.engine.context_window"):
        windows.learn("small-model", ContextRefusal(8_192))
        windows.learn("small-model", ContextRefusal(8_192))  # again: nothing new
        windows.learn("small-model", ContextRefusal(None))  # states none: teaches nothing
        windows.learn("small-model", ContextRefusal(16_384))  # larger than known: ignored
    assert windows.window("small-model", 128_000) == 8_192
    assert windows.window("small-model", 4_000) == 4_000  # a smaller configured one holds
    assert windows.window("other-model", 128_000) == 128_000
    (record,) = caplog.records
    assert "small-model" in record.getMessage()
    assert "8192 tokens" in record.getMessage()
    windows.learn("small-model", ContextRefusal(4_096))
    assert windows.window("small-model", 128_000) == 4_096


def test_learned_windows_keep_the_latest_models_only() -> None:
    windows = LearnedWindows(most_models=2)
    for model in ("a", "b", "c"):
        windows.learn(model, ContextRefusal(1_000))
    assert [windows.window(model, 5_000) for model in ("a", "b", "c")] == [5_000, 1_000, 1_000]
