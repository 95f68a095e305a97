"""The benchmark tables (printed and written as markdown), PNG plots, machine and versions."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from bench.concurrency import LevelResult
from bench.runs import TOKENS, RunsRow
from bench.stats import GAUGE_ADDITIONS, GAUGE_ROUND_TRIPS, SpeedGauge, median, percentile
from bench.store import StoreResult
from bench.streaming import StreamingResult

PACKAGES = ("grpcio", "protobuf", "openai", "openai-agents", "SQLAlchemy", "asyncpg")


@dataclass(slots=True)
class Report:
    command: str
    streaming: StreamingResult | None = None
    concurrency: list[LevelResult] = field(default_factory=list)
    concurrency_settings: tuple[int, float] = (100, 10.0)
    store: list[StoreResult] = field(default_factory=list)
    runs: list[RunsRow] = field(default_factory=list)
    gauges: list[tuple[str, SpeedGauge]] = field(default_factory=list)
    """The machine's speed (`bench.stats.speed_gauge`) before each part and at the end."""


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def _machine_lines(report: Report) -> list[str]:
    versions = ", ".join(f"{name} {_version(name)}" for name in PACKAGES)
    return [
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; command: `{report.command}`",
        f"- machine: {os.cpu_count()} x {_cpu_model()}, {_memory_gb():.0f} GB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}; SQLite {sqlite3.sqlite_version}; {versions}",
        "- everything on 127.0.0.1; fake model, server and clients in separate processes "
        "sharing the same cores",
        *_gauge_lines(report),
    ]


def _gauge_lines(report: Report) -> list[str]:
    if not report.gauges:
        return []
    taken = "; ".join(f"{when}: {gauge.describe()}" for when, gauge in report.gauges)
    return [
        f"- the machine's speed while it ran, as CPU ms of {GAUGE_ADDITIONS:,} additions in a "
        f"Python loop and of {GAUGE_ROUND_TRIPS:,} round trips to another thread over a socket "
        f"pair (lower is faster; this machine's speed drifts, and absolute figures with it): "
        f"{taken}",
    ]


def machine_markdown(report: Report) -> str:
    return "\n".join(_machine_lines(report))


def _streaming_rows(result: StreamingResult) -> tuple[list[list[str]], list[list[str]]]:
    paths = result.paths
    direct, agio = paths["direct"], paths["agio-grpc"]
    ttft_rows = []
    for name, samples in paths.items():
        ttft_rows.append(
            [
                name,
                f"{percentile(samples.ttft_ms, 50):.2f}",
                f"{percentile(samples.ttft_ms, 99):.2f}",
                f"{median(samples.tokens_per_s):.0f}",
                f"{median(samples.tokens_per_s) / median(direct.tokens_per_s):.2f}x",
                f"{samples.cpu_us_per_token:.1f}" if samples.tokens else "-",
            ]
        )
    added_p50 = percentile(agio.ttft_ms, 50) - percentile(direct.ttft_ms, 50)
    added_p99 = percentile(agio.ttft_ms, 99) - percentile(direct.ttft_ms, 99)
    sdk = paths["agents-sdk"].cpu_us_per_token
    traced = paths["agio-grpc traced"]
    cpu_ratio_on = traced.cpu_us_per_token / sdk if sdk else 0.0
    cpu_ratio_off = agio.cpu_us_per_token / sdk if sdk else 0.0
    tps_ratio = median(agio.tokens_per_s) / median(direct.tokens_per_s)
    spans = "no OTLP receiver" if result.spans_exported is None else f"{result.spans_exported}"
    target_rows = [
        ["B1 added TTFT p50", f"{added_p50:+.2f} ms", "<= 1.0 ms", _verdict(added_p50 <= 1.0)],
        ["B1 added TTFT p99", f"{added_p99:+.2f} ms", "<= 3 ms", _verdict(added_p99 <= 3)],
    ]
    floor = paths.get("grpc relay floor")
    if floor is not None:
        hop_p50 = percentile(floor.ttft_ms, 50) - percentile(direct.ttft_ms, 50)
        over_p50 = percentile(agio.ttft_ms, 50) - percentile(floor.ttft_ms, 50)
        hop = "B1 TTFT p50 the gRPC hop alone adds (relay floor - direct)"
        over = "B1 TTFT p50 agio-grpc adds over the relay floor"
        target_rows += [
            [hop, f"{hop_p50:+.2f} ms", "-", "-"],
            [over, f"{over_p50:+.2f} ms", "-", "-"],
        ]
    run_floor = paths.get("run floor")
    if run_floor is not None:
        over_p50 = percentile(agio.ttft_ms, 50) - percentile(run_floor.ttft_ms, 50)
        over_p99 = percentile(agio.ttft_ms, 99) - percentile(run_floor.ttft_ms, 99)
        target_rows += [
            [
                "B1 TTFT p50 / p99 the run floor adds (run floor - direct)",
                f"{percentile(run_floor.ttft_ms, 50) - percentile(direct.ttft_ms, 50):+.2f} / "
                f"{percentile(run_floor.ttft_ms, 99) - percentile(direct.ttft_ms, 99):+.2f} ms",
                "-",
                "-",
            ],
            [
                "B1 TTFT p50 / p99 agio-grpc adds over the run floor",
                f"{over_p50:+.2f} / {over_p99:+.2f} ms",
                "-",
                "-",
            ],
        ]
    target_rows += [
        [
            "B2 CPU/token agio-grpc traced / agents-sdk",
            f"{cpu_ratio_on:.2f} (spans exported: {spans})",
            "<= 1.0",
            _verdict(0 < cpu_ratio_on <= 1.0),
        ],
        ["B2 CPU/token agio-grpc untraced / agents-sdk", f"{cpu_ratio_off:.2f}", "-", "-"],
        [
            "B2 server CPU/token agio-grpc untraced",
            f"{agio.cpu_us_per_token:.1f} µs",
            "<= 30 µs",
            _verdict(0 < agio.cpu_us_per_token <= 30),
        ],
        *(
            [["B2 server CPU/token run floor", f"{run_floor.cpu_us_per_token:.1f} µs", "-", "-"]]
            if run_floor is not None
            else []
        ),
        [
            "B3 tokens/s agio-grpc / direct",
            f"{tps_ratio:.2f}",
            ">= 0.9",
            _verdict(tps_ratio >= 0.9),
        ],
    ]
    return ttft_rows, target_rows


