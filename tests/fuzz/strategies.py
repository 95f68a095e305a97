"""Hypothesis strategies for hostile agio.v1 requests and for model-stream chunks.

A request is drawn by walking its message descriptor: every field may be absent or set, and
a set field gets a random or a hostile value for its type (texts with U+0000, texts at and
around the size limits, integers at and around their ranges, enums with unknown numbers,
durations with mixed signs or too many nanos, repeated and map fields with many entries,
deep and wide client-tool schemas). Fields that name things (sessions, runs, tool calls, page
tokens) also get symbols for real things (`Ref`, `PageToken`) that world.py makes and
resolves per example, so a minimal failing example reads `session_id=Ref.WAITING_SESSION`.
Long texts are `Long` and bytes that are not UTF-8 `Undecodable`, to keep reports short.

Model streams are lists of SSE `data` payloads: random JSON shapes built from the words of
the Chat Completions chunk, or a valid stream with one field of one chunk replaced by a
value of another JSON type (or removed). Nothing here does I/O.
"""

from __future__ import annotations

import base64
import enum
import json
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeAlias

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from agio_grpc.v1 import agent_service_pb2, session_service_pb2

Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None
Fields: TypeAlias = dict[str, Any]
"""A message to build: field name -> value (a scalar, a symbol, a list, a map or Fields)."""

KIB = 1024
MIB = 1024 * KIB
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


class ShownByRepr:
    """Hypothesis prints a failing example with its own printer, a dataclass field by field;
    this makes it print `repr`, which is kept short (a 17 MiB payload is not shown)."""

    __slots__ = ()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


# -- symbols resolved per example ------------------------------------------------------------


class Ref(enum.Enum):
    """A real thing an id field can name; world.py makes it on first use in an example."""

    LIVE_SESSION = "a session whose run completed after a server tool call"
    OTHER_SESSION = "another session with a completed run"
    WAITING_SESSION = "a session whose run waits in REQUIRES_ACTION on two client tool calls"
    DELETED_SESSION = "a session that was deleted"
    ENDED_RUN = "the live session's completed run"
    OTHER_RUN = "the other session's completed run"
    WAITING_RUN = "the run waiting in REQUIRES_ACTION"
    DELETED_RUN = "the run of the deleted session"
    OPEN_CALL = "the first open tool call of the waiting run"
    OTHER_OPEN_CALL = "the second open tool call of the waiting run"
    ANSWERED_CALL = "the live session's answered tool call"
    APPROVAL_SESSION = "a session whose run waits for decisions on a server call and a client call"
    APPROVAL_RUN = "the run waiting for a decision (and a client output)"
    HELD_CALL = "the server call that waits for approval"
    HELD_CLIENT_CALL = "the client call of the same wait"

    def __repr__(self) -> str:
        return f"Ref.{self.name}"


SESSION_REFS = (
    Ref.LIVE_SESSION,
    Ref.OTHER_SESSION,
    Ref.WAITING_SESSION,
    Ref.DELETED_SESSION,
    Ref.APPROVAL_SESSION,
)
RUN_REFS = (Ref.ENDED_RUN, Ref.WAITING_RUN, Ref.OTHER_RUN, Ref.DELETED_RUN, Ref.APPROVAL_RUN)
CALL_REFS = (
    Ref.OPEN_CALL,
    Ref.OTHER_OPEN_CALL,
    Ref.ANSWERED_CALL,
    Ref.HELD_CALL,
    Ref.HELD_CLIENT_CALL,
)

TokenSource: TypeAlias = Literal["sessions", "steps", "runs"]


@dataclass(frozen=True, slots=True)
class TokenChange:
    """How a real page token is tampered with."""

    how: Literal["truncate", "extend", "flip", "payload"]
    """Cut it at `at`, append `value` as text, change the character at `at`, or decode it
    and replace its `at`-th JSON leaf by `value` (a flip when it is not JSON)."""
    at: int
    value: Json


@dataclass(frozen=True, slots=True)
class PageToken:
    """A real `next_page_token` of a listing with page size 1, maybe tampered with."""

    source: TokenSource
    change: TokenChange | None = None


