"""The service under fuzz: a real server on one backend, the fake model, a raw channel, and
the tally of what the examples saw.

Hypothesis drives synchronous test functions, so the server and every call run on an event
loop this module owns (`FuzzService.run`); the loop is idle between examples. Calls go over
the channel as bytes with identity serializers, so a request can carry what the generated
classes refuse to encode (a string that is not UTF-8) and an answer is decoded here.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from agio_grpc.config import AgentConfig, LimitsConfig, Settings
from agio_grpc.engine import RetryPolicy
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import events_pb2
from tests.fuzz.strategies import Rpc, ShownByRepr

T = TypeVar("T")

SAFETY_DEADLINE_S = 20.0
"""The deadline of a call the test sets none for: it only stops a hung call, which is then
reported as one (DEADLINE_EXCEEDED is no answer to a call without a deadline). Well past a
slow answer: under `make fuzz` five processes share two cores, and there a run checked
against an output schema of 2,047 properties once took more than 5 s."""
MAX_REQUEST_BYTES = 15 * 1024 * 1024
"""Below the server's 16 MiB message limit, which gRPC enforces before any handler runs."""
FAST_RETRIES = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05)


def fuzz_settings(database_url: str, model_url: str) -> Settings:
    """Three agents: the default one with the built-in tools, one with none, and one whose
    answer must be JSON of a schema (asked for with a `final_output` tool)."""
    limits = LimitsConfig(max_steps=5, tool_timeout_s=2.0, run_timeout_s=30.0)
    return Settings(
        listen_address="127.0.0.1:0",
        database_url=database_url,
        openai_base_url=model_url,
        openai_api_key="test-key",
        default_agent="assistant",
        agents=[
            AgentConfig(
                name="assistant",
                model="fake-model",
                instructions="You are a test assistant.",
                tools=["current_time", "calculate", "echo"],
                limits=limits,
            ),
            AgentConfig(name="terse", model="fake-model", instructions="Be terse.", limits=limits),
            AgentConfig(
                name="structured",
                model="fake-model",
                instructions="Answer in JSON.",
                tools=["calculate"],
                limits=limits,
                output_schema={
                    "type": "object",
                    "properties": {"answer": {"type": "integer"}},
                    "required": ["answer"],
                },
                output_mode="tool",
            ),
        ],
    )


@dataclass(slots=True)
class Tally:
    """What every example of the session sent and got, per backend: printed at the end."""

    cases: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(backend, property) -> examples run."""
    codes: dict[str, Counter[str]] = field(default_factory=dict)
    """backend -> status code name -> calls answered with it."""
    stops: dict[str, Counter[str]] = field(default_factory=dict)
    """backend -> stop reason name -> terminal events seen."""
    seconds: dict[str, float] = field(default_factory=dict)
    """backend -> wall time spent in examples."""

    def count_case(self, backend: str, prop: str, seconds: float) -> None:
        self.cases[backend, prop] += 1
        self.seconds[backend] = self.seconds.get(backend, 0.0) + seconds

    def count_code(self, backend: str, code: grpc.StatusCode) -> None:
        self.codes.setdefault(backend, Counter())[code.name] += 1

    def count_stop(self, backend: str, reason: str) -> None:
        self.stops.setdefault(backend, Counter())[reason] += 1

    def to_plain(self) -> dict[str, Any]:
        """The tally as plain lists and dicts, for a pytest-xdist worker to send home."""
        return {
            "cases": [[backend, prop, count] for (backend, prop), count in self.cases.items()],
            "codes": {backend: dict(counts) for backend, counts in self.codes.items()},
            "stops": {backend: dict(counts) for backend, counts in self.stops.items()},
            "seconds": dict(self.seconds),
        }

    def add_plain(self, plain: dict[str, Any]) -> None:
        """Add a tally sent by `to_plain` (a worker's) to this one."""
        for backend, prop, count in plain["cases"]:
            self.cases[backend, prop] += count
        for backend, counts in plain["codes"].items():
            self.codes.setdefault(backend, Counter()).update(counts)
        for backend, counts in plain["stops"].items():
            self.stops.setdefault(backend, Counter()).update(counts)
        for backend, seconds in plain["seconds"].items():
            self.seconds[backend] = self.seconds.get(backend, 0.0) + seconds

    def lines(self) -> list[str]:
        """The summary: cases per backend and property, then the codes and stops seen."""
        lines: list[str] = []
        for backend in sorted({backend for backend, _ in self.cases}):
            by_property = {p: n for (b, p), n in sorted(self.cases.items()) if b == backend}
            total = sum(by_property.values())
            seconds = self.seconds.get(backend, 0.0)
            lines.append(
                f"{backend}: {total} cases in {seconds:.0f} s "
                f"({1000 * seconds / total:.0f} s per 1,000)"
            )
            lines += [f"  {prop}: {count}" for prop, count in by_property.items()]
            codes = self.codes.get(backend, Counter())
            lines.append(f"  status codes ({sum(codes.values())} calls): " + _counts(codes))
            stops = self.stops.get(backend, Counter())
            lines.append(f"  stop reasons ({sum(stops.values())} runs): " + _counts(stops))
        return lines


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.most_common()) or "none"


