"""Domain <-> proto conversion details that the end-to-end tests cannot pin down exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import timestamp_pb2

from agio_grpc.engine import events
from agio_grpc.service.convert import event_to_proto, timestamp
from agio_grpc.v1 import events_pb2


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


@pytest.mark.parametrize(
    "delta",
    [
        events.StepDelta("step_1", content="hello ", sequence=3),
        events.StepDelta("step_1", reasoning_content="thinking", sequence=3),
        events.StepDelta(
            "step_1",
            tool_calls=(
                events.ToolCallDelta(0, id="call_1", name="lookup", arguments='{"q"'),
                events.ToolCallDelta(1, arguments=': "x"}'),
            ),
            sequence=4,
        ),
        events.StepDelta("step_1"),  # nothing in it: still a delta
    ],
    ids=["content", "reasoning", "tool calls", "empty"],
)
@pytest.mark.parametrize(
    "time",
    [datetime(2026, 11, 26, 3, 4, 5, 678901, tzinfo=UTC), datetime(2020, 2, 29, 1, 2, 3)],
    ids=["aware", "naive"],
)
def test_a_delta_converts_to_the_message_built_field_by_field(
    delta: events.StepDelta, time: datetime
) -> None:
    expected = events_pb2.StepEvent(
        run_id="run_1",
        session_id="sess_1",
        seq=7,
        time=timestamp(time),
        step_delta=events_pb2.StepDeltaEvent(
            step_id=delta.step_id,
            sequence=delta.sequence,
            content=delta.content,
            reasoning_content=delta.reasoning_content,
            tool_calls=[
                events_pb2.ToolCallDelta(
                    index=call.index, id=call.id, name=call.name, arguments=call.arguments
                )
                for call in delta.tool_calls
            ],
        ),
    )

    converted = event_to_proto(events.SequencedEvent("run_1", "sess_1", 7, time, delta))

    assert converted == expected
    assert converted.WhichOneof("event") == "step_delta"