@dataclass(frozen=True, slots=True)
class Long(ShownByRepr):
    """A long text, `unit` repeated `count` times; shown short in reports."""

    unit: str
    count: int

    @property
    def text(self) -> str:
        return self.unit * self.count

    def __repr__(self) -> str:
        return f"Long({self.unit!r} * {self.count})"


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Bytes that are not UTF-8, sent in a string field by patching the encoded request."""

    raw: bytes


# -- the RPCs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rpc(ShownByRepr):
    """One method of the contract, from its service descriptor."""

    service: str
    name: str
    request: Descriptor
    response: Descriptor
    streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def __repr__(self) -> str:
        return self.name


def _rpcs(file: FileDescriptor, service: str) -> tuple[Rpc, ...]:
    descriptor = file.services_by_name[service]
    return tuple(
        Rpc(
            descriptor.full_name,
            method.name,
            method.input_type,
            method.output_type,
            method.server_streaming,
        )
        for method in descriptor.methods
    )


AGENT_RPCS = _rpcs(agent_service_pb2.DESCRIPTOR, "AgentService")
SESSION_RPCS = _rpcs(session_service_pb2.DESCRIPTOR, "SessionService")
RUN_STARTING = frozenset({"Run", "SubmitToolOutputs", "Retry"})
"""The streaming RPCs whose stream is a run's own (WatchRun only follows one)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One request to send: the RPC, its fields, and the deadline the test sets (if any)."""

    rpc: Rpc
    fields: Fields
    deadline_s: float | None = None

    def holds(self, kind: type) -> bool:
        """Whether any value in the request, at any depth, is a `kind`."""
        return _holds(self.fields, kind)


def _holds(value: Any, kind: type) -> bool:
    if isinstance(value, kind):
        return True
    if isinstance(value, dict):
        return any(_holds(k, kind) or _holds(v, kind) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds(item, kind) for item in value)
    return False


# -- scalar values ----------------------------------------------------------------------------

