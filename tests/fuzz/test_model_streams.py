"""Whatever the model streams, the run ends typed: random JSON shapes and valid chunks with one
field of the wrong JSON type, served by the fake model to a real Run. The run ends with
exactly one terminal event, a stop the model can cause (never INTERNAL_ERROR), and its
session holds valid history. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from agio_grpc.testing import Turn
from agio_grpc.v1.resources_pb2 import StopReason
from tests.fuzz.harness import FuzzService
from tests.fuzz.profiles import BUDGET, STREAM_SETTINGS
from tests.fuzz.properties import check_example
from tests.fuzz.strategies import AGENT_RPCS, Case, ModelStream, mutated_streams, random_streams
from tests.fuzz.world import terminal_run

pytestmark = pytest.mark.timeout(BUDGET.timeout_s)

RUN = next(rpc for rpc in AGENT_RPCS if rpc.name == "Run")
MODEL_CAUSED_STOPS = frozenset(
    {
        StopReason.STOP_REASON_COMPLETED,
        StopReason.STOP_REASON_MAX_TOKENS,
        StopReason.STOP_REASON_CONTENT_FILTER,
        StopReason.STOP_REASON_REQUIRES_ACTION,
        StopReason.STOP_REASON_MODEL_ERROR,
        StopReason.STOP_REASON_CONTEXT_WINDOW,  # an error the model sends saying so
    }
)
RUN_WITH_A_CLIENT_TOOL = Case(
    RUN,
    {
        "input": "go",
        "client_tools": [
            {"name": "lookup", "parameters_json": '{"type": "object"}'},
        ],
    },
)


async def run_on(fuzz_service: FuzzService, prop: str, stream: ModelStream) -> None:
    """A Run whose first model call is answered by `stream`: it ends once, typed."""
    (outcome,) = await check_example(
        fuzz_service, prop, [RUN_WITH_A_CLIENT_TOOL], turns=[Turn.raw(*stream.payloads)]
    )
    assert fuzz_service.model.pending == 0, "the run never asked the model"
    assert outcome.events, f"no events: {outcome.code.name} {outcome.details!r}"
    run = terminal_run(outcome.events[-1])
    assert run is not None
    assert run.stop_signal.reason in MODEL_CAUSED_STOPS, (
        f"stopped {StopReason.Name(run.stop_signal.reason)}: {run.stop_signal.message!r}"
    )


@STREAM_SETTINGS
@given(stream=random_streams())
def test_a_stream_of_random_json_shapes_ends_the_run_typed(
    fuzz_service: FuzzService, stream: ModelStream
) -> None:
    fuzz_service.run(run_on(fuzz_service, "random model streams", stream))


@STREAM_SETTINGS
@given(stream=mutated_streams())
def test_a_chunk_with_a_field_of_the_wrong_type_ends_the_run_typed(
    fuzz_service: FuzzService, stream: ModelStream
) -> None:
    fuzz_service.run(run_on(fuzz_service, "mutated model streams", stream))
