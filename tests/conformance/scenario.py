"""The client conformance scenario, Python edition: agio_grpc.client against a live server.

The same checks, in the same order and with the same names, exist for Go
(clients/go/conformance_test.go) and TypeScript (clients/ts/src/conformance/scenario.ts);
scripts/conformance.py starts the servers and runs all three. Two servers are needed:

- `--address`: a server on the built-in fake model ("What is 12 * 7?" → a `calculate` tool
  call, then "The result is 84.").
- `--slow-address`: a server on a paced fake model (a tool call, then 200 words at 20 a
  second), so that a run lasts long enough to be cancelled mid-stream.

Checks: `health` (SERVING); `run_with_tool` (a Run with a tool call streamed to its terminal
event, stop reason COMPLETED; it sends a W3C `traceparent`); `trace_id` (that run's trace id
is the one sent); `cancel` (CancelRun after the first streamed text; the stream ends
CANCELLED and GetRun says RUN_STATUS_CANCELLED); `not_found` (a Run on an unknown session
fails NOT_FOUND with ErrorInfo reason SESSION_NOT_FOUND, domain agio-grpc); `list_steps`
(ListSteps paged two at a time to the end: gapless sequences 1..step_count);
`background_resume` (StartRun, WatchRun read for two events and dropped, then resumed from
that cursor to the terminal event, stop reason COMPLETED); `follow_after_end` (the follow
helper from the cursor of a run's terminal event ends at once, with no event: the server's
stream is empty, status OK); `tls_hint` (a client whose TLS does not fit the server fails
UNAVAILABLE saying what to change: over plaintext a TLS client is told the server speaks
plaintext, over TLS a plaintext client is told to give the CA file); `structured_output` (a
Run with an output schema: its `calculate` call, then stop reason COMPLETED and the run's output
`{"answer": 0}`, through each client's helper).

Over TLS, the clients take what the CLIs read: AGIO_CA_FILE (and for mutual TLS
AGIO_CERT_FILE and AGIO_KEY_FILE), and the credential AGIO_TOKEN; scripts/conformance.py
runs the scenario in plaintext, over TLS and over mutual TLS.

Prints one `ok NAME` or `FAIL NAME: why` line per check; exits 1 when any check failed.
`python -m tests.conformance.scenario --address HOST:PORT --slow-address HOST:PORT`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence

import grpc

from agio_grpc.client import TLS_HINTS, AgioClient, AgioError, TlsConfig, TlsFailure
from agio_grpc.v1 import events_pb2, resources_pb2

CALL_TIMEOUT = 10.0
RUN_TIMEOUT = 30.0
PAGE_SIZE = 2
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
"""The `structured_output` check's schema: the built-in fake model answers a requested schema
with the smallest instance it accepts, `{"answer": 0}`, after its `calculate` call."""


class CheckFailedError(AssertionError):
    """A conformance check whose outcome was not the expected one."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailedError(message)


def tls_from_environment() -> TlsConfig | bool:
    """TLS with the files AGIO_CA_FILE, AGIO_CERT_FILE and AGIO_KEY_FILE name; none set:
    plaintext."""
    files = [os.environ.get(f"AGIO_{name}_FILE") or None for name in ("CA", "CERT", "KEY")]
    return TlsConfig(*files) if any(files) else False