EDGE_INTEGERS: tuple[int, ...] = (0, 1, -1, 2, 7, 50, 100, 999, 1000, 1001, 2**31 - 1, 2**31)
EDGE_INTEGERS += (-(2**31), -(2**31) - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, -(2**63))
SPECIAL_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "\n\t ",
    "\ufeff",
    "\u202e",
    "\uffff",
    "\U0010ffff",
)
SPECIAL_TEXTS += ("🙂", "e\u0301", "null", "{}", "%s%n", "'; DROP TABLE steps; --", "../x", "-")
LONG_UNITS = ("x", "é", "🙂", " ", "\x00")
LONG_SIZES: tuple[int, ...] = (127, 128, 129, 4 * KIB, 4 * KIB + 1, 16 * KIB, 16 * KIB + 1)
LONG_SIZES += (64 * KIB, 64 * KIB + 1, 256 * KIB, 256 * KIB + 1, MIB, MIB + 1)
BIG_TEXT_FIELDS = frozenset({"input", "output", "instructions"})
"""Fields whose limit is above 64 KiB; others get texts of at most 64 KiB + 1 bytes, so no
request nears the server's 16 MiB message limit (which gRPC itself enforces, detail-less)."""
INVALID_UTF8: tuple[bytes, ...] = (
    b"\xff",
    b"\xfe",
    b"\x80",
    b"\xc0\xaf",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
)
INVALID_UTF8 += (b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80")
MIN_UNDECODABLE_BYTES = 12
"""Patched in place of a marker of the same length, which must be unique in the request."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What kinds of value the walk may draw."""

    long_texts: bool = True
    """Texts up to the size limits (off for the items of a many-items list)."""
    undecodable: bool = False
    """Any string may be bytes that are not UTF-8 (one in two)."""

    def small(self) -> Shape:
        return Shape(long_texts=False, undecodable=self.undecodable)


def either(
    usual: SearchStrategy[Any], rare: SearchStrategy[Any], one_in: int = 6
) -> SearchStrategy[Any]:
    """`usual`, except one draw in `one_in` from `rare`; shrinks towards `usual`.

    A hostile value in every field would make every request fail its first check: the
    usual values let most requests reach the engine and the store, with a few hostile ones.
    """
    return st.integers(0, one_in - 1).flatmap(lambda n: rare if n == one_in - 1 else usual)


def integers(low: int, high: int) -> SearchStrategy[int]:
    """Small integers, sometimes ones at and around the edges of the usual ranges."""
    edges = [value for value in EDGE_INTEGERS if low <= value <= high]
    usual = st.integers(max(low, 0), min(high, 6))
    return either(usual, st.one_of(st.sampled_from(edges), st.integers(low, high)))


def long_texts(max_bytes: int) -> SearchStrategy[Long]:
    """Texts at and around the size limits, never above `max_bytes` (UTF-8)."""
    sizes = [size for size in LONG_SIZES if size <= max_bytes]

    def sized(unit: str, size: int) -> Long:
        return Long(unit, max(1, size // len(unit.encode())))

    return st.builds(sized, st.sampled_from(LONG_UNITS), st.sampled_from(sizes))


def undecodable_texts() -> SearchStrategy[Undecodable]:
    """ASCII around a byte sequence no UTF-8 decoder accepts."""
    ascii_text = st.text(alphabet=string.ascii_letters, max_size=6).map(str.encode)

    def joined(head: bytes, bad: bytes, tail: bytes) -> Undecodable:
        raw = head + bad + tail
        return Undecodable(raw + b"~" * max(0, MIN_UNDECODABLE_BYTES - len(raw)))

    return st.builds(joined, ascii_text, st.sampled_from(INVALID_UTF8), ascii_text)


def hostile_texts(shape: Shape, max_bytes: int = 64 * KIB + 1) -> SearchStrategy[Any]:
    """U+0000 and other odd characters, and (shape permitting) texts at the size limits."""
    choices: list[SearchStrategy[Any]] = [
        st.sampled_from(SPECIAL_TEXTS),
        st.builds("{}\x00{}".format, st.text(max_size=8), st.text(max_size=8)),
    ]
    if shape.long_texts:
        choices.append(long_texts(max_bytes))
    return st.one_of(choices)


def texts(shape: Shape, max_bytes: int = 64 * KIB + 1) -> SearchStrategy[Any]:
    """Random text, sometimes hostile."""
    return either(st.text(max_size=30), hostile_texts(shape, max_bytes))


def ids(shape: Shape) -> SearchStrategy[Any]:
    """Things that look like ids, and things that do not."""
    return st.one_of(
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,30}", fullmatch=True),
        st.sampled_from([Long("a", 128), Long("a", 129), "sess_missing", "run_missing"]),
        st.text(max_size=20),
        hostile_texts(shape),
    )


def json_values(
    max_leaves: int = 8, keys: SearchStrategy[str] | None = None
) -> SearchStrategy[Json]:
    """Any JSON value (NaN and the infinities too, as Python's encoder writes them)."""
    names = keys if keys is not None else st.text(max_size=8)
    scalars: SearchStrategy[Json] = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)
    )

    def nested(children: SearchStrategy[Json]) -> SearchStrategy[Json]:
        return st.one_of(
            st.lists(children, max_size=4), st.dictionaries(names, children, max_size=4)
        )

    return st.recursive(scalars, nested, max_leaves=max_leaves)


def doubles() -> SearchStrategy[float]:
    """Temperatures: mostly within 0..2, sometimes anything a double holds."""
    edges = st.sampled_from([2.0000001, -0.0, -1.0, 1e308, float("nan"), float("inf")])
    return either(st.floats(0, 2), st.one_of(edges, st.floats()))


def enum_numbers(enum_type: EnumDescriptor) -> SearchStrategy[int]:
    """Declared values, sometimes numbers the contract does not declare."""
    known = [value.number for value in enum_type.values]
    unknown = [-1, max(known) + 1, 99, INT32[1], INT32[0]]
    return either(st.sampled_from(known), st.sampled_from(unknown))


SECONDS_EDGES: tuple[int, ...] = (0, 1, -1, 86_400, 86_401, 315_576_000_000, 315_576_000_001)
SECONDS_EDGES += (2**62, INT64[1], INT64[0])
NANOS_EDGES = (0, 1, -1, 500_000_000, 999_999_999, -999_999_999, 10**9, -(10**9), *INT32)


def durations() -> SearchStrategy[Fields]:
    """`google.protobuf.Duration`: a few seconds, sometimes mixed signs, nanos of a second or
    more, or huge seconds."""
    usual = st.fixed_dictionaries(
        {}, optional={"seconds": st.integers(0, 3), "nanos": st.integers(0, 10**9 - 1)}
    )
    hostile = st.fixed_dictionaries(
        {},
        optional={
            "seconds": st.one_of(st.sampled_from(SECONDS_EDGES), st.integers(*INT64)),
            "nanos": st.one_of(st.sampled_from(NANOS_EDGES), st.integers(*INT32)),
        },
    )
    return either(usual, hostile)