def _streaming_markdown(result: StreamingResult) -> str:
    rows, targets = _streaming_rows(result)
    return "\n\n".join(
        [
            f"## B1-B3: one run at a time ({result.runs} runs x {result.tokens} tokens, "
            "fake model as fast as it can, SQLite)",
            _table(
                ["path", "TTFT p50 ms", "TTFT p99 ms", "tokens/s", "vs direct", "CPU µs/token"],
                rows,
            ),
            "CPU per token: the client process's for direct and agents-sdk (both run in "
            "process), the server process's for agio-grpc (relaying over gRPC and storing "
            "every step) and for the grpc relay floor (a bare grpc.aio server relaying the plain "
            "openai client's stream: no store, no engine; bench/floor.py) and the run floor "
            "(what an agio-grpc run writes, the model read with agio-grpc's own driver, nothing "
            "stored, no engine; bench/run_floor.py).",
            _table(["target", "measured", "target", "verdict"], targets),
        ]
    )


def _concurrency_markdown(report: Report) -> str:
    tokens, rate = report.concurrency_settings
    pace = 1000 / rate if rate else 0.0
    rows = []
    targets: list[list[str]] = []
    floors = {lv.concurrency: lv for lv in report.concurrency if lv.system == "grpc floor"}
    for level in report.concurrency:
        rows.append(
            [
                level.system,
                str(level.concurrency),
                str(level.errors),
                f"{level.gap_p50_ms:.1f}",
                f"{level.gap_p99_ms:.1f}",
                f"{level.gap_p99_ms - pace:+.1f}",
                f"{level.ttft_p50_ms:.0f}",
                f"{level.cpu_ms_per_run:.1f}",
                f"{level.peak_rss_mb:.0f}",
                f"{level.wall_s:.1f}",
                f"{level.machine_cores:.2f}",
            ]
        )
        floor = floors.get(level.concurrency)
        if level.system.startswith("agio-grpc") and level.concurrency >= 1000 and floor:
            targets += _b4_targets(level, floor, pace)
        elif level.system == "run floor" and level.concurrency >= 1000 and floor:
            ratio = level.cpu_ms_per_run / floor.cpu_ms_per_run if floor.cpu_ms_per_run else 0.0
            targets.append(
                [
                    f"B4 run floor, {level.concurrency} runs: server CPU per run / the floor's",
                    f"{ratio:.2f} ({level.cpu_ms_per_run:.1f} / {floor.cpu_ms_per_run:.1f} ms)",
                    "-",
                    "-",
                ]
            )
    errors = [
        f"- {level.system} x{level.concurrency}: {sample}"
        for level in report.concurrency
        for sample in level.error_samples[:2]
    ]
    parts = [
        f"## B4: concurrent runs (one tool call, then {tokens} tokens at {rate:g} tokens/s; "
        f"model pace {pace:.0f} ms)",
        _table(
            [
                "system",
                "runs",
                "errors",
                "gap p50 ms",
                "gap p99 ms",
                "p99 over pace",
                "TTFT p50 ms",
                "CPU ms/run",
                "peak MB",
                "wall s",
                "machine cores",
            ],
            rows,
        ),
        "CPU and memory: the server process for agio-grpc and the grpc floor (load generators "
        "excluded); the one process running the SDK for agents-sdk (its callers included, as "
        "they share it). grpc floor: a bare grpc.aio server streaming the same paced deltas "
        "with nothing behind them (bench/floor.py), what Python gRPC alone costs here; each of "
        "its streams starts at a random phase of the pace, so its TTFT is not comparable. "
        "grpc relay floor: a bare grpc.aio server relaying the paced model, read with the "
        "plain openai client (no tool call, no store, no engine): what reading a model and "
        "relaying it costs in Python alone. run floor: a bare grpc.aio server writing what an "
        "agio-grpc run of this shape writes, the model read with agio-grpc's own driver, the "
        "tool run inline, no store, engine or tracing (bench/run_floor.py). "
        "Machine cores: CPU of every process of the level (server, fake model, load "
        f"generators) per wall second; this machine has {os.cpu_count()}.",
    ]
    if targets:
        parts.append(_table(["target", "measured", "target", "verdict"], targets))
    if errors:
        parts.append("Error samples:\n\n" + "\n".join(errors))
    return "\n\n".join(parts)


