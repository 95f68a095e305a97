"""Token counts: tiktoken's for OpenAI's families when the encoding is cached (never a
download), the character estimate otherwise, and what compaction counts with them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agio_grpc.domain import Role, Step
from agio_grpc.engine import tokens
from agio_grpc.engine.compaction import ESTIMATE, TokenCount, token_count_for
from agio_grpc.engine.tokens import ENCODING_FILES, counter_for, encoding_name

CACHE = os.environ.get("TIKTOKEN_CACHE_DIR", "")


def cached(encoding: str) -> bool:
    return bool(CACHE) and (Path(CACHE) / ENCODING_FILES[encoding].cache_name).is_file()


needs_tiktoken = pytest.mark.skipif(
    not cached("o200k_base") and not os.environ.get("AGIO_REQUIRE_TOKENIZERS"),
    reason="tiktoken's encodings are not cached: `make tokenizers`",
)


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    tokens._counters.clear()
    yield
    tokens._counters.clear()


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("openai/gpt-4.1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-3-5-sonnet", None),
        ("llama-3.1-70b", None),
        ("fake-model", None),
    ],
)
def test_a_model_family_has_its_encoding(model: str, encoding: str | None) -> None:
    assert encoding_name(model) == encoding


@needs_tiktoken
def test_openai_models_are_counted_with_tiktoken() -> None:
    name, count = counter_for("gpt-4o")
    assert name == "o200k_base"
    assert count("hello world") == 2
    assert count("日本語のテキスト") < len("日本語のテキスト")  # the estimate counts 8
    name, count = counter_for("gpt-4")
    assert name == "cl100k_base"
    assert count("hello world") == 2
    counting = token_count_for("gpt-4o")
    step = Step("s", "r", Role.USER, content="hello world", sequence=1)
    assert counting.step(step) == 4 + 2
    assert counting.step(step) == 4 + 2  # kept by id


def test_other_models_and_a_missing_or_altered_file_fall_back_to_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert counter_for("claude-3-opus")[0] == "estimate"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert counter_for("gpt-4o")[0] == "estimate"  # nothing cached: no download either
    tokens._counters.clear()
    (tmp_path / ENCODING_FILES["o200k_base"].cache_name).write_bytes(b"not the encoding")
    name, count = counter_for("gpt-4o")
    assert name == "estimate"
    assert count("hello world") == 3
    assert (tmp_path / ENCODING_FILES["o200k_base"].cache_name).read_bytes() == (
        b"not the encoding"  # left as it was: tiktoken would have fetched it again
    )


def test_the_estimate_counts_ascii_by_four_and_other_text_by_characters() -> None:
    assert ESTIMATE.text("abcd" * 10) == 10
    assert ESTIMATE.text("abcde") == 2
    assert ESTIMATE.text("日本語") == 3
    summary = Step("s", "r", Role.SUMMARY, content="abcd")
    assert ESTIMATE.step(summary) > ESTIMATE.step(Step("s", "r", Role.USER, content="abcd"))


def test_a_token_count_keeps_at_most_its_bound_of_steps() -> None:
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text)

    counting = TokenCount("test", count, kept_steps=2)
    steps = [Step("s", "r", Role.USER, content=f"t{n}", sequence=n + 1) for n in range(3)]
    for step in steps:
        counting.step(step)
    calls.clear()
    counting.step(steps[2])
    counting.step(steps[0])  # evicted: counted again
    assert calls == ["t0"]