# -- client tool schemas ----------------------------------------------------------------------

VALID_SCHEMAS = (
    "",
    "{}",
    '{"type": "object"}',
    '{"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}',
    '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}',
    '{"$schema": "https://example.com/unknown", "type": "object"}',
    '{"$ref": "#/$defs/missing"}',
    '{"$ref": "https://example.com/remote.json"}',
    '{"type": "object", "properties": {"a": {"$ref": "#"}}}',
)
INVALID_SCHEMAS = (
    "null",
    "[]",
    '"object"',
    '{"type": 5}',
    '{"properties": []}',
    "{",
    '{"$schema": 7}',
)
DEPTHS = (8, 15, 16, 17, 31, 32, 33, 64, 65, 200, 1000, 5000)
WIDTHS = (10, 100, 1000, 2047, 2048, 2049, 3000)


def deep_schema(depth: int, how: Literal["object", "array", "anyOf", "brackets"]) -> str:
    """A schema nested `depth` times (or bare brackets, which are no schema at all)."""
    if how == "brackets":
        return "[" * depth + "]" * depth
    opening = {
        "object": '{"type": "object", "properties": {"a": ',
        "array": '{"type": "array", "items": ',
        "anyOf": '{"anyOf": [',
    }[how]
    closing = {"object": "}}", "array": "}", "anyOf": "]}"}[how]
    return opening * depth + '{"type": "string"}' + closing * depth


def wide_schema(width: int) -> str:
    properties = {f"p{i}": {"type": "string"} for i in range(width)}
    return json.dumps({"type": "object", "properties": properties})


def nested_schemas() -> SearchStrategy[str]:
    """Plausible schemas: objects and arrays of typed leaves, a few levels deep."""
    leaf = st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
        optional={"description": st.text(max_size=10), "enum": st.lists(st.integers(), max_size=3)},
    )

    def nested(inner: SearchStrategy[dict[str, Any]]) -> SearchStrategy[dict[str, Any]]:
        return st.one_of(
            st.fixed_dictionaries(
                {
                    "type": st.just("object"),
                    "properties": st.dictionaries(st.text(max_size=8), inner, max_size=4),
                },
                optional={
                    "required": st.lists(st.text(max_size=8), max_size=3),
                    "additionalProperties": st.booleans(),
                },
            ),
            st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        )

    return st.recursive(leaf, nested, max_leaves=12).map(json.dumps)


def schemas(shape: Shape) -> SearchStrategy[Any]:
    """`parameters_json` of a client tool: valid, sometimes invalid, deep, wide, not JSON."""
    if not shape.long_texts:
        return st.sampled_from(VALID_SCHEMAS + INVALID_SCHEMAS)
    hows = st.sampled_from(["object", "array", "anyOf", "brackets"])
    return either(
        st.one_of(st.sampled_from(VALID_SCHEMAS), nested_schemas()),
        st.one_of(
            st.sampled_from(INVALID_SCHEMAS),
            st.builds(deep_schema, st.sampled_from(DEPTHS), hows),
            st.builds(wide_schema, st.sampled_from(WIDTHS)),
            json_values().map(json.dumps),
            hostile_texts(shape),
        ),
        one_in=2,
    )