def _b4_targets(level: LevelResult, floor: LevelResult, pace: float) -> list[list[str]]:
    """B4's targets for one agio-grpc level, against the gRPC floor's level of the same run."""
    over, floor_over = level.gap_p99_ms - pace, floor.gap_p99_ms - pace
    limit = 2 * max(floor_over, 0.0)
    ratio = level.cpu_ms_per_run / floor.cpu_ms_per_run if floor.cpu_ms_per_run else 0.0
    name = f"B4 {level.system}, {level.concurrency} runs"
    return [
        [
            f"{name}: errors, p99 gap over pace",
            f"{level.errors}, {over:+.1f} ms (floor {floor_over:+.1f})",
            f"0, <= {limit:.1f} ms (2x the floor's)",
            _verdict(level.errors == 0 and over <= limit),
        ],
        [
            f"{name}: server CPU per run / the floor's",
            f"{ratio:.2f} ({level.cpu_ms_per_run:.1f} / {floor.cpu_ms_per_run:.1f} ms)",
            "<= 1.5",
            _verdict(0 < ratio <= 1.5),
        ],
    ]


def _runs_markdown(rows: list[RunsRow]) -> str:
    table = [
        [
            row.shape,
            row.system,
            row.backend,
            str(row.runs),
            str(row.concurrency),
            str(row.errors),
            f"{row.cpu_ms_per_run:.2f}",
            f"{row.runs_per_s:.0f}",
            f"{row.ttft_p50_ms:.1f}",
        ]
        for row in rows
    ]
    targets: list[list[str]] = []
    limits = {"short": 3.0, "tool": 4.5}
    for shape, limit in limits.items():
        of = {(r.system, r.backend): r for r in rows if r.shape == shape}
        sqlite, sdk = of.get(("agio-grpc", "sqlite")), of.get(("agents-sdk", "in process"))
        postgres = of.get(("agio-grpc", "postgresql, TLS"))
        if sqlite is None:
            continue
        ok = sqlite.errors == 0 and sqlite.cpu_ms_per_run <= limit
        measured = f"{sqlite.cpu_ms_per_run:.2f} ms"
        if shape == "short" and sdk is not None:
            ratio = sqlite.cpu_ms_per_run / sdk.cpu_ms_per_run if sdk.cpu_ms_per_run else 0.0
            ok = ok and ratio <= 0.3
            measured += f" ({ratio:.2f}x the Agents SDK's {sdk.cpu_ms_per_run:.2f})"
            limit_text = f"<= {limit} ms, <= 0.3x the Agents SDK"
        else:
            limit_text = f"<= {limit} ms"
        targets.append([f"B6 {shape} run, server CPU, SQLite", measured, limit_text, _verdict(ok)])
        if (floor := of.get(("run floor", "none"))) is not None:
            added = sqlite.cpu_ms_per_run - floor.cpu_ms_per_run
            targets.append(
                [
                    f"B6 {shape} run, what agio-grpc on SQLite adds to the run floor",
                    f"{added:+.2f} ms (floor {floor.cpu_ms_per_run:.2f})",
                    "-",
                    "-",
                ]
            )
        if postgres is not None and sqlite.cpu_ms_per_run:
            ratio = postgres.cpu_ms_per_run / sqlite.cpu_ms_per_run
            targets.append(
                [
                    f"B6 {shape} run, PostgreSQL (TLS) / SQLite, CPU per run",
                    f"{ratio:.2f}",
                    "<= 1.25",
                    _verdict(postgres.errors == 0 and ratio <= 1.25),
                ]
            )
    errors = [f"- {r.shape} {r.system} {r.backend}: {e}" for r in rows for e in r.error_samples[:2]]
    parts = [
        f"## B6: whole runs, server CPU per run ({TOKENS}-token answers, fake model as fast "
        "as it can)",
        _table(
            [
                "shape",
                "system",
                "backend",
                "runs",
                "at once",
                "errors",
                "CPU ms/run",
                "runs/s",
                "TTFT p50 ms",
            ],
            table,
        ),
        "short: one model call; tool: a `calculate` call, its result, a second model call. "
        "CPU: the `agio-grpc serve` process (one process, tracing off) over the measured runs, "
        "after unmeasured warm-up runs; for agents-sdk the one process running "
        "`Runner.run_streamed` and its callers. grpc floor: a bare grpc.aio server streaming "
        "a short run's messages, one delta per token, with nothing behind them. run floor: a "
        "bare grpc.aio server writing the messages of an agio-grpc run of that shape, the model "
        "read with agio-grpc's own driver and the tool run inline, with no store, engine or "
        "tracing (bench/run_floor.py): what the run costs in Python here before any of them. "
        "PostgreSQL: the database connection over TLS "
        "(`?ssl=require`; a throwaway cluster with `ssl = on` and its own certificate, or the "
        "server in AGIO_TEST_POSTGRES_URL). Load: one generator process keeping that many "
        "runs going (bench/runs.py).",
    ]
    if targets:
        parts.append(_table(["target", "measured", "target", "verdict"], targets))
    if errors:
        parts.append("Error samples:\n\n" + "\n".join(errors))
    return "\n\n".join(parts)


