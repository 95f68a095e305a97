"""Every RPC of AgentService and SessionService, with random and hostile requests aimed at real
sessions and runs: each answer is OK or a documented status with an ErrorInfo (never INTERNAL
or UNKNOWN), each run's stream ends with exactly one terminal event, and the sessions
touched hold valid history afterwards (properties.py). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.harness import FuzzService
from tests.fuzz.profiles import BUDGET, REQUEST_SETTINGS
from tests.fuzz.properties import check_example
from tests.fuzz.strategies import (
    AGENT_RPCS,
    SESSION_RPCS,
    Case,
    requests,
    undecodable_requests,
)

pytestmark = pytest.mark.timeout(BUDGET.timeout_s)

RUNS_WITH_SCHEMAS = tuple(rpc for rpc in AGENT_RPCS if rpc.name in ("Run", "StartRun"))
"""The RPCs that take an `output_schema_json` (hostile ones among the fuzzed schemas)."""


@REQUEST_SETTINGS
@given(case=requests(AGENT_RPCS))
def test_agent_service_answers_every_request_ok_or_with_a_documented_error(
    fuzz_service: FuzzService, case: Case
) -> None:
    fuzz_service.run(check_example(fuzz_service, "agent service requests", [case]))


@REQUEST_SETTINGS
@given(case=requests(RUNS_WITH_SCHEMAS))
def test_output_schemas_are_taken_or_refused_never_internal(
    fuzz_service: FuzzService, case: Case
) -> None:
    fuzz_service.run(check_example(fuzz_service, "output schemas", [case]))


@REQUEST_SETTINGS
@given(case=requests(SESSION_RPCS))
def test_session_service_answers_every_request_ok_or_with_a_documented_error(
    fuzz_service: FuzzService, case: Case
) -> None:
    fuzz_service.run(check_example(fuzz_service, "session service requests", [case]))


@REQUEST_SETTINGS
@given(case=undecodable_requests(AGENT_RPCS + SESSION_RPCS))
def test_a_request_that_is_not_utf8_is_an_invalid_argument(
    fuzz_service: FuzzService, case: Case
) -> None:
    fuzz_service.run(check_example(fuzz_service, "undecodable requests", [case]))


@REQUEST_SETTINGS
@given(cases=st.lists(requests(AGENT_RPCS + SESSION_RPCS), min_size=2, max_size=5))
def test_requests_in_a_row_on_the_same_sessions_keep_their_history_valid(
    fuzz_service: FuzzService, cases: list[Case]
) -> None:
    fuzz_service.run(check_example(fuzz_service, "request sequences", cases))