OUTPUT_SCHEMAS = (
    '{"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}',
    '{"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 1}',
    '{"type": "string", "pattern": "^[a-z]{2,8}$"}',
    '{"$defs": {"n": {"type": "number"}}, "type": "object",'
    ' "properties": {"x": {"$ref": "#/$defs/n"}}, "required": ["x"]}',
    '{"enum": ["yes", "no"]}',
    '{"not": {}}',
)
"""Output schemas the server takes (the last one no answer satisfies: OUTPUT_INVALID)."""
HOSTILE_OUTPUT_SCHEMAS = (
    '{"type": "string", "pattern": "(a+)+$"}',
    '{"type": "string", "pattern": "^(\\\\w*)*x"}',
    '{"type": "string", "pattern": "(a)\\\\1"}',
    '{"type": "string", "pattern": "(?:x{1,3})+"}',
    '{"type": "string", "pattern": "["}',
    '{"patternProperties": {"(a|a)*(b+)+": {}}}',
    '{"type": "string", "pattern": "' + "a" * 300 + '"}',
    '{"$ref": "https://example.com/remote.json"}',
    '{"$ref": "file:///etc/passwd"}',
    '{"$dynamicRef": "http://127.0.0.1:1/x"}',
    '{"$ref": "#/$defs/missing"}',
    '{"$id": "http://example.com/s", "$ref": "other.json"}',
)
"""Output schemas a hostile caller sends: catastrophic or invalid patterns, remote and
dangling references. Each must be INVALID_ARGUMENT, never a hung or INTERNAL call."""


def output_schemas(shape: Shape) -> SearchStrategy[Any]:
    """`output_schema_json`: mostly none, then valid, hostile, deep, wide, huge, not JSON."""
    if not shape.long_texts:
        return st.sampled_from(("",) * 4 + OUTPUT_SCHEMAS + HOSTILE_OUTPUT_SCHEMAS)
    hows = st.sampled_from(["object", "array", "anyOf", "brackets"])
    return either(
        st.one_of(st.sampled_from(("", *OUTPUT_SCHEMAS)), nested_schemas()),
        st.one_of(
            st.sampled_from(HOSTILE_OUTPUT_SCHEMAS + INVALID_SCHEMAS),
            st.builds(deep_schema, st.sampled_from(DEPTHS), hows),
            st.builds(wide_schema, st.sampled_from(WIDTHS)),
            json_values().map(json.dumps),
            hostile_texts(shape),
        ),
        one_in=2,
    )


# -- page tokens ------------------------------------------------------------------------------


