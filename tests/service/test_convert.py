"""Domain <-> proto conversion details that the end-to-end tests cannot pin down exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import timestamp_pb2

from agio_grpc.service.convert import timestamp


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 11, 26, 3, 4, 5, 678901, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 1, 1, 5, 0, tzinfo=timezone(timedelta(hours=-3))),
        datetime(2020, 2, 29, 1, 2, 3, 456789),  # naive: taken as UTC
    ],
)
def test_timestamp_matches_protobuf_from_datetime(value: datetime) -> None:
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(value)
    assert timestamp(value) == expected


def test_timestamp_of_none_is_none() -> None:
    assert timestamp(None) is None
