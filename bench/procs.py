"""The processes a benchmark runs: the fake model, the service, load generators; and their cost.

Every benchmark keeps the fake model and the service in processes of their own, on
127.0.0.1, so one side's CPU never hides in another's figure. CPU time and peak memory are
read from /proc (Linux), which needs nothing installed and sees a child's threads too.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

URL_LINE = re.compile(r"(http://\S+/v1)")
LISTEN_LINE = re.compile(r"agio-grpc listening on (\S+)")
START_TIMEOUT_S = 60.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CLI = [sys.executable, "-m", "agio_grpc.cli"]


@dataclass(slots=True)
class Child:
    """A started child process and what it printed when it was ready."""

    pid: int
    ready: str
    line: str = ""
    """The whole line `ready` was found in."""

    def cpu_s(self) -> float:
        """User + system CPU seconds the process has used so far (all its threads)."""
        return process_cpu_s(self.pid)

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory (VmHWM) in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now (e.g. a supervisor and its workers)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child_pid in children:
            found += process_tree(int(child_pid))
    return found


def process_cpu_s(pid: int) -> float:
    return sum(cpu_times(Path(f"/proc/{pid}")))


def cpu_times(proc: Path) -> tuple[float, float]:
    """User and system CPU seconds so far of a /proc/PID folder (all its threads) or a
    /proc/PID/task/TID one (that thread)."""
    fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    # After the command: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def clean_env() -> dict[str, str]:
    """This environment without AGIO_*, OPENAI_* and OTEL_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AGIO_", "OPENAI_", "OTEL_"))}


@asynccontextmanager
async def child(
    args: list[str], pattern: re.Pattern[str], env: dict[str, str], stream: str
) -> AsyncIterator[Child]:
    """Start a child, wait for `pattern` on its stdout/stderr, yield it, then stop it."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE if stream == "stdout" else asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE if stream == "stderr" else asyncio.subprocess.DEVNULL,
    )
    reader = proc.stdout if stream == "stdout" else proc.stderr
    assert reader is not None
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                line = (await reader.readline()).decode()
                if not line:
                    raise RuntimeError(f"{' '.join(args[2:4])} exited before it was ready")
                found = pattern.search(line)
                if found:
                    break
        drain = asyncio.create_task(_drain(reader))
        yield Child(proc.pid, found.group(1), line)
    finally:
        if drain is not None:
            drain.cancel()
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(reader: asyncio.StreamReader) -> None:
    while await reader.readline():
        pass


@asynccontextmanager
async def fake_model(
    tokens: int, tokens_per_second: float = 0.0, *, tool_first: bool = False
) -> AsyncIterator[Child]:
    """`agio-grpc fake-model` answering every request with `tokens` one-word chunks."""
    args = [*CLI, "fake-model", "--port", "0", "--tokens", str(tokens)]
    args += ["--tokens-per-second", str(tokens_per_second)]
    if not tool_first:
        args.append("--no-tool-first")
    async with child(args, URL_LINE, clean_env(), "stdout") as started:
        yield started


@asynccontextmanager
async def agio_server(
    model_url: str, database_url: str, extra_env: dict[str, str] | None = None
) -> AsyncIterator[Child]:
    """`agio-grpc serve` on 127.0.0.1:0 against `model_url`; `ready` is its address."""
    env = clean_env() | {
        "OPENAI_BASE_URL": model_url,
        "OPENAI_API_KEY": "bench",
        "AGIO_LISTEN_ADDRESS": "127.0.0.1:0",
        "AGIO_DATABASE_URL": database_url,
        "AGIO_LOG_LEVEL": "INFO",
    }
    async with child([*CLI, "serve"], LISTEN_LINE, env | (extra_env or {}), "stderr") as started:
        yield started


@asynccontextmanager
async def grpc_floor(
    tokens: int = 100, tokens_per_second: float = 10.0, *, relay: str = ""
) -> AsyncIterator[Child]:
    """`bench.floor`: bare gRPC streaming paced deltas, or relaying the model at `relay`;
    `ready` is its address."""
    args = [sys.executable, "-m", "bench.floor", "--tokens", str(tokens)]
    args += ["--tokens-per-second", str(tokens_per_second)]
    if relay:
        args += ["--relay", relay]
    async with child(args, LISTEN_LINE, clean_env(), "stderr") as started:
        yield started


@asynccontextmanager
async def run_floor(model_url: str) -> AsyncIterator[Child]:
    """`bench.run_floor`: a run's messages and model calls against `model_url`, nothing
    stored; `ready` is its address."""
    args = [sys.executable, "-m", "bench.run_floor", model_url]
    async with child(args, LISTEN_LINE, clean_env(), "stderr") as started:
        yield started


@asynccontextmanager
async def scratch_database(postgres: str = "") -> AsyncIterator[str]:
    """The URL of a fresh database, removed afterwards: made on the PostgreSQL server the
    URL `postgres` names, else a SQLite file in a temporary directory."""
    if not postgres:
        with tempfile.TemporaryDirectory() as scratch:
            yield f"sqlite+aiosqlite:///{Path(scratch) / 'bench.db'}"
        return
    import asyncpg

    admin_url = postgres.replace("postgresql+asyncpg://", "postgresql://")
    name = f"agio_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        base = admin_url.rpartition("/")[0].removeprefix("postgresql://")
        try:
            yield f"postgresql+asyncpg://{base}/{name}"
        finally:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def postgres_databases(
    *, tls: bool = False
) -> AsyncIterator[Callable[[], AbstractAsyncContextManager[str]]]:
    """Makes empty PostgreSQL databases (each dropped after use) on a throwaway cluster from
    tests/postgres.py, or on the server in AGIO_TEST_POSTGRES_URL; raises when neither can
    be had. With `tls`, the cluster serves TLS and the URLs require it (`?ssl=require`: a
    server without TLS fails rather than fall back to plaintext)."""
    from tests.postgres import TestDatabases, start_postgres

    admin_url, cluster = await asyncio.to_thread(start_postgres, tls=tls)
    databases = TestDatabases(admin_url)

    @asynccontextmanager
    async def new_database() -> AsyncIterator[str]:
        url = await databases.create()
        try:
            yield f"{url}?ssl=require" if tls else url
        finally:
            await databases.drop(url)

    try:
        await asyncio.to_thread(databases.prepare)
        yield new_database
    finally:
        await asyncio.to_thread(databases.dispose)
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