HOSTILE_POSITIONS: tuple[Json, ...] = (2**63, 2**63 - 1, 2**64, -1, 0, 1e308, "x", [], [1, 2])
HOSTILE_POSITIONS += (
    "2024-01-01T00:00:00",
    "9999-12-31T23:59:59+00:00",
    "0001-01-01T00:00:00-23:59",
)
"""Keyset positions a forger would try: past 64 bits, negative, naive or extreme times."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def page_tokens() -> SearchStrategy[PageToken]:
    """Real tokens of each listing, as issued or tampered with."""
    changes = st.builds(
        TokenChange,
        st.sampled_from(["truncate", "extend", "flip", "payload"]),
        st.integers(0, 64),
        st.one_of(st.sampled_from(HOSTILE_POSITIONS), json_values()),
    )
    return st.builds(PageToken, st.sampled_from(["sessions", "steps", "runs"]), st.none() | changes)


def forged_tokens() -> SearchStrategy[str]:
    """Tokens nobody issued: random bytes, or JSON shaped like (or unlike) a position."""
    positions = st.fixed_dictionaries({"q": st.text(max_size=16), "p": json_values()})
    return st.one_of(
        st.binary(max_size=48).map(_b64),
        json_values().map(lambda value: _b64(json.dumps(value).encode())),
        positions.map(lambda value: _b64(json.dumps(value).encode())),
    )


# -- strings by field name --------------------------------------------------------------------

TOOL_NAMES = ("lookup", "calculate", "current_time", "echo", "get-weather", "a.b:c", "")
INPUTS = ("hello", "What is 12 * 7?", "what time is it", "(1+2)*3", "4/0", " ")


def _named_texts(name: str, shape: Shape) -> SearchStrategy[Any]:
    named = _texts_by_name(name, shape)
    return either(named, undecodable_texts(), one_in=2) if shape.undecodable else named


def _texts_by_name(name: str, shape: Shape) -> SearchStrategy[Any]:
    if name.endswith("session_id"):
        wrong_kind = st.sampled_from(RUN_REFS + CALL_REFS)
        return either(st.sampled_from(SESSION_REFS), st.one_of(wrong_kind, ids(shape)))
    if name == "run_id":
        wrong_kind = st.sampled_from(SESSION_REFS + CALL_REFS)
        return either(st.sampled_from(RUN_REFS), st.one_of(wrong_kind, ids(shape)))
    if name == "tool_call_id":
        return either(st.sampled_from(CALL_REFS), ids(shape))
    if name == "page_token":
        return either(page_tokens(), st.one_of(forged_tokens(), hostile_texts(shape)), one_in=2)
    if name == "parameters_json":
        return schemas(shape)
    if name == "output_schema_json":
        return output_schemas(shape)
    if name == "agent":
        return either(
            st.sampled_from(["assistant", "", "terse", "structured"]),
            st.one_of(st.just("nobody"), ids(shape)),
        )
    if name == "model":
        return either(st.sampled_from(["fake-model", "other-model"]), texts(shape))
    if name in ("name", "names"):
        return either(st.sampled_from(TOOL_NAMES), ids(shape))
    if name == "require_approval":
        return either(st.sampled_from((*TOOL_NAMES, "*")), ids(shape))
    if name == "input":
        return either(st.sampled_from(INPUTS), texts(shape, MIB + 1))
    if name == "request_id":
        return either(st.sampled_from(["req-1", "req-2"]), ids(shape))
    return texts(shape, MIB + 1 if name in BIG_TEXT_FIELDS else 64 * KIB + 1)


# -- the descriptor walk ----------------------------------------------------------------------

MANY = (64, 65, 128, 129, 1000, 1001, 5000)
_INTEGER_RANGES = {
    FieldDescriptor.TYPE_INT32: INT32,
    FieldDescriptor.TYPE_SINT32: INT32,
    FieldDescriptor.TYPE_SFIXED32: INT32,
    FieldDescriptor.TYPE_INT64: INT64,
    FieldDescriptor.TYPE_SINT64: INT64,
    FieldDescriptor.TYPE_SFIXED64: INT64,
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


USUALLY_SET = frozenset({"input", "run_id", "session_id", "tool_outputs", "tool_call_id"})
"""Fields a request does little without: set in all but one draw in eight (unset is as
hostile as empty). Other fields are as often unset as set."""
SOMETIMES_SET = frozenset({("agio.v1.RunRequest", "session_id")})
"""...except these: a Run on a new session is as usual as one on an old session."""


@dataclass(frozen=True, slots=True)
class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def _without_absent(fields: Fields) -> Fields:
    return {name: value for name, value in fields.items() if value is not ABSENT}


def message_fields(descriptor: Descriptor, shape: Shape) -> SearchStrategy[Fields]:
    """A subset of the message's fields, each with a value for its type."""
    usually: dict[str, SearchStrategy[Any]] = {}
    optional: dict[str, SearchStrategy[Any]] = {}
    for member in descriptor.fields:
        values = field_values(member, shape)
        name = member.name
        if name in USUALLY_SET and (descriptor.full_name, name) not in SOMETIMES_SET:
            usually[name] = either(values, st.just(ABSENT), one_in=8)
        else:
            optional[name] = values
    return st.fixed_dictionaries(usually, optional=optional).map(_without_absent)


def field_values(field: FieldDescriptor, shape: Shape) -> SearchStrategy[Any]:
    """The value of one field: a map, a list, or a single value."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        keys = single_values(entry.fields_by_name["key"], shape)
        values = single_values(entry.fields_by_name["value"], shape)
        small_values = single_values(entry.fields_by_name["value"], shape.small())

        def numbered(count: int, value: Any) -> dict[Any, Any]:
            return {f"k{i}": value for i in range(count)}

        return either(
            st.dictionaries(keys, values, max_size=3),
            st.builds(numbered, st.sampled_from(MANY), small_values),
        )
    if field.is_repeated:
        small_item = single_values(field, shape.small())

        def repeat(item: Any, count: int) -> list[Any]:
            return [item] * count

        return either(
            st.lists(single_values(field, shape), max_size=3),
            st.builds(repeat, small_item, st.sampled_from(MANY)),
        )
    return single_values(field, shape)


def single_values(field: FieldDescriptor, shape: Shape) -> SearchStrategy[Any]:
    """One value of the field's type, chosen with the field's name in mind."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        nested = field.message_type
        assert nested is not None
        if nested.full_name == "google.protobuf.Duration":
            return durations()
        return message_fields(nested, shape)
    if kind == FieldDescriptor.TYPE_STRING:
        return _named_texts(field.name, shape)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return enum_numbers(field.enum_type)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return doubles()
    return integers(*_INTEGER_RANGES[kind])


