"""Request checks shared by the servicers: ids, integer ranges, durations, sizes, client
tool schemas, U+0000 in any string, page sizes and page tokens.

Each check returns a `FieldViolation` or None (or a list of them), so a handler can collect
every problem of a request and report them together before touching the engine or the
store. Nothing here reads the store; sizes come from `RequestLimitsConfig`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

from google.protobuf import duration_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from agio_grpc.config import RequestLimitsConfig
from agio_grpc.domain import DEFAULT_TENANT
from agio_grpc.service.errors import FieldViolation, ServiceError, invalid_argument

MAX_ID_LENGTH = 128
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
MAX_PAGE_SIZE = 1000
MAX_PAGE_TOKEN_LENGTH = 1024
"""Far above what `encode_page_token` makes; a longer token is forged."""
MAX_INT64 = 2**63 - 1
"""The largest sequence or count the stores hold (64-bit columns on every backend)."""
NANOS_PER_SECOND = 1_000_000_000


def check_id(field: str, value: str, *, required: bool = True) -> FieldViolation | None:
    """An id must be 1..128 characters of letters, digits, `_ . : -`."""
    if not value:
        return FieldViolation(field, "is required") if required else None
    if len(value) > MAX_ID_LENGTH:
        return FieldViolation(field, f"must be at most {MAX_ID_LENGTH} characters")
    if not ID_PATTERN.match(value):
        return FieldViolation(field, "must contain only letters, digits and _ . : -")
    return None


def check_range(
    field: str, value: int, minimum: int, maximum: int = MAX_INT64
) -> FieldViolation | None:
    """An integer within `minimum..maximum` (both included)."""
    if value < minimum:
        return FieldViolation(field, f"must be at least {minimum}")
    if value > maximum:
        return FieldViolation(field, f"must be at most {maximum}")
    return None


def check_non_negative(field: str, value: int) -> FieldViolation | None:
    """0..2^63-1: a cursor or an optional bound, where 0 means none."""
    if value < 0:
        return FieldViolation(field, "must not be negative")
    return check_range(field, value, 0)


def check_positive(field: str, value: int) -> FieldViolation | None:
    """1..2^63-1: a sequence that must name a step."""
    return check_range(field, value, 1)


def check_duration(
    field: str, value: duration_pb2.Duration, maximum_s: float
) -> FieldViolation | None:
    """A well-formed, positive `Duration` of at most `maximum_s` seconds."""
    seconds, nanos = value.seconds, value.nanos
    if not -NANOS_PER_SECOND < nanos < NANOS_PER_SECOND:
        return FieldViolation(field, "nanos must be between -999999999 and 999999999")
    if (seconds < 0 < nanos) or (nanos < 0 < seconds):
        return FieldViolation(field, "seconds and nanos must have the same sign")
    if seconds < 0 or nanos < 0 or (seconds == 0 and nanos == 0):
        return FieldViolation(field, "must be positive")
    if seconds + nanos / NANOS_PER_SECOND > maximum_s:
        return FieldViolation(
            field, f"must be at most {maximum_s:g}s (the server's max_run_timeout_s)"
        )
    return None


def duration_seconds(value: duration_pb2.Duration) -> float:
    """A `Duration` checked by `check_duration` as seconds (no timedelta: it overflows)."""
    return value.seconds + value.nanos / NANOS_PER_SECOND


def _utf8_size_over(text: str, limit: int) -> bool:
    # A character takes 1 to 4 bytes: most texts are decided without encoding them.
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


def check_size(field: str, text: str, limit: int) -> FieldViolation | None:
    """A text of at most `limit` UTF-8 bytes."""
    if _utf8_size_over(text, limit):
        return FieldViolation(field, f"must be at most {limit} bytes (UTF-8)")
    return None


def nul_violations(message: Message) -> list[FieldViolation]:
    """Every string in `message` holding U+0000, found by walking its descriptor: nested,
    repeated and map fields (keys and values) included, `Struct`/`Value` too.

    PostgreSQL cannot store U+0000 in text, so it is refused at the edge, for every backend
    alike. Walks with a queue, not recursion; only fields that are set are visited, and a
    field's path is spelled out only for a hit or a message to descend into.
    """
    found: list[FieldViolation] = []
    pending: deque[tuple[str, Message]] = deque([("", message)])
    while pending:
        prefix, current = pending.popleft()
        for field, value in current.ListFields():
            path = prefix + field.name
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                for key, item in value.items():
                    if isinstance(key, str) and "\x00" in key:
                        found.append(FieldViolation(path, "a key must not contain U+0000"))
                    where = partial(map_entry_path, path, key)
                    _walk_value(where, value_field, item, found, pending)
            elif field.is_repeated:
                for index, item in enumerate(value):
                    _walk_value(partial(_indexed, path, index), field, item, found, pending)
            else:
                _walk_value(partial(str, path), field, value, found, pending)
    return found


def _indexed(path: str, index: int) -> str:
    return f"{path}[{index}]"


def map_entry_path(path: str, key: object, shown: int = 64) -> str:
    """The field path of a map entry, `metadata["tenant"]`: the key quoted and escaped as
    JSON, cut to `shown` characters so a huge key never makes a huge error."""
    text = str(key)
    if len(text) > shown:
        text = text[: shown - 3] + "..."
    return f"{path}[{json.dumps(text)}]"


def _walk_value(
    path: Callable[[], str],
    field: FieldDescriptor,
    value: Any,
    found: list[FieldViolation],
    pending: deque[tuple[str, Message]],
) -> None:
    if field.type == FieldDescriptor.TYPE_STRING:
        if "\x00" in value:
            found.append(FieldViolation(path(), "must not contain U+0000"))
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        pending.append((f"{path()}.", value))


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[][{}]")


def _outside_strings(text: str) -> str:
    return _JSON_STRING.sub("", text)


def json_nesting_over(text: str, limit: int) -> bool:
    """Whether JSON text nests arrays and objects more than `limit` deep (the top level is
    1), found by counting brackets outside strings: no parsing, so no recursion.

    Exact for valid JSON; for invalid JSON it counts at least as deep as a parser gets
    before it finds the error, so parsing text that passes never recurses deeper.
    """
    depth = 0
    for bracket in _JSON_BRACKET.findall(_outside_strings(text)):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def check_tool_schema(
    field: str, text: str, max_bytes: int, max_depth: int
) -> FieldViolation | None:
    """A client tool's `parameters_json`: empty (no parameters), or a JSON object of at
    most `max_bytes` and `max_depth` levels that is a valid JSON Schema (checked against
    the metaschema its `$schema` names, draft 2020-12 when it names none or one unknown)."""
    if not text:
        return None
    if violation := check_size(field, text, max_bytes):
        return violation
    if json_nesting_over(text, max_depth):
        return FieldViolation(field, f"must not nest more than {max_depth} levels deep")
    try:
        schema = json.loads(text)
    except ValueError as error:
        return FieldViolation(field, f"is not valid JSON: {error}")
    if not isinstance(schema, dict):
        return FieldViolation(field, "must be a JSON object (a JSON Schema)")
    declared = schema.get("$schema")
    # A `$schema` that is not a string is left to the default metaschema to refuse.
    checker = (
        validator_for(schema, default=Draft202012Validator)
        if isinstance(declared, str)
        else Draft202012Validator
    )
    try:
        checker.check_schema(schema)
    except SchemaError as error:
        where = "/" + "/".join(str(part) for part in error.absolute_path)
        # The message quotes the offending value; errors.invalid_argument cuts it short.
        return FieldViolation(field, f"is not a valid JSON Schema: at {where}: {error.message}")
    return None


class ToolSchemaChecks:
    """`check_tool_schema` for all client tools of a request, within a budget, off the
    event loop, and once per distinct schema.

    Checking against the metaschema is slow (jsonschema 4.26, draft 2020-12: 1.5 ms for a
    three-property schema, up to about 0.5 ms per JSON object), so: the objects of a
    request's schemas are counted first against `max_tool_schema_objects` (cheaply, without
    parsing); schemas not seen before are checked in a worker thread; and the digests of
    schemas that passed are remembered (least recently used out), since clients send the
    same tools with every run. What is refused never depends on what is remembered.
    """

    def __init__(self, limits: RequestLimitsConfig, remembered: int = 4096) -> None:
        self._limits = limits
        self._remembered = remembered
        self._passed: OrderedDict[bytes, None] = OrderedDict()

    async def violations(self, schemas: list[tuple[str, str]]) -> list[FieldViolation]:
        """The violations of `(field, parameters_json)` pairs (empty texts pass)."""
        limits = self._limits
        found: list[FieldViolation] = []
        unseen: list[tuple[str, str, bytes]] = []
        objects = 0
        for field, text in schemas:
            if not text:
                continue
            if violation := check_size(field, text, limits.max_tool_schema_bytes):
                found.append(violation)
                continue
            objects += _outside_strings(text).count("{")
            digest = hashlib.sha256(text.encode()).digest()
            if digest in self._passed:
                self._passed.move_to_end(digest)
            else:
                unseen.append((field, text, digest))
        if objects > limits.max_tool_schema_objects:
            found.append(
                FieldViolation(
                    "client_tools",
                    f"the parameter schemas hold {objects} JSON objects in all; "
                    f"at most {limits.max_tool_schema_objects}",
                )
            )
            return found
        if unseen:
            checked = await asyncio.to_thread(self._check, unseen)
            for (_, _, digest), violation in zip(unseen, checked, strict=True):
                if violation is None:
                    self._remember(digest)
                else:
                    found.append(violation)
        return found

    def _check(self, unseen: list[tuple[str, str, bytes]]) -> list[FieldViolation | None]:
        limits = self._limits
        return [
            check_tool_schema(
                field, text, limits.max_tool_schema_bytes, limits.max_tool_schema_depth
            )
            for field, text, _ in unseen
        ]

    def _remember(self, digest: bytes) -> None:
        self._passed[digest] = None
        while len(self._passed) > self._remembered:
            self._passed.popitem(last=False)


def raise_if_any(*violations: FieldViolation | None) -> None:
    """Raise one INVALID_ARGUMENT naming every violation found."""
    found = [v for v in violations if v is not None]
    if found:
        raise invalid_argument(found)


def page_size(value: int, default: int) -> int:
    """0 means the default; negative is invalid; above the maximum is clamped (AIP-158)."""
    if value < 0:
        raise invalid_argument([FieldViolation("page_size", "must not be negative")])
    if value == 0:
        return default
    return min(value, MAX_PAGE_SIZE)


def bad_page_token() -> ServiceError:
    return invalid_argument([FieldViolation("page_token", "is not a valid page token")])


def fitting(messages: Sequence[Message], budget: int) -> int:
    """How many of `messages`, in order, fit in `budget` bytes (at least one, so a page
    always moves on)."""
    used = 0
    for count, message in enumerate(messages):
        used += message.ByteSize()
        if used > budget and count:
            return count
    return len(messages)


class PageTokens:
    """Opaque page tokens: the next position and the query they continue, signed.

    A token is `payload.signature` in base64url, the signature an HMAC-SHA256 (truncated to
    16 bytes) of the payload with `key`; the service uses the key kept in the store
    (`server_secret`), so every replica accepts every other's tokens. A token that is not
    one of these, or that another server (another key) signed, or that another request
    issued, is INVALID_ARGUMENT; positions inside a valid one are checked all the same. The
    servicers sign each call's tokens with its tenant's key (`for_tenant`), so a token works
    for the tenant it was issued to only.
    """

    def __init__(self, key: bytes | None = None) -> None:
        """`key`: the signing key (a random one, for this process only, when None)."""
        self._key = key if key is not None else secrets.token_bytes(32)

    def for_tenant(self, tenant: str) -> PageTokens:
        """The tokens of `tenant`'s calls, signed with a key of its own (derived from this
        one): a token issued to another tenant is refused exactly as a forged one is. The
        default tenant's are signed with this key itself, so the tokens a server issued
        before tenants existed (a replica not yet upgraded) still work for its callers."""
        if tenant == DEFAULT_TENANT:
            return self
        name = b"tenant:" + tenant.encode("utf-8", "surrogatepass")
        return PageTokens(hmac.digest(self._key, name, "sha256"))

    def encode(self, query: dict[str, Any], position: list[Any]) -> str:
        """A token holding the next position, bound to the query it came from."""
        payload = json.dumps({"q": _fingerprint(query), "p": position}, separators=(",", ":"))
        body = payload.encode()
        return f"{_b64(body)}.{_b64(self._sign(body))}"

    def decode(self, token: str, query: dict[str, Any]) -> list[Any] | None:
        """The position in `token`, None for an empty token; INVALID_ARGUMENT when it is
        not a token this service signed, or was issued for a different query."""
        if not token:
            return None
        if len(token) > MAX_PAGE_TOKEN_LENGTH:
            raise bad_page_token()
        body_part, dot, signature_part = token.partition(".")
        try:
            body = _unb64(body_part)
            signature = _unb64(signature_part)
        except (ValueError, binascii.Error):
            raise bad_page_token() from None
        if not dot or not hmac.compare_digest(signature, self._sign(body)):
            raise bad_page_token()
        try:
            text = body.decode()
            if json_nesting_over(text, 3):  # {"q": ..., "p": [...]}: deeper is not ours
                raise bad_page_token()
            payload = json.loads(text)
            position = payload["p"]
            fingerprint = payload["q"]
        except (ValueError, KeyError, TypeError):
            raise bad_page_token() from None
        if fingerprint != _fingerprint(query) or not isinstance(position, list):
            raise invalid_argument(
                [FieldViolation("page_token", "was issued for a different request")]
            )
        return position

    def trim_time_keyed(
        self, items: list[Keyed], limit: int, query: dict[str, Any]
    ) -> tuple[list[Keyed], str]:
        """Items fetched with `limit + 1` -> (the page, the next page token or "")."""
        if len(items) <= limit:
            return items, ""
        page = items[:limit]
        return page, self.encode(query, [page[-1].create_time.isoformat(), page[-1].id])

    def _sign(self, body: bytes) -> bytes:
        return hmac.digest(self._key, body, "sha256")[:_SIGNATURE_BYTES]


_SIGNATURE_BYTES = 16


def _fingerprint(query: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(query, sort_keys=True).encode()).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    if not text.isascii():
        raise ValueError("not base64")
    return base64.urlsafe_b64decode((text + "=" * (-len(text) % 4)).encode())


def sequence_key(position: list[Any] | None, highest: int = MAX_INT64) -> int | None:
    """A one-integer position from a decoded token (a sequence, an index): 1..`highest`."""
    if position is None:
        return None
    if len(position) != 1:
        raise bad_page_token()
    (key,) = position
    if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key <= highest:
        raise bad_page_token()
    return key


class TimeKeyed(Protocol):
    """A resource listed newest first by `(create_time, id)`."""

    @property
    def create_time(self) -> datetime: ...

    @property
    def id(self) -> str: ...


Keyed = TypeVar("Keyed", bound=TimeKeyed)


def time_key(position: list[Any] | None) -> tuple[datetime, str] | None:
    """A `(create_time, id)` keyset position from a decoded token."""
    if position is None:
        return None
    try:
        stamp, key = position
        moment = datetime.fromisoformat(stamp)
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC)
    except (ValueError, TypeError, OverflowError):
        raise bad_page_token() from None
    # The service issues UTC times only: a naive one would not compare with stored times.
    if moment.tzinfo is None or not isinstance(key, str) or check_id("", key) is not None:
        raise bad_page_token()
    return moment, key
