"""A stdio MCP server's process, kept in view: started with exactly the environment it is
given, its JSON-RPC messages carried on stdin and stdout as the `mcp` SDK's transports carry
them, its stderr passed on to the service's stderr with the last line kept, and its end
noticed the moment it happens.

The SDK's own `stdio_client` hides the process. The service needs to see it: a server that
exits must lose its tools at once (not at the next ping or call), and a server that fails
to start must be logged with its exit code and the last thing it wrote to stderr. Stopping
follows the SDK and the MCP spec's shutdown: close stdin, wait, then SIGTERM and SIGKILL to
the process group (the server runs in a session of its own, so a launcher's children such as
`npx`'s go too). POSIX only. Never logs: the caller decides what to say about an end.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp.types as mcp_types
from anyio.abc import Process, TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

EXIT_GRACE_S = 2.0
"""How long a server may take to exit once its stdin is closed (the SDK's grace period), and
then once it is sent SIGTERM before SIGKILL."""
WRITER_FLUSH_S = 0.5
"""How long messages already accepted may take to reach the server's stdin at a stop."""
STDERR_LINE_MAX = 500
"""The longest stderr line kept for the failure log line (its end, where the error is)."""
Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]
"""What a `ClientSession` reads from and writes to."""
EXIT_AFTER_STDOUT_S = 1.0
"""How long a process that closed its stdout is given to exit before its end is told
without its exit code (it closed its stdout and goes on running)."""
_CLOSED = (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)
"""A pipe or stream that closed under a read or write: the process went, or `stop` closed it."""


@dataclass(frozen=True, slots=True)
class ProcessEnd:
    """How a server's process ended, once it was reaped."""

    ended_by_itself: bool
    """It exited or closed its stdout before the service stopped it."""
    exit_code: int | None
    """Its exit status (negative: the signal that killed it); None when it closed its stdout
    and did not exit, or outlived the stop."""
    last_stderr_line: str
    """The last non-blank line it wrote to stderr, "" when none."""

    def describe(self) -> str:
        """How it ended, for a log line or a status: `exited with code 1`, `was killed by
        signal SIGKILL`, or `closed its stdout` (and did not exit then)."""
        code = self.exit_code
        if code is None:
            return "closed its stdout"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"was killed by signal {name}"
        return f"exited with code {code}"