DEADLINES = (None, None, None, None, None, None, 0.001, 0.3, 2.0)
"""Mostly none; sometimes one that expires at once, soon, or later."""


def requests(rpcs: tuple[Rpc, ...], *, undecodable: bool = False) -> SearchStrategy[Case]:
    """A request for one of `rpcs`, with random and hostile fields."""
    shape = Shape(undecodable=undecodable)
    return st.one_of(
        [
            st.builds(
                Case, st.just(rpc), message_fields(rpc.request, shape), st.sampled_from(DEADLINES)
            )
            for rpc in rpcs
        ]
    )


def _has_strings(descriptor: Descriptor) -> bool:
    return any(
        field.type == FieldDescriptor.TYPE_STRING
        or (field.message_type is not None and _has_strings(field.message_type))
        for field in descriptor.fields
    )


def undecodable_requests(rpcs: tuple[Rpc, ...]) -> SearchStrategy[Case]:
    """Requests with at least one string (at any depth) that is not UTF-8."""
    with_strings = tuple(rpc for rpc in rpcs if _has_strings(rpc.request))
    return requests(with_strings, undecodable=True).filter(lambda case: case.holds(Undecodable))


# -- model streams ----------------------------------------------------------------------------

CHUNK_WORDS = (
    "id",
    "object",
    "created",
    "model",
    "choices",
    "index",
    "delta",
    "role",
    "content",
    "reasoning_content",
    "refusal",
    "tool_calls",
    "type",
    "function",
    "name",
    "arguments",
    "finish_reason",
    "logprobs",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "completion_tokens_details",
    "reasoning_tokens",
    "error",
    "message",
    "code",
)


def chunk(delta: dict[str, Json] | None = None, finish: str | None = None, **top: Json) -> Json:
    """A `chat.completion.chunk` with one choice, any top-level field replaced by `top`."""
    body: dict[str, Json] = {
        "id": "chatcmpl-fuzz",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    return body | top


def _call(index: int, call_id: str, name: str, arguments: str) -> dict[str, Json]:
    fragment: Json = {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"tool_calls": [fragment]}


_USAGE = chunk(
    choices=[],
    usage={
        "prompt_tokens": 12,
        "completion_tokens": 4,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": 1},
    },
)
_ROLE = chunk({"role": "assistant", "content": ""})
VALID_STREAMS: dict[str, tuple[Json, ...]] = {
    "text": (
        _ROLE,
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk(finish="stop"),
        _USAGE,
    ),
    "reasoning": (
        _ROLE,
        chunk({"reasoning_content": "think"}),
        chunk({"content": "ok"}),
        chunk(finish="stop"),
        _USAGE,
    ),
    "server tool": (
        _ROLE,
        chunk(_call(0, "call_fuzz_1", "echo", '{"text": ')),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"hi"}'}}]}),
        chunk(finish="tool_calls"),
        _USAGE,
    ),
    "client tool": (
        _ROLE,
        chunk(_call(0, "call_fuzz_2", "lookup", '{"q": "a"}')),
        chunk(_call(1, "call_fuzz_3", "echo", '{"text": "b"}')),
        chunk(finish="tool_calls"),
        _USAGE,
    ),
    "length": (_ROLE, chunk({"content": "cut"}), chunk(finish="length"), _USAGE),
    "filtered": (_ROLE, chunk({"content": "no"}), chunk(finish="content_filter"), _USAGE),
}


def json_kind(value: Json) -> str:
    """The JSON type of a value as a parser sees it (bool and int apart, int and float apart)."""
    return type(value).__name__


def _of_another_kind(kind: str, value: Json) -> bool:
    return json_kind(value) != kind


