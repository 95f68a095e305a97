"""Where a run's server CPU goes: py-spy on `agio-grpc serve` under B6's load.

    python -m bench.profile --shape short --backend sqlite
    python -m bench.profile --shape tool --backend postgresql --out docs/benchmarks/profiles
    python -m bench.profile --shape paced --concurrency 500 --runs 500 --warmup 0   # B4's
    python -m bench.profile --shape short --backend run-floor     # the run floor, to compare
    python -m bench.profile --shape stream --concurrency 1 --runs 300 --warmup 10   # B1-B3's

Starts the fake model and the server as B6 does (bench/runs.py), warms it up, then samples
every thread of the server with py-spy while a load generator keeps `--concurrency` runs
going until `--runs` have finished. Writes NAME.svg (a flame graph) and NAME.txt (py-spy's
collapsed stacks), and prints a table: the share of the samples each component holds,
a sample going to the innermost frame that belongs to a component (library or agio_grpc
package), and the CPU per run each share stands for; then the CPU per run of each thread,
and the event loop thread's samples by what the run was doing (`ROLES`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

from bench import procs
from bench.concurrency import generate
from bench.runs import SHAPES, TOKENS, postgres_tls

PROFILED: dict[str, tuple[int, float, bool]] = {
    shape: (TOKENS, 0.0, tool_first) for shape, tool_first in SHAPES.items()
} | {"paced": (100, 10.0, True), "stream": (200, 0.0, False)}
"""Shape -> the fake model's tokens, tokens/s (0: as fast as it can) and whether it calls
the tool first: B6's short and tool runs, B4's (`--shape paced --concurrency 500`) and
B1-B3's (`--shape stream --concurrency 1`: one 200-token run at a time)."""

RUN_FLOOR = "run-floor"
"""The `--backend` that profiles the run floor (bench/run_floor.py) in place of the server."""

COMPONENTS: tuple[tuple[str, str], ...] = (
    ("ssl.py", "TLS (ssl, asyncio sslproto)"),
    ("asyncio/sslproto.py", "TLS (ssl, asyncio sslproto)"),
    ("asyncpg/", "asyncpg"),
    ("sqlalchemy/", "SQLAlchemy"),
    ("aiosqlite/", "aiosqlite"),
    ("sqlite3/", "sqlite3"),
    ("aiohttp/", "aiohttp (model HTTP)"),
    ("yarl/", "aiohttp (model HTTP)"),
    ("multidict/", "aiohttp (model HTTP)"),
    ("grpc/", "grpc"),
    ("google/protobuf/", "protobuf"),
    ("opentelemetry/", "opentelemetry"),
    ("pydantic", "pydantic"),
    ("json/", "json"),
    ("agio_grpc/store/", "agio_grpc.store"),
    ("agio_grpc/engine/", "agio_grpc.engine"),
    ("agio_grpc/service/", "agio_grpc.service"),
    ("agio_grpc/telemetry/", "agio_grpc.telemetry"),
    ("agio_grpc/", "agio_grpc (other)"),
    ("asyncio/", "asyncio"),
    ("threading.py", "threads (idle waits, hand-offs)"),
    ("concurrent/futures/", "threads (idle waits, hand-offs)"),
)


ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "the store's transactions (SQLAlchemy, sqlite3 or asyncpg and TLS, our rows)",
        ("(agio_grpc/store/", "(sqlalchemy/", "(asyncpg/", "(sqlite3/", "(asyncio/sslproto.py"),
    ),
    (
        "the model call (aiohttp, SSE, each delta checked and published)",
        ("(agio_grpc/engine/models/", "(aiohttp/", "(yarl/", "(multidict/"),
    ),
    # The run floor (bench/run_floor.py) writes its events from its servicer's own frames.
    (
        "the relay (events to protobuf, gRPC writes)",
        ("AgentServicer._relay (", "RunFloorServicer."),
    ),
)
"""What the event loop's thread was doing, by the first role whose marker is in any frame of a
stack; a stack with none goes to tracing (its innermost agio_grpc frame in telemetry), the
engine and the service (any other agio_grpc frame but the CLI's), or the event loop itself
(task steps, grpc's Cython callbacks and epoll, which show no Python frame of ours)."""

EVENT_LOOP_THREAD = "MainThread"


def role(stack: str) -> str:
    """The role of a `;`-joined py-spy stack of the event loop's thread (`ROLES`)."""
    frames = stack.split(";")
    for name, markers in ROLES:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    ours = [frame for frame in frames if "(agio_grpc/" in frame and "(agio_grpc/cli/" not in frame]
    if not ours:
        return "the event loop itself (task steps, grpc's callbacks, epoll)"
    if "(agio_grpc/telemetry/" in ours[-1]:
        return "tracing (spans, metrics)"
    return "the engine and the service (run loop, channel, lifecycle, the request's checks)"