class StdioProcess:
    """One started server process: `streams` for the SDK's `ClientSession`, and once it is
    stopped, `end`."""

    def __init__(self, process: Process, on_end: Callable[[str], None]) -> None:
        """`on_end` is called once, in the event loop, when the process exits or closes its
        stdout before `stop` (not for an end `stop` causes), with how it ended
        (`ProcessEnd.describe`: its exit code when it exited)."""
        self._process = process
        self._on_end = on_end
        self._ended_by_itself = False
        self._told = False
        self._stopping = False
        self._last_stderr_line = ""
        self._writer_done = anyio.Event()
        self._stderr_done = anyio.Event()
        self._read_send, self._read_receive = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](0)
        self._write_send, self._write_receive = anyio.create_memory_object_stream[SessionMessage](0)
        self.end: ProcessEnd | None = None
        """How it ended; set by `stop`."""

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def streams(self) -> Streams:
        """What a `ClientSession` reads from and writes to."""
        return self._read_receive, self._write_send

    def watch(self, tasks: TaskGroup) -> None:
        """Carry messages and watch the process in `tasks` (cancelled after `stop`)."""
        tasks.start_soon(self._read_stdout)
        tasks.start_soon(self._write_stdin)
        tasks.start_soon(self._read_stderr)
        tasks.start_soon(self._wait_for_exit)

    def _ended(self) -> None:
        if not self._stopping:
            self._ended_by_itself = True

    def _tell_end(self) -> None:
        """`on_end`, once, for an end the process came to by itself."""
        if self._ended_by_itself and not self._told:
            self._told = True
            self._on_end(ProcessEnd(True, self._process.returncode, "").describe())

    async def _wait_for_exit(self) -> None:
        await self._process.wait()
        self._ended()
        self._tell_end()

    async def _read_stdout(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None  # started with pipes
        # Once the session is gone the rest is read and dropped: a server blocked on a full
        # pipe could not see its stdin close and exit.
        delivering = True
        buffer = ""
        async with self._read_send:
            with contextlib.suppress(*_CLOSED):
                # A line that is not UTF-8 is then no JSON either: the session hears of it.
                async for chunk in TextReceiveStream(stdout, errors="replace"):
                    lines = (buffer + chunk).split("\n")
                    buffer = lines.pop()
                    for line in lines:
                        if delivering and line.strip():
                            delivering = await self._deliver(_parse_message(line))
        # The end of stdout is the end of the connection, usually a moment before the exit:
        # told once the process exits (with its code), or once it has not for a while.
        self._ended()
        with anyio.move_on_after(EXIT_AFTER_STDOUT_S):
            await self._process.wait()
        self._tell_end()

    async def _deliver(self, message: SessionMessage | Exception) -> bool:
        try:
            await self._read_send.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def _write_stdin(self) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            async with self._write_receive:
                async for message in self._write_receive:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send((text + "\n").encode())
        except _CLOSED:
            # The server no longer reads: the session must see the end rather than wait on
            # an answer forever.
            await self._read_send.aclose()
        finally:
            self._writer_done.set()

    async def _read_stderr(self) -> None:
        stderr = self._process.stderr
        assert stderr is not None
        buffer = ""
        try:
            with contextlib.suppress(*_CLOSED):
                async for chunk in TextReceiveStream(stderr, errors="replace"):
                    # A server's stderr was the service's before the service watched it; it
                    # still is.
                    sys.stderr.write(chunk)
                    lines = (buffer + chunk).split("\n")
                    buffer = lines.pop()[-STDERR_LINE_MAX:]
                    self._keep_last_line(lines)
            self._keep_last_line([buffer])
        finally:
            self._stderr_done.set()

    def _keep_last_line(self, lines: list[str]) -> None:
        for line in reversed(lines):
            if line.strip():
                self._last_stderr_line = line.strip()[-STDERR_LINE_MAX:]
                return

    async def stop(self) -> None:
        """End the process (stdin closed, then SIGTERM and SIGKILL to its group, each after
        `EXIT_GRACE_S`), reap it and set `end`. Every wait is bounded; a cancelled caller
        still gets the process stopped."""
        with anyio.CancelScope(shield=True):
            by_itself = self._ended_by_itself or self._process.returncode is not None
            self._stopping = True
            self._write_send.close()
            with anyio.move_on_after(WRITER_FLUSH_S):
                await self._writer_done.wait()
            stdin = self._process.stdin
            assert stdin is not None
            with contextlib.suppress(*_CLOSED):
                await stdin.aclose()
            if not await self._exited_within(EXIT_GRACE_S):
                await terminate_posix_process_tree(self._process, EXIT_GRACE_S)
                await self._exited_within(EXIT_GRACE_S)
            with anyio.move_on_after(EXIT_GRACE_S):  # the last words, unless a child holds it
                await self._stderr_done.wait()
            code = self._process.returncode
            self.end = ProcessEnd(by_itself, code, self._last_stderr_line)
            if code is not None:
                await self._process.aclose()
            self._read_receive.close()

    async def _exited_within(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self._process.wait()
        return self._process.returncode is not None


@contextlib.asynccontextmanager
async def started_process(
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None,
    on_end: Callable[[str], None],
) -> AsyncIterator[StdioProcess]:
    """Start `command` with `args` and exactly `env` as its environment, in a session of its
    own; stop it on the way out (`StdioProcess.stop`). Raises OSError when it cannot be
    started."""
    process = await anyio.open_process(
        [command, *args], env=dict(env), cwd=cwd, start_new_session=True
    )
    started = StdioProcess(process, on_end)
    async with anyio.create_task_group() as tasks:
        started.watch(tasks)
        try:
            yield started
        finally:
            await started.stop()
            tasks.cancel_scope.cancel()


def _parse_message(line: str) -> SessionMessage | Exception:
    """A stdout line as a message, or the error that says why it is none (the session hands
    it to the client's message handler)."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as error:
        return error
