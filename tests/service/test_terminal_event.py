"""Exactly one terminal event ends every run stream, even when an event cannot be encoded.

An event the converter fails on must not cut the client's stream while the run goes on in
the server: its place (and seq) is taken by an `error` event, the run is ended server-side,
and the stream closes with the run's terminal event; when the terminal event itself cannot
be encoded, with a minimal `run_failed` INTERNAL_ERROR for the run.

No real input makes the converter fail any more: the shapes that did (a lone surrogate in
model content or a tool result, a tool name that is a number) are refused or replaced at
the model and store boundaries before an event carries them. So these tests make
`convert.event_to_proto` fail for one chosen event, and only that one, in the server
running in this process. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.service import convert
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import events_pb2
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason

TERMINAL = ("run_completed", "run_failed")


def fail_to_encode(monkeypatch: pytest.MonkeyPatch, kind: str) -> list[int]:
    """Make the converter raise on the first event of `kind` (`step_started`, ...); the
    returned list receives the seq it failed on."""
    real = convert.event_to_proto
    failed: list[int] = []

    def event_to_proto(event: SequencedEvent) -> events_pb2.StepEvent:
        if event.event.type == kind and not failed:
            failed.append(event.seq)
            raise ValueError("this event cannot be encoded")
        return real(event)

    monkeypatch.setattr(convert, "event_to_proto", event_to_proto)
    return failed


def assert_one_terminal_event(events: list[events_pb2.StepEvent]) -> events_pb2.StepEvent:
    """Gapless seqs from 1, one terminal event, last; returns it."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [e.WhichOneof("event") for e in events]
    assert [k for k in kinds if k in TERMINAL] == [kinds[-1]], kinds
    return events[-1]


async def test_an_unencodable_event_ends_the_run_and_the_stream_still_gets_its_end(
    backend_client: AgioClient,
    fake_model: FakeModelServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_model.enqueue(Turn.hanging())  # the run would go on forever unless ended
    failed = fail_to_encode(monkeypatch, "step_started")

    events = [event async for event in backend_client.run("hello")]

    last = assert_one_terminal_event(events)
    (seq,) = failed
    stand_in = events[seq - 1]
    assert stand_in.WhichOneof("event") == "error"
    assert (stand_in.error.reason, stand_in.error.source) == (convert.EVENT_NOT_SENDABLE, "server")
    stored = await backend_client.get_run(last.run_id)
    assert stored.status == RunStatus.RUN_STATUS_FAILED
    assert stored.stop_signal.source == "server"
    assert last.WhichOneof("event") == "run_failed"
    final = last.run_failed.run
    assert (final.status, final.stop_signal.reason) == (
        RunStatus.RUN_STATUS_FAILED,
        StopReason.STOP_REASON_INTERNAL_ERROR,
    )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "could not be encoded" in errors[0].getMessage()


async def test_an_unencodable_terminal_event_becomes_a_minimal_run_failed(
    backend_client: AgioClient, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model.enqueue(Turn.text("all done"))
    failed = fail_to_encode(monkeypatch, "run_completed")

    events = [event async for event in backend_client.run("hello")]

    last = assert_one_terminal_event(events)
    assert failed == [last.seq]
    assert last.WhichOneof("event") == "run_failed"
    run = last.run_failed.run
    assert (run.id, run.session_id) == (last.run_id, last.session_id)
    assert run.status == RunStatus.RUN_STATUS_FAILED
    assert run.stop_signal.reason == StopReason.STOP_REASON_INTERNAL_ERROR
    assert run.stop_signal.source == "server"
    # The run itself had ended: the stream only could not say how.
    stored = await backend_client.get_run(last.run_id)
    assert stored.status == RunStatus.RUN_STATUS_COMPLETED


async def test_a_watcher_that_cannot_encode_an_event_ends_the_run_too(
    backend_client: AgioClient, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model.enqueue(Turn.hanging())
    started = await backend_client.start_run("hello")
    failed = fail_to_encode(monkeypatch, "step_started")

    events = [event async for event in backend_client.watch_run(started.id)]

    assert_one_terminal_event(events)
    assert events[failed[0] - 1].error.reason == convert.EVENT_NOT_SENDABLE
    stored = await backend_client.get_run(started.id)
    assert stored.status == RunStatus.RUN_STATUS_FAILED
    assert stored.stop_signal.reason == StopReason.STOP_REASON_INTERNAL_ERROR
    assert stored.stop_signal.source == "server"
