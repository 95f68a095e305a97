"""Sessions of a given size for the store benchmarks, stored as the service stores them: a
run's start on a new session with the first thousand steps, the rest appended by that run
in batches of a thousand, then the run's end."""

from __future__ import annotations

from collections.abc import Callable

from agio_grpc.domain import Role, Run, Session, Step, StopReason, StopSignal, ToolCall
from agio_grpc.store.sql import SqlStore

BATCH = 1000


async def stored_session(store: SqlStore, steps_of: Callable[[str], list[Step]]) -> str:
    """The id of a new session holding `steps_of(its id)` (at least one step)."""
    session = Session()
    run = Run(session_id=session.id, agent="bench")
    steps = steps_of(session.id)
    started = await store.ledger.start_run(run, steps[:BATCH], new_session=session)
    for start in range(BATCH, len(steps), BATCH):
        await store.log.append_steps(steps[start : start + BATCH], held_by=run.id)
    await store.ledger.end_run(started.run.ended(StopSignal(StopReason.COMPLETED)))
    return session.id


def tool_rounds(session_id: str, count: int) -> list[Step]:
    """`count` steps of `session_id` in rounds of four: a question, a `calculate` call, its
    result, the answer."""
    steps: list[Step] = []
    for index in range(count):
        match index % 4:
            case 0:
                steps.append(Step(session_id, "run_b", Role.USER, content=f"question {index}"))
            case 1:
                call = ToolCall(f"call_{index}", "calculate", '{"expression": "2 + 2"}')
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, tool_calls=[call]))
            case 2:
                steps.append(
                    Step(
                        session_id,
                        "run_b",
                        Role.TOOL,
                        content="4",
                        tool_call_id=f"call_{index - 1}",
                        name="calculate",
                    )
                )
            case _:
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, content="The answer is 4."))
    return steps