def _store_markdown(results: list[StoreResult]) -> str:
    rows = []
    writes = []
    targets = []
    for result in results:
        if result.skipped:
            rows.append([result.backend, f"skipped: {result.skipped}", "", "", "", "", ""])
            continue
        for size, (mid, p99) in result.context_ms.items():
            full = f"{result.full_read_ms[size]:.2f}"
            whole, held = result.run_start_ms[size]
            rows.append(
                [
                    result.backend,
                    str(size),
                    f"{mid:.2f}",
                    f"{p99:.2f}",
                    full,
                    f"{whole:.2f}",
                    f"{held:.2f}",
                ]
            )
            if result.backend == "sqlite" and size == 1000:
                targets.append(
                    [
                        "B5 context build, 1,000 steps, SQLite",
                        f"{mid:.2f} ms",
                        "<= 5 ms",
                        _verdict(mid <= 5),
                    ]
                )
                if (floor := result.floor_ms.get(size)) is not None:
                    targets.append(
                        [
                            "B5 context build's floor, 1,000 steps, SQLite",
                            f"{floor:.2f} ms (agio-grpc {mid / floor:.2f}x)",
                            "-",
                            "-",
                        ]
                    )
        for writers, rate in result.writes_per_s.items():
            writes.append([result.backend, str(writers), f"{rate:.0f}"])
    parts = [
        "## B5: store",
        "Context build: read the conversation (`get_history`, what a run reads before its "
        "first model call) + build the messages. Full read: `get_steps` of the same steps, "
        "every column (what ListSteps serves). Run start: `start_run` (take the session, "
        "store the input and the run, read the history) + build the messages, reading the "
        "whole history or only the steps after the history the server kept from the "
        "session's previous run (engine/history.py). Each backend is measured in processes "
        "of its own shaped like `agio-grpc serve` (its modules, its frozen start-up heap), "
        f"each on an empty database, their timings pooled ({_processes(results)}). The "
        "floor (SQLite): the same messages straight from stdlib sqlite3 on the caller's "
        "thread, one dict per row, no step objects, repair or store around it, timed in turn "
        "with the builds (bench/store.py `floor_messages`).",
        _table(
            [
                "backend",
                "steps",
                "context build median ms",
                "p99 ms",
                "full read median ms",
                "run start, whole history, median ms",
                "run start, history kept, median ms",
            ],
            rows,
        ),
        "Step writes, one step per transaction, each writer on its own session (the first "
        "process only):",
        _table(["backend", "concurrent writers", "steps/s"], writes),
    ]
    if targets:
        parts.append(_table(["target", "measured", "target", "verdict"], targets))
    return "\n\n".join(parts)