class Scenario:
    """The checks, sharing what earlier ones produced (the tool run's session and trace)."""

    def __init__(self, address: str, slow_address: str) -> None:
        self.address = address
        self.slow_address = slow_address
        self.trace_id = secrets.token_hex(16)
        self.run: resources_pb2.Run | None = None
        self.tls = tls_from_environment()
        self.token = os.environ.get("AGIO_TOKEN") or None

    def connect(self, address: str, metadata: Sequence[tuple[str, str]] = ()) -> AgioClient:
        return AgioClient(address, metadata=metadata, token=self.token, tls=self.tls)

    async def health(self) -> None:
        async with self.connect(self.address) as client:
            status = await asyncio.wait_for(client.health(), CALL_TIMEOUT)
        expect(status == "SERVING", f"health is {status}")

    async def run_with_tool(self) -> None:
        traceparent = f"00-{self.trace_id}-{secrets.token_hex(8)}-01"
        async with self.connect(self.address, [("traceparent", traceparent)]) as client:
            events: list[events_pb2.StepEvent] = []
            async for event in client.run("What is 12 * 7?", timeout=RUN_TIMEOUT):
                events.append(event)
        kinds = [event.WhichOneof("event") for event in events]
        expect(kinds[-1] == "run_completed", f"the stream ended with {kinds[-1]}")
        expect(
            [event.seq for event in events] == list(range(1, len(events) + 1)),
            "seq is not gapless from 1",
        )
        steps = [e.step_completed.step for e in events if e.WhichOneof("event") == "step_completed"]
        calls = [call.name for step in steps for call in step.tool_calls]
        expect(calls == ["calculate"], f"tool calls {calls}")
        self.run = events[-1].run_completed.run
        reason = resources_pb2.StopReason.Name(self.run.stop_signal.reason)
        expect(reason == "STOP_REASON_COMPLETED", f"stop reason {reason}")
        expect("84" in steps[-1].content, f"final text {steps[-1].content!r}")

    async def trace_id_check(self) -> None:
        expect(self.run is not None, "no run to check (run_with_tool failed)")
        assert self.run is not None
        async with self.connect(self.address) as client:
            stored = await asyncio.wait_for(client.get_run(self.run.id), CALL_TIMEOUT)
        expect(
            self.run.trace_id == self.trace_id and stored.trace_id == self.trace_id,
            f"sent trace id {self.trace_id}, run has {self.run.trace_id!r}"
            f" (GetRun {stored.trace_id!r})",
        )

    async def cancel(self) -> None:
        async with self.connect(self.slow_address) as client:
            terminal: resources_pb2.Run | None = None
            cancelled = False
            async for event in client.run("Tell me a long story.", timeout=RUN_TIMEOUT):
                kind = event.WhichOneof("event")
                if not cancelled and kind == "step_delta" and event.step_delta.content:
                    cancelled = True
                    await asyncio.wait_for(
                        client.cancel_run(event.run_id, "conformance"), CALL_TIMEOUT
                    )
                if kind in ("run_completed", "run_failed"):
                    terminal = getattr(event, kind).run
            expect(cancelled, "no text was streamed before the end")
            expect(terminal is not None, "no terminal event")
            assert terminal is not None
            reason = resources_pb2.StopReason.Name(terminal.stop_signal.reason)
            expect(reason == "STOP_REASON_CANCELLED", f"stop reason {reason}")
            stored = await asyncio.wait_for(client.get_run(terminal.id), CALL_TIMEOUT)
        status = resources_pb2.RunStatus.Name(stored.status)
        expect(status == "RUN_STATUS_CANCELLED", f"GetRun status {status}")

    async def not_found(self) -> None:
        async with self.connect(self.address) as client:
            try:
                async for _ in client.run("hi", session_id="no-such-session", timeout=RUN_TIMEOUT):
                    pass
            except AgioError as error:
                expect(error.code == grpc.StatusCode.NOT_FOUND, f"code {error.code.name}")
                expect(error.reason == "SESSION_NOT_FOUND", f"reason {error.reason!r}")
                expect(error.domain == "agio-grpc", f"domain {error.domain!r}")
                return
        raise CheckFailedError("the run on an unknown session did not fail")

    async def list_steps(self) -> None:
        expect(self.run is not None, "no session to list (run_with_tool failed)")
        assert self.run is not None
        async with self.connect(self.address) as client:
            steps = await asyncio.wait_for(
                client.list_steps(self.run.session_id, page_size=PAGE_SIZE), CALL_TIMEOUT
            )
            session = await asyncio.wait_for(client.get_session(self.run.session_id), CALL_TIMEOUT)
        sequences = [step.sequence for step in steps]
        expect(len(steps) > PAGE_SIZE, f"only {len(steps)} steps: paging not exercised")
        expect(sequences == list(range(1, session.step_count + 1)), f"sequences {sequences}")

    async def background_resume(self) -> None:
        async with self.connect(self.address) as client:
            run = await asyncio.wait_for(client.start_run("What is 12 * 7?"), CALL_TIMEOUT)
            # Read two events, drop the stream, resume from the cursor to the terminal event.
            seen: list[events_pb2.StepEvent] = []
            async for event in client.watch_run(run.id, timeout=RUN_TIMEOUT):
                seen.append(event)
                if len(seen) == 2:
                    break
            expect(
                len(seen) == 2 and seen[0].WhichOneof("event") == "run_started",
                "the first two events",
            )
            cursor = seen[-1].seq
            rest = [event async for event in client.follow_run(run.id, cursor, reconnects=3)]
        expect(bool(rest) and rest[0].seq > cursor, f"resumed from {cursor}")
        kind = rest[-1].WhichOneof("event") if rest else None
        expect(kind == "run_completed", f"the resumed stream ended with {kind}")
        reason = resources_pb2.StopReason.Name(rest[-1].run_completed.run.stop_signal.reason)
        expect(reason == "STOP_REASON_COMPLETED", f"stop reason {reason}")

    async def follow_after_end(self) -> None:
        async with self.connect(self.address) as client:
            run = await asyncio.wait_for(client.start_run("What is 12 * 7?"), CALL_TIMEOUT)
            events = [event async for event in client.follow_run(run.id, reconnects=3)]
            expect(bool(events), "no events")
            terminal_seq = events[-1].seq
            after = [event async for event in client.follow_run(run.id, terminal_seq)]
        expect(after == [], f"{len(after)} events after the terminal event's seq {terminal_seq}")

    async def tls_hint(self) -> None:
        # The other transport: TLS to a plaintext server, plaintext to a TLS one.
        wrong: TlsConfig | bool = self.tls is False
        expected = TlsFailure.SERVER_WITHOUT_TLS if wrong else TlsFailure.SERVER_WANTS_TLS
        async with AgioClient(self.address, tls=wrong, token=self.token) as client:
            try:
                await asyncio.wait_for(client.health(), CALL_TIMEOUT)
            except AgioError as error:
                expect(error.code == grpc.StatusCode.UNAVAILABLE, f"code {error.code.name}")
                expect(error.tls_failure is expected, f"{error.tls_failure}: {error}")
                expect(TLS_HINTS[expected] in str(error), f"no hint in {error}")
                return
        raise CheckFailedError("a client with the wrong TLS got in")

    async def structured_output(self) -> None:
        async with self.connect(self.address) as client:
            result = await asyncio.wait_for(
                client.run_to_end("What is 12 * 7?", output_schema=ANSWER_SCHEMA), RUN_TIMEOUT
            )
        reason = resources_pb2.StopReason.Name(result.stop_signal.reason)
        expect(reason == "STOP_REASON_COMPLETED", f"stop reason {reason}")
        calls = [call.name for step in result.steps for call in step.tool_calls]
        expect(calls == ["calculate"], f"tool calls {calls}")
        expect(result.output == {"answer": 0}, f"output {result.output!r}")

    async def approval(self) -> None:
        async with self.connect(self.address) as client:
            waiting = (
                await client.run_to_end(
                    "What is 12 * 7?", require_approval=["calculate"], timeout=RUN_TIMEOUT
                )
            ).run
            status = resources_pb2.RunStatus.Name(waiting.status)
            expect(status == "RUN_STATUS_REQUIRES_ACTION", f"status {status}")
            held = [call.name for call in waiting.required_action.approvals]
            expect(held == ["calculate"], f"waiting for {held}")
            events = [event async for event in client.approve(waiting.id, timeout=RUN_TIMEOUT)]
        done = events[-1].run_completed.run
        reason = resources_pb2.StopReason.Name(done.stop_signal.reason)
        expect(done.id == waiting.id and reason == "STOP_REASON_COMPLETED", f"stop {reason}")
        steps = [e.step_completed.step for e in events if e.WhichOneof("event") == "step_completed"]
        expect(bool(steps) and steps[0].approval.approved, "the result keeps no approval")
        expect("84" in steps[-1].content, f"final text {steps[-1].content!r}")


async def run_checks(scenario: Scenario) -> int:
    checks: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("health", scenario.health),
        ("run_with_tool", scenario.run_with_tool),
        ("trace_id", scenario.trace_id_check),
        ("cancel", scenario.cancel),
        ("not_found", scenario.not_found),
        ("list_steps", scenario.list_steps),
        ("background_resume", scenario.background_resume),
        ("follow_after_end", scenario.follow_after_end),
        ("tls_hint", scenario.tls_hint),
        ("structured_output", scenario.structured_output),
        ("approval", scenario.approval),
    ]
    failed = 0
    for name, check in checks:
        try:
            await asyncio.wait_for(check(), RUN_TIMEOUT + CALL_TIMEOUT)
            print(f"ok {name}", flush=True)
        except (CheckFailedError, AgioError, TimeoutError) as error:
            failed += 1
            print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="agio-grpc client conformance (Python)")
    parser.add_argument("--address", required=True, help="server on the built-in fake model")
    parser.add_argument("--slow-address", required=True, help="server on a paced fake model")
    args = parser.parse_args(argv)
    return asyncio.run(run_checks(Scenario(args.address, args.slow_address)))


if __name__ == "__main__":
    sys.exit(main())
