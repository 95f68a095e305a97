"""`copy_of`, the copy behind a run's snapshots and every stored copy of a run or a step:
what `dataclasses.replace` gives, for every field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agio_grpc.domain import (
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StepMetrics,
    StopReason,
    StopSignal,
    Usage,
    copy_of,
)


def _every_field_set(value: Any) -> Any:
    """`value` with a marker of its own in each field (the classes check no types), so a
    copy that dropped or swapped one differs."""
    for field in dataclasses.fields(value):
        setattr(value, field.name, object())
    return value


@pytest.mark.parametrize(
    "value",
    [
        Run(session_id="sess_1", agent="assistant"),
        Step("sess_1", "run_1", Role.ASSISTANT, content="hi"),
        Session(),
        Usage(),
        StepMetrics(),
        StopSignal(StopReason.COMPLETED),
    ],
    ids=lambda value: type(value).__name__,
)
def test_a_copy_has_every_field_of_the_original_and_is_another_object(value: Any) -> None:
    original = _every_field_set(value)
    copied = copy_of(original)
    assert copied is not original
    for field in dataclasses.fields(original):
        assert getattr(copied, field.name) is getattr(original, field.name)  # shallow


def test_changes_are_set_on_the_copy_only() -> None:
    run = Run(session_id="sess_1", agent="assistant")
    ended = copy_of(run, status=RunStatus.COMPLETED, step_count=3)
    assert (ended.status, ended.step_count) == (RunStatus.COMPLETED, 3)
    assert (run.status, run.step_count) == (RunStatus.RUNNING, 0)
    assert ended == dataclasses.replace(run, status=RunStatus.COMPLETED, step_count=3)


def test_a_change_of_no_field_is_refused() -> None:
    with pytest.raises(AttributeError):
        copy_of(Usage(), no_such_field=1)


def test_a_dataclass_with_a_field_init_does_not_take_is_refused() -> None:
    @dataclasses.dataclass
    class Counted:
        name: str
        size: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match="init fields only"):
        copy_of(Counted("a"))