@dataclass(slots=True)
class Outcome:
    """How one call ended: its status, and what it sent back."""

    code: grpc.StatusCode
    details: str
    error: grpc.aio.AioRpcError | None
    response: Message | None
    """A unary call's response."""
    events: list[events_pb2.StepEvent]
    """A streaming call's events, in order."""
    elapsed_s: float


@dataclass(slots=True, repr=False)
class FuzzService(ShownByRepr):
    """A started server on one backend with the fake model, and a raw channel to it."""

    backend: str
    loop: asyncio.AbstractEventLoop
    app: AgioApp
    model: FakeModelServer
    channel: grpc.aio.Channel
    tally: Tally

    def __repr__(self) -> str:
        return f"FuzzService({self.backend})"  # shown in every failing example

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run one example's work on the service's loop."""
        return self.loop.run_until_complete(work)

    async def call(self, rpc: Rpc, data: bytes, deadline_s: float | None) -> Outcome:
        """Send encoded request bytes; decode the answer; count its status."""
        assert len(data) <= MAX_REQUEST_BYTES, f"the test built a {len(data)}-byte request"
        timeout = SAFETY_DEADLINE_S if deadline_s is None else deadline_s
        response_class = GetMessageClass(rpc.response)
        events: list[events_pb2.StepEvent] = []
        response: Message | None = None
        started = time.perf_counter()
        try:
            if rpc.streaming:
                stream = self.channel.unary_stream(rpc.path)(data, timeout=timeout)
                async for raw in stream:
                    events.append(events_pb2.StepEvent.FromString(raw))
            else:
                raw = await self.channel.unary_unary(rpc.path)(data, timeout=timeout)
                response = response_class.FromString(raw)
        except grpc.aio.AioRpcError as error:
            outcome = Outcome(
                error.code(),
                error.details() or "",
                error,
                None,
                events,
                time.perf_counter() - started,
            )
        else:
            outcome = Outcome(
                grpc.StatusCode.OK, "", None, response, events, time.perf_counter() - started
            )
        self.tally.count_code(self.backend, outcome.code)
        return outcome


@asynccontextmanager
async def serving(backend: str, database_url: str, tally: Tally) -> AsyncIterator[FuzzService]:
    """The service on `database_url`, for as long as the context lasts."""
    async with FakeModelServer() as model:
        app = await AgioApp.start(fuzz_settings(database_url, model.base_url))
        app.model.retry = FAST_RETRIES  # in-band model errors are retried: quickly here
        limit = app.settings.server.max_message_bytes
        options = [("grpc.max_receive_message_length", limit)]
        try:
            async with grpc.aio.insecure_channel(app.address, options=options) as channel:
                loop = asyncio.get_running_loop()
                yield FuzzService(backend, loop, app, model, channel, tally)
        finally:
            await app.stop(grace=0)
