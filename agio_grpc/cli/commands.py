"""The client commands: each one call (or a few) on an AgioClient, its result handed to a
Printer. Returns the exit code: 0, or 1 for a run that failed; a server error is raised as
AgioError, and arguments the server would refuse as UsageError, both reported by
`run_client`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agio_grpc.cli.client_tools import pending_calls, read_outputs
from agio_grpc.cli.hints import error_line
from agio_grpc.cli.render import HumanPrinter, JsonPrinter, Printer
from agio_grpc.client import AddressError, AgioClient, AgioError, TlsConfig, TlsFileError
from agio_grpc.v1 import agent_service_pb2, events_pb2, resources_pb2, session_service_pb2

Command = Callable[[AgioClient, argparse.Namespace, Printer], Coroutine[Any, Any, int]]
T = TypeVar("T")

MAX_PAGE_SIZE = 1000
"""The largest page the server serves."""

BUSY_POLICIES = {
    "reject": agent_service_pb2.BUSY_POLICY_REJECT,
    "enqueue": agent_service_pb2.BUSY_POLICY_ENQUEUE,
    "interrupt": agent_service_pb2.BUSY_POLICY_INTERRUPT,
    "rollback": agent_service_pb2.BUSY_POLICY_ROLLBACK,
}


class UsageError(ValueError):
    """Arguments the server would refuse, found before anything was asked of it: exit
    code 2, as argparse's own."""


def client_tls(args: argparse.Namespace) -> TlsConfig | bool:
    """TLS as the options ask: a TlsConfig when a file is given, True for `--tls` alone."""
    files = (args.ca_file, args.cert_file, args.key_file)
    if any(files):
        return TlsConfig(*files)
    return bool(args.tls)