def leaf_paths(value: Json, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every path in a JSON value, the value itself last."""
    found: list[tuple[str | int, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += leaf_paths(item, (*path, index))
    found.append(path)
    return found


def _at(value: Json, path: tuple[str | int, ...]) -> Json:
    for step in path:
        value = value[step]  # type: ignore[index]
    return value


def replaced(value: Json, path: tuple[str | int, ...], new: Json | _Removed) -> Json:
    if not path:
        return None if isinstance(new, _Removed) else new
    head, rest = path[0], path[1:]
    if isinstance(value, dict) and isinstance(head, str):
        copy = dict(value)
        if not rest and isinstance(new, _Removed):
            del copy[head]
        else:
            copy[head] = replaced(value[head], rest, new)
        return copy
    if isinstance(value, list) and isinstance(head, int):
        items = list(value)
        if not rest and isinstance(new, _Removed):
            del items[head]
        else:
            items[head] = replaced(value[head], rest, new)
        return items
    raise AssertionError(f"no {head!r} in {value!r}")


@dataclass(frozen=True, slots=True)
class _Removed:
    def __repr__(self) -> str:
        return "REMOVED"


REMOVED = _Removed()


@dataclass(frozen=True, slots=True)
class Mutation:
    """One field of one chunk of a valid stream, replaced by a value of another JSON type (or
    removed)."""

    chunk: int
    path: tuple[str | int, ...]
    value: Json | _Removed


@dataclass(frozen=True, slots=True)
class ModelStream(ShownByRepr):
    """What the fake model sends: SSE `data` payloads, then `[DONE]`."""

    payloads: tuple[str, ...]
    base: str = ""
    """The valid stream it was mutated from, if any."""
    mutations: tuple[Mutation, ...] = field(default=())

    def __repr__(self) -> str:
        if self.base:
            return f"ModelStream(base={self.base!r}, mutations={self.mutations!r})"
        return f"ModelStream({self.payloads!r})"


def random_streams() -> SearchStrategy[ModelStream]:
    """Random JSON shapes made of the chunk's words (and, rarely, text that is not JSON)."""
    words = st.one_of(st.sampled_from(CHUNK_WORDS), st.text(max_size=6))
    payload = st.one_of(
        json_values(max_leaves=16, keys=words).map(json.dumps),
        st.dictionaries(words, json_values(keys=words), max_size=6).map(json.dumps),
        st.sampled_from(
            [
                "",
                "[DONE]",
                "{",
                "not json",
                '"\\ud800"',
                '{"choices": [{"delta": {"content": "\\ud800\\u0000"}}]}',
            ]
        ),
    )
    shapes = st.lists(payload, min_size=1, max_size=4).map(lambda items: ModelStream(tuple(items)))
    return either(shapes, big_streams(), one_in=40)


BIG_REPLY_SIZES = (4 * MIB + 1, 17 * MIB)
"""Above the agent's step limit (4 MiB by default), and above the gRPC message limit."""


def big_reply(what: Literal["content", "reasoning_content", "arguments"], size: int) -> ModelStream:
    """A well-formed reply whose text, reasoning or tool arguments are `size` bytes."""
    if what == "arguments":
        text = json.dumps({"text": "x" * size})
        middle = chunk(_call(0, "call_fuzz_big", "echo", text))
        finish = "tool_calls"
    else:
        middle = chunk({what: "x" * size})
        finish = "stop"
    chunks = (_ROLE, middle, chunk(finish=finish), _USAGE)
    return ModelStream(tuple(json.dumps(item) for item in chunks), f"{what} of {size} bytes")


def big_streams() -> SearchStrategy[ModelStream]:
    """Replies too big for a step (a huge text, or tool arguments whose result is huge)."""
    whats = st.sampled_from(["content", "reasoning_content", "arguments"])
    return st.builds(big_reply, whats, st.sampled_from(BIG_REPLY_SIZES))


@st.composite
def mutated_streams(draw: Callable[[SearchStrategy[Any]], Any]) -> ModelStream:
    """A valid stream with one or two fields replaced by values of another JSON type."""
    base: str = draw(st.sampled_from(sorted(VALID_STREAMS)))
    chunks: list[Json] = list(VALID_STREAMS[base])
    mutations: list[Mutation] = []
    for _ in range(draw(st.integers(1, 2))):
        index: int = draw(st.integers(0, len(chunks) - 1))
        path: tuple[str | int, ...] = draw(st.sampled_from(leaf_paths(chunks[index])))
        original = _at(chunks[index], path)
        kind = json_kind(original)
        other_type = json_values().filter(partial(_of_another_kind, kind))
        value: Json | _Removed = draw(
            other_type if not path else st.one_of(other_type, st.just(REMOVED))
        )
        chunks[index] = replaced(chunks[index], path, value)
        mutations.append(Mutation(index, path, value))
    payloads = tuple(json.dumps(item) for item in chunks)
    return ModelStream(payloads, base, tuple(mutations))
