"""`json_codec` reads and writes what the stdlib `json` module reads and writes, including
where the fast codecs refuse input and the stdlib takes over."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agio_grpc import json_codec
from agio_grpc.domain import ToolCall

# Any text, lone surrogates included, and integers well past 64 bits.
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_VALUES)
def test_a_value_reads_back_as_the_stdlib_reads_it_back(value: Any) -> None:
    expected = json.loads(json.dumps(value))
    assert json_codec.loads(json_codec.dumps(value)) == expected
    assert json_codec.loads(json_codec.dump_bytes(value)) == expected
    # Rows written by the stdlib before (spaces, ASCII escapes) read the same.
    assert json_codec.loads(json.dumps(value)) == expected


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',  # an escaped lone surrogate
        str(2**70),
        str(-(2**70)),
        '{"usage": {"total_tokens": 1180591620717411303424}}',
        "[1e999]",
        '{"a": 1, "a": 2}',
        ' {"a": "\\u0000"} ',
    ],
)
def test_what_the_fast_decoder_refuses_or_bends_is_read_as_the_stdlib_reads_it(text: str) -> None:
    assert json_codec.loads(text) == json.loads(text)
    assert type(json_codec.loads(text)) is type(json.loads(text))


def test_nan_reads_as_the_stdlib_reads_it() -> None:
    assert math.isnan(json_codec.loads("NaN"))


@pytest.mark.parametrize("text", ["", "{", '{"a": 1}x', '"a\x00b"', "[1,]", "\ud800"])
def test_text_that_is_not_json_raises_the_stdlibs_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json_codec.loads(text)


@dataclass
class _Odd:
    name: str


@pytest.mark.parametrize(
    "value",
    [
        {"text": "lone \ud800 surrogate"},
        {"big": 2**70},
        {1: "a key that is not text"},
        {"when": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)},
        {"odd": _Odd("x")},
    ],
)
def test_what_the_fast_encoder_refuses_or_would_write_its_own_way_is_written_as_by_the_stdlib(
    value: dict[Any, Any],
) -> None:
    assert json.loads(json_codec.dumps(value, str)) == json.loads(json.dumps(value, default=str))


def test_a_value_json_cannot_hold_raises_without_a_default() -> None:
    with pytest.raises(TypeError):
        json_codec.dumps({"odd": _Odd("x")})


def test_the_encoding_is_compact_utf8() -> None:
    assert json_codec.dump_bytes({"a": ["é", 1]}) == '{"a":["é",1]}'.encode()


def test_a_typed_decoder_reads_straight_into_the_type_and_falls_back_to_convert() -> None:
    converted: list[object] = []

    def convert(value: Any) -> list[ToolCall]:
        converted.append(value)
        return [ToolCall(c["id"], c["name"], c["arguments"]) for c in value]

    decode = json_codec.decoder_of(list[ToolCall], convert)
    call = {"id": "c1", "name": "calc", "arguments": '{"x": "é"}'}
    assert decode(json.dumps([call])) == [ToolCall("c1", "calc", '{"x": "é"}')]
    assert converted == []
    # An escaped lone surrogate: only the stdlib reads it; `convert` makes the calls.
    lone = {**call, "arguments": "\ud800"}
    assert decode(json.dumps([lone])) == [ToolCall("c1", "calc", "\ud800")]
    assert converted == [[lone]]
    with pytest.raises(KeyError):  # not the shape: `convert` raises what it raises
        decode('[{"id": "c1"}]')
    with pytest.raises(json.JSONDecodeError):
        decode("[")