def component(stack: str) -> str:
    """The component of the innermost frame of a `;`-joined py-spy stack that has one (a
    frame reads `function (path/of/module.py:line)`, the path from its package root)."""
    for frame in reversed(stack.split(";")):
        _, _, where = frame.rpartition(" (")
        for marker, name in COMPONENTS:
            if where.startswith(marker):
                return name
    return "other (interpreter, C)"


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far (user + system) of each thread of `pid`, by thread id."""
    found: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread ended
            user, system = procs.cpu_times(task)
            found[int(task.name)] = user + system
    return found


THREAD_FRAME = re.compile(r"^thread \((\d+)\): ([^;]*)")


def thread_names(collapsed: Path) -> dict[int, str]:
    """Thread id -> Python thread name, from py-spy's stacks (a pool's threads numbered)."""
    names: dict[int, str] = {}
    for line in collapsed.read_text().splitlines():
        if found := THREAD_FRAME.match(line):
            names[int(found.group(1))] = found.group(2)
    return names


def summarize(collapsed: Path) -> tuple[Counter[str], Counter[str]]:
    """Samples per component, and the event loop thread's samples per role, in py-spy's `raw`
    (collapsed) output."""
    counts: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[component(stack)] += int(count)
            if (found := THREAD_FRAME.match(stack)) and found.group(2) == EVENT_LOOP_THREAD:
                roles[role(stack)] += int(count)
    return counts, roles


async def profile(
    shape: str, backend: str, runs: int, concurrency: int, warmup: int, out: Path, rate: int
) -> tuple[tuple[Counter[str], Counter[str]], float, dict[str, float]]:
    """Record the server under load: the samples per component and the event loop thread's
    per role (`summarize`), the server's CPU per run, and the CPU per run of each of its
    threads (ms)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    name = f"{shape}-{backend}"
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        tokens, rate_per_s, tool_first = PROFILED[shape]
        model = await stack.enter_async_context(
            procs.fake_model(tokens, rate_per_s, tool_first=tool_first)
        )
        if backend == RUN_FLOOR:
            server = await stack.enter_async_context(procs.run_floor(model.ready))
        else:
            if backend == "postgresql":
                new_database = await stack.enter_async_context(postgres_tls())
                url = await stack.enter_async_context(new_database())
            else:
                url = await stack.enter_async_context(procs.scratch_database())
            slots = {"AGIO_SERVER__MAX_RUNNING_RUNS": str(concurrency)}
            server = await stack.enter_async_context(procs.agio_server(model.ready, url, slots))
        await generate("agio", server.ready, warmup, concurrency=concurrency)
        outputs = {"flamegraph": out / f"{name}.svg", "raw": out / f"{name}.txt"}
        record = [py_spy, "record", "--pid", str(server.pid), "--rate", str(rate)]
        recorders = [
            await asyncio.create_subprocess_exec(
                *record,
                *("--threads", "--nonblocking", "--format", kind, "--output", str(path)),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            for kind, path in outputs.items()
        ]
        await asyncio.sleep(1.0)  # py-spy attached
        server_proc = Path(f"/proc/{server.pid}")
        times, threads = procs.cpu_times(server_proc), thread_cpu_s(server.pid)
        await generate("agio", server.ready, runs, concurrency=concurrency)
        after = thread_cpu_s(server.pid)
        threads = {tid: cpu - threads.get(tid, 0.0) for tid, cpu in after.items()}
        user, system = (b - a for a, b in zip(times, procs.cpu_times(server_proc), strict=True))
        for recorder in recorders:
            recorder.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for recorder in recorders:
            _, err = await recorder.communicate()
            if recorder.returncode not in (0, -2):
                raise RuntimeError(f"py-spy failed: {err.decode()[-2000:]}")
    names = thread_names(outputs["raw"])
    by_name: dict[str, float] = {}
    for tid, seconds in threads.items():
        name = names.get(tid, "threads py-spy never saw busy")
        by_name[name] = by_name.get(name, 0.0) + seconds / runs * 1000
    by_name["(the process, user)"] = user / runs * 1000
    by_name["(the process, system)"] = system / runs * 1000
    return summarize(outputs["raw"]), (user + system) / runs * 1000, by_name


def table(counts: Counter[str], cpu_per_run_ms: float, what: str = "component") -> str:
    total = sum(counts.values()) or 1
    lines = [f"| {what} | share of samples | ms of CPU per run |", "|---|---|---|"]
    for name, count in counts.most_common():
        share = count / total
        lines.append(f"| {name} | {share:.1%} | {share * cpu_per_run_ms:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--shape", choices=list(PROFILED), default="short")
    parser.add_argument(
        "--backend",
        choices=["sqlite", "postgresql", RUN_FLOOR],
        default="sqlite",
        help=f"{RUN_FLOOR}: profile bench/run_floor.py instead of agio-grpc",
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/profiles"))
    args = parser.parse_args(argv)
    (counts, roles), cpu, threads = asyncio.run(
        profile(
            args.shape, args.backend, args.runs, args.concurrency, args.warmup, args.out, args.rate
        )
    )
    print(f"{args.shape} runs on {args.backend}: {cpu:.2f} ms of server CPU per run (profiled)")
    print(table(counts, cpu))
    print("\n| thread | ms of CPU per run |\n|---|---|")
    for name, ms in sorted(threads.items(), key=lambda item: -item[1]):
        print(f"| {name} | {ms:.2f} |")
    print(f"\nThe event loop's thread ({EVENT_LOOP_THREAD}) by role:")
    print(table(roles, threads.get(EVENT_LOOP_THREAD, 0.0), what="role"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
