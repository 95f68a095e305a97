"""Stop reasons: their priority order, how ties are broken, and the run status each leaves;
a signal's copy, and a run's snapshot for an event."""

from __future__ import annotations

import pytest

from agio_grpc.domain import (
    Run,
    RunStatus,
    StopReason,
    StopSignal,
    pick_stop_signal,
    status_for,
)

DESIGN_ORDER = [
    "INTERNAL_ERROR",
    "INTERRUPTED",
    "CANCELLED",
    "TIMEOUT",
    "MODEL_ERROR",
    "TOOL_ERROR",
    "OUTPUT_INVALID",  # DESIGN.md section 10: a failure, above every limit
    "CONTENT_FILTER",
    "CONTEXT_WINDOW",  # DESIGN.md section 9: next to TOKEN_BUDGET
    "TOKEN_BUDGET",
    "MAX_TOKENS",
    "TOOL_STOP",
    "REQUIRES_ACTION",
    "MAX_STEPS",
    "COMPLETED",
]


def test_stop_reasons_are_ordered_by_design_priority() -> None:
    by_priority = sorted(StopReason, key=lambda reason: reason.priority)
    assert [reason.value for reason in by_priority] == DESIGN_ORDER


def test_the_strongest_signal_wins_whatever_the_order_raised() -> None:
    signals = [
        StopSignal(StopReason.COMPLETED),
        StopSignal(StopReason.REQUIRES_ACTION),
        StopSignal(StopReason.TOOL_STOP, source="tool:finish"),
        StopSignal(StopReason.MAX_STEPS),
    ]
    for rotation in range(len(signals)):
        rotated = signals[rotation:] + signals[:rotation]
        picked = pick_stop_signal(rotated)
        assert picked is not None
        assert picked.reason is StopReason.TOOL_STOP


def test_ties_keep_the_first_signal_raised() -> None:
    first = StopSignal(StopReason.TOOL_STOP, "first", "tool:a")
    second = StopSignal(StopReason.TOOL_STOP, "second", "tool:b")
    assert pick_stop_signal([first, second]) is first
    assert pick_stop_signal([second, first]) is second


def test_no_signal_picks_none() -> None:
    assert pick_stop_signal([]) is None


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (StopReason.COMPLETED, RunStatus.COMPLETED),
        (StopReason.MAX_STEPS, RunStatus.COMPLETED),
        (StopReason.CONTEXT_WINDOW, RunStatus.COMPLETED),
        (StopReason.MAX_TOKENS, RunStatus.COMPLETED),
        (StopReason.CONTENT_FILTER, RunStatus.COMPLETED),
        (StopReason.TOKEN_BUDGET, RunStatus.COMPLETED),
        (StopReason.TOOL_STOP, RunStatus.COMPLETED),
        (StopReason.REQUIRES_ACTION, RunStatus.REQUIRES_ACTION),
        (StopReason.CANCELLED, RunStatus.CANCELLED),
        (StopReason.TIMEOUT, RunStatus.CANCELLED),
        (StopReason.INTERRUPTED, RunStatus.INTERRUPTED),
        (StopReason.MODEL_ERROR, RunStatus.FAILED),
        (StopReason.TOOL_ERROR, RunStatus.FAILED),
        (StopReason.OUTPUT_INVALID, RunStatus.FAILED),
        (StopReason.INTERNAL_ERROR, RunStatus.FAILED),
    ],
)
def test_each_stop_reason_leaves_one_run_status(reason: StopReason, status: RunStatus) -> None:
    assert status_for(reason) is status
    assert (status is RunStatus.FAILED) == reason.is_error


def test_a_signal_s_copy_shares_nothing_the_original_may_change() -> None:
    context = {"calls": [{"id": "call_1", "args": {"path": "/tmp"}}]}
    signal = StopSignal(StopReason.REQUIRES_ACTION, "approve", "loop", context, True, 3)
    copied = signal.copied()
    assert copied == signal
    signal.context["calls"][0]["args"]["path"] = "/etc"
    signal.context["other"] = 1
    assert copied.context == {"calls": [{"id": "call_1", "args": {"path": "/tmp"}}]}

    bare = StopSignal(StopReason.COMPLETED)
    bare_copy = bare.copied()
    bare.context["late"] = True
    assert bare_copy == StopSignal(StopReason.COMPLETED)


def test_a_run_s_snapshot_keeps_its_stop_signal_as_it_was() -> None:
    run = Run(session_id="sess_1", agent="assistant")
    assert run.snapshot().stop_signal is None
    run.stop_signal = StopSignal(StopReason.TIMEOUT, "late", context={"after_s": [1.5]})
    snapshot = run.snapshot()
    run.stop_signal.context["after_s"].append(9.0)
    run.stop_signal.message = "changed"
    assert snapshot.stop_signal == StopSignal(
        StopReason.TIMEOUT, "late", context={"after_s": [1.5]}
    )
