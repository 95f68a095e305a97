"""Request checks shared by the servicers: ids, sequences, page sizes and page tokens.

Each check returns a `FieldViolation` or None, so a handler can collect every problem of a
request and report them together before touching the store.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from datetime import datetime
from typing import Any, Protocol, TypeVar

from agio_grpc.service.errors import FieldViolation, ServiceError, invalid_argument

MAX_ID_LENGTH = 128
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
MAX_PAGE_SIZE = 1000


def check_id(field: str, value: str, *, required: bool = True) -> FieldViolation | None:
    """An id must be 1..128 characters of letters, digits, `_ . : -`."""
    if not value:
        return FieldViolation(field, "is required") if required else None
    if len(value) > MAX_ID_LENGTH:
        return FieldViolation(field, f"must be at most {MAX_ID_LENGTH} characters")
    if not ID_PATTERN.match(value):
        return FieldViolation(field, "must contain only letters, digits and _ . : -")
    return None


def check_non_negative(field: str, value: int) -> FieldViolation | None:
    return FieldViolation(field, "must not be negative") if value < 0 else None


def check_positive(field: str, value: int) -> FieldViolation | None:
    return FieldViolation(field, "must be at least 1") if value < 1 else None


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


def _fingerprint(query: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(query, sort_keys=True).encode()).hexdigest()[:16]


def encode_page_token(query: dict[str, Any], position: list[Any]) -> str:
    """An opaque token holding the next position, bound to the query it came from."""
    payload = json.dumps({"q": _fingerprint(query), "p": position}, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode_page_token(token: str, query: dict[str, Any]) -> list[Any] | None:
    """The position in `token`, None for an empty token; INVALID_ARGUMENT when it is corrupt
    or was issued for a different query."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        payload = json.loads(base64.urlsafe_b64decode(padded.encode()))
        position = payload["p"]
        fingerprint = payload["q"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise invalid_argument(
            [FieldViolation("page_token", "is not a valid page token")]
        ) from None
    if fingerprint != _fingerprint(query) or not isinstance(position, list):
        raise invalid_argument([FieldViolation("page_token", "was issued for a different request")])
    return position


class TimeKeyed(Protocol):
    """A resource listed newest first by `(create_time, id)`."""

    @property
    def create_time(self) -> datetime: ...

    @property
    def id(self) -> str: ...


Keyed = TypeVar("Keyed", bound=TimeKeyed)


def trim_time_keyed_page(
    items: list[Keyed], limit: int, query: dict[str, Any]
) -> tuple[list[Keyed], str]:
    """Items fetched with `limit + 1` -> (the page, the next page token or "")."""
    if len(items) <= limit:
        return items, ""
    page = items[:limit]
    return page, encode_page_token(query, [page[-1].create_time.isoformat(), page[-1].id])


def time_key(position: list[Any] | None) -> tuple[datetime, str] | None:
    """A `(create_time, id)` keyset position from a decoded token."""
    if position is None:
        return None
    try:
        stamp, key = position
        return datetime.fromisoformat(stamp), str(key)
    except (ValueError, TypeError):
        raise invalid_argument(
            [FieldViolation("page_token", "is not a valid page token")]
        ) from None