def _processes(results: list[StoreResult]) -> str:
    counts = sorted({r.processes for r in results if not r.skipped})
    return ", ".join(f"{n} process{'es' if n != 1 else ''}" for n in counts) or "none"


def to_markdown(report: Report) -> str:
    parts = [
        "# agio-grpc benchmarks",
        "Written by `make bench` (`python -m bench`); what was changed to get here, with "
        "before/after figures and profiles, is in [NOTES.md](NOTES.md).",
        machine_markdown(report),
    ]
    if report.streaming is not None:
        parts.append(_streaming_markdown(report.streaming))
    if report.concurrency:
        parts.append(_concurrency_markdown(report))
    if report.store:
        parts.append(_store_markdown(report.store))
    if report.runs:
        parts.append(_runs_markdown(report.runs))
    plots = [name for name in PLOTS if (report_has(report, name))]
    if plots:
        parts.append("## Plots\n\n" + "\n\n".join(f"![{name}]({name}.png)" for name in plots))
    return "\n\n".join(parts) + "\n"


PLOTS = ("ttft", "cpu_per_token", "concurrency_gaps", "context_build")


def report_has(report: Report, plot: str) -> bool:
    return {
        "ttft": report.streaming is not None,
        "cpu_per_token": report.streaming is not None,
        "concurrency_gaps": bool(report.concurrency),
        "context_build": any(not r.skipped for r in report.store),
    }[plot]


def write_plots(report: Report, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(figure: object, name: str) -> None:
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
        plt.close(figure)  # type: ignore[arg-type]
        written.append(path)

    if report.streaming is not None:
        paths = report.streaming.paths
        names = list(paths)
        figure, axis = plt.subplots(figsize=(7, 3.5))
        p50 = [percentile(paths[n].ttft_ms, 50) for n in names]
        p99 = [percentile(paths[n].ttft_ms, 99) for n in names]
        xs = range(len(names))
        axis.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
        axis.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
        axis.set_xticks(list(xs), names)
        axis.set_ylabel("time to first token (ms)")
        axis.set_title("B1: time to first token")
        axis.legend()
        save(figure, "ttft")

        figure, axis = plt.subplots(figsize=(7, 3.5))
        axis.bar(names, [paths[n].cpu_us_per_token for n in names])
        axis.set_ylabel("CPU µs per token")
        axis.set_title("B2: CPU per streamed token")
        save(figure, "cpu_per_token")

    if report.concurrency:
        figure, axis = plt.subplots(figsize=(7, 3.5))
        for system in sorted({level.system for level in report.concurrency}):
            levels = [lv for lv in report.concurrency if lv.system == system]
            axis.plot(
                [lv.concurrency for lv in levels],
                [lv.gap_p99_ms for lv in levels],
                marker="o",
                label=f"{system} p99",
            )
            axis.plot(
                [lv.concurrency for lv in levels],
                [lv.gap_p50_ms for lv in levels],
                marker="x",
                linestyle="--",
                label=f"{system} p50",
            )
        _, rate = report.concurrency_settings
        if rate:
            axis.axhline(1000 / rate, color="grey", linewidth=0.8, label="model pace")
        axis.set_yscale("log")
        axis.set_xlabel("concurrent runs")
        axis.set_ylabel("gap between tokens (ms, log)")
        axis.set_title("B4: token gaps under concurrency")
        axis.legend()
        save(figure, "concurrency_gaps")

    measured = [r for r in report.store if not r.skipped]
    if measured:
        figure, axis = plt.subplots(figsize=(7, 3.5))
        for result in measured:
            sizes = list(result.context_ms)
            axis.plot(
                sizes, [result.context_ms[s][0] for s in sizes], marker="o", label=result.backend
            )
            axis.plot(
                sizes,
                [result.run_start_ms[s][1] for s in sizes],
                marker="x",
                linestyle="--",
                label=f"{result.backend}: run start, history kept",
            )
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("steps in the session")
        axis.set_ylabel("median (ms)")
        axis.set_title("B5: context build time")
        axis.legend()
        save(figure, "context_build")
    return written