def run_client(command: Command, args: argparse.Namespace) -> int:
    """Run one client command; a server error is one line on stderr and exit code 1, a
    TLS file that cannot be used or arguments the server would refuse exit code 2. Ctrl-C
    says what became of the run (exit code 130)."""
    out: Printer = JsonPrinter() if args.json else HumanPrinter()

    async def connected() -> int:
        tls = client_tls(args)
        async with AgioClient(args.address, token=args.token or None, tls=tls) as client:
            return await command(client, args, out)

    try:
        return asyncio.run(connected())
    except AgioError as error:
        print(f"agio-grpc: {error_line(error)}", file=sys.stderr)
        return 1
    except (TlsFileError, AddressError, UsageError) as error:
        print(f"agio-grpc: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # The stream was cancelled on the way out, and with it a run of chat, retry or
        # submit (DisconnectPolicy CANCEL); a watch leaves its run be.
        out.interrupted(cancels_run=command is not watch)
        return 130


async def _print_stream(
    events: AsyncIterator[events_pb2.StepEvent], out: Printer
) -> events_pb2.StepEvent | None:
    """Print every event; the last one."""
    last = None
    async for event in events:
        out.event(event)
        last = event
    return last


def _exit_code(last: events_pb2.StepEvent | None) -> int:
    """1 when a run stream ended with `run_failed`."""
    return 1 if last is not None and last.WhichOneof("event") == "run_failed" else 0


async def follow_to_end(
    client: AgioClient, events: AsyncIterator[events_pb2.StepEvent], out: Printer
) -> int:
    """Print a run's events. When it stops waiting for client tool calls, read their
    outputs from stdin, submit them and print the continued run, until it ends (or stdin
    does: the run is left waiting). 1 when the run failed."""
    while True:
        last = await _print_stream(events, out)
        if last is None or last.WhichOneof("event") != "run_completed":
            return _exit_code(last)
        run = last.run_completed.run
        if run.status != resources_pb2.RUN_STATUS_REQUIRES_ACTION:
            return 0
        if run.required_action.approvals:
            # A person decides, maybe later: the run waits (and a submit needs every answer).
            for call in run.required_action.approvals:
                line = f"agio-grpc approve {run.id} {call.id} [--reject --reason TEXT]"
                print(f"run {run.id} waits for a decision on {call.name}: {line}", file=sys.stderr)
            return 0
        calls = pending_calls(run)
        outputs = await read_outputs(calls) if calls else None
        if outputs is None:
            out.waiting(run)
            return 0
        events = client.submit_tool_outputs(run.id, outputs)


async def chat(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    options: dict[str, Any] = {
        "session_id": args.session,
        "agent": args.agent,
        "on_busy": BUSY_POLICIES[args.on_busy],
        "client_tools": args.client_tool,
        "require_approval": args.require_approval,
    }
    if args.output_schema is not None:
        options["output_schema"] = args.output_schema
    if args.background:
        out.started(await client.start_run(args.message, **options))
        return 0
    if args.output_schema is not None:
        return await _answer_only(client.run(args.message, **options), out)
    return await follow_to_end(client, client.run(args.message, **options), out)


async def _answer_only(events: AsyncIterator[events_pb2.StepEvent], out: Printer) -> int:
    """A structured run: nothing streamed, so that stdout is the answer alone (a document a
    program can read). 1 when the run failed (OUTPUT_INVALID among others)."""
    last = None
    async for event in events:
        last = event
    kind = None if last is None else last.WhichOneof("event")
    if last is None or kind not in ("run_completed", "run_failed"):
        return 0
    out.answer(getattr(last, kind).run)
    return _exit_code(last)


async def retry(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    last = (await client.get_session(args.session_id)).step_count
    if args.sequence > last + 1:
        raise UsageError(
            f"retry: --from {args.sequence} is past the end of session {args.session_id}: "
            f"it has {last} steps, so --from is 2..{last + 1} "
            f"({last + 1}: regenerate after the last step)"
        )
    return await follow_to_end(client, client.retry(args.session_id, args.sequence), out)


async def submit(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    events = client.submit_tool_outputs(args.run_id, args.outputs)
    return await follow_to_end(client, events, out)


async def approve(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    decide = client.reject if args.reject else client.approve
    return await follow_to_end(client, decide(args.run_id, args.call_id, reason=args.reason), out)


async def list_approvals(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    """The runs waiting for a decision, among a session's runs or the newest sessions'."""
    if args.session:
        runs = await client.list_runs(args.session)
    else:
        runs = await _runs_of_newest_sessions(client, args.limit)
    out.approvals([run for run in runs if run.required_action.approvals])
    return 0


async def watch(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.watching(await client.get_run(args.run_id))
    last = await _print_stream(client.follow_run(args.run_id, args.after), out)
    if last is not None and last.WhichOneof("event") == "run_completed":
        run = last.run_completed.run
        if run.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION:
            out.waiting(run)
    return _exit_code(last)


async def show_run(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.run(await client.get_run(args.run_id))
    return 0


async def cancel_run(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.cancelled(await client.cancel_run(args.run_id, args.reason))
    return 0


async def _fill_page(
    fetch: Callable[[int, str], Awaitable[tuple[list[T], str]]], limit: int, token: str
) -> tuple[list[T], str]:
    """Up to `limit` items from the page at `token` on, following page tokens (a page may
    come back shorter than asked); the token of what is left."""
    items: list[T] = []
    while True:
        page, token = await fetch(min(limit - len(items), MAX_PAGE_SIZE), token)
        items.extend(page)
        if not token or len(items) >= limit:
            return items, token


async def list_runs(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    if not args.session:
        runs = await _runs_of_newest_sessions(client, args.limit)
        out.runs(agent_service_pb2.ListRunsResponse(runs=runs))
        return 0

    async def fetch(size: int, token: str) -> tuple[list[resources_pb2.Run], str]:
        page = await client.list_runs_page(args.session, size, token)
        return list(page.runs), page.next_page_token

    runs, token = await _fill_page(fetch, args.limit, args.page_token)
    out.runs(agent_service_pb2.ListRunsResponse(runs=runs, next_page_token=token))
    return 0


async def _runs_of_newest_sessions(client: AgioClient, limit: int) -> list[resources_pb2.Run]:
    """Up to `limit` runs of the newest sessions (ListRuns lists one session's), newest
    first whatever their session."""
    runs: list[resources_pb2.Run] = []
    token = ""
    while len(runs) < limit:
        page = await client.list_sessions_page(min(limit, MAX_PAGE_SIZE), token)
        for session in page.sessions:
            # A session's newest `limit` runs: no older one of it can be among the shown.
            page_size = min(limit, MAX_PAGE_SIZE)
            runs.extend((await client.list_runs_page(session.id, page_size)).runs)
            if len(runs) >= limit:
                break
        token = page.next_page_token
        if not token:
            break
    runs.sort(key=lambda run: run.create_time.ToNanoseconds(), reverse=True)
    return runs[:limit]


async def list_sessions(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    async def fetch(size: int, token: str) -> tuple[list[resources_pb2.Session], str]:
        page = await client.list_sessions_page(size, token)
        return list(page.sessions), page.next_page_token

    sessions, token = await _fill_page(fetch, args.limit, args.page_token)
    out.sessions(session_service_pb2.ListSessionsResponse(sessions=sessions, next_page_token=token))
    return 0


async def show_session(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    session = await client.get_session(args.session_id)
    out.session(session, await client.list_steps(args.session_id))
    return 0


async def steps(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.steps(await client.list_steps(args.session_id))
    return 0


async def delete_session(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.deleted(args.session_id, await client.delete_session(args.session_id))
    return 0


async def compact_session(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.compacted(await client.compact_session(args.session_id, args.keep, args.agent))
    return 0


async def fork(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.forked(await client.fork_session(args.session_id, args.at))
    return 0


async def agents(client: AgioClient, args: argparse.Namespace, out: Printer) -> int:
    out.agents(await client.list_agents(), args.verbose)
    return 0
