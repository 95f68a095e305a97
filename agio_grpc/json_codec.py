"""JSON on the paths every run takes: fast C codecs, with the stdlib's result wherever they
refuse what the stdlib accepts.

Each model call encodes its request (the whole context: every message of the session) and
decodes each chunk it streams, and every step and journal record a run writes is JSON in
its row. orjson encodes a request 12-14x faster than the `json` module, msgspec decodes a
chunk 4.5x faster (docs/benchmarks/NOTES.md, "Changes 43-45"); msgspec decodes, rather
than orjson, because orjson reads an integer past 64 bits as a float. Both refuse some
input the stdlib takes: NaN and Infinity, escaped lone surrogates, text that is not valid
UTF-8 (a lone surrogate in a `str`), integers past 64 bits when encoding, dict keys that
are not strings. On those the stdlib does the work, so what is read and written stays what
it was; only the encoded bytes differ (compact, non-ASCII text as UTF-8 rather than
escaped), and a float NaN or Infinity is written as null (the stdlib writes `NaN`, which
is not JSON; nothing here stores one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
import orjson

T = TypeVar("T")

# Datetimes and dataclasses go to `default` as they do with the stdlib, not orjson's own
# forms.
_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def loads(text: str | bytes) -> Any:
    """The value of JSON `text`; raises json.JSONDecodeError (a ValueError) for text that is
    not JSON."""
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, UnicodeEncodeError):  # the latter: a lone surrogate
        return json.loads(text)


def decoder_of(kind: type[T], convert: Callable[[Any], T]) -> Callable[[str | bytes], T]:
    """A decoder of JSON that holds a `kind` (e.g. `list[ToolCall]`, a list of dataclasses)
    straight into it: msgspec makes the objects in C, several times faster than decoding
    and then constructing them in Python. What it refuses (as `loads` says, or a value not of
    that shape) is `convert`ed from `loads`'s result instead, which raises what it raises."""
    typed = msgspec.json.Decoder(kind)

    def decode(text: str | bytes) -> T:
        try:
            return typed.decode(text)
        except (msgspec.DecodeError, UnicodeEncodeError):
            return convert(loads(text))

    return decode


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`value` as compact JSON text; `default` makes what JSON cannot hold into what it can
    (as the stdlib's `default`); raises TypeError and ValueError as `json.dumps` does."""
    return dump_bytes(value, default).decode()


def dump_bytes(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`dumps` as UTF-8 bytes (an HTTP body)."""
    try:
        return orjson.dumps(value, default, _OPTIONS)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default, separators=(",", ":")).encode()
