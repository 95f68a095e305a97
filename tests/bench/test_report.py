"""The benchmark report's verdicts follow from its figures (a missed target never reads met)."""

from __future__ import annotations

from bench.concurrency import LevelResult
from bench.report import Report, to_markdown
from bench.runs import RunsRow
from bench.stats import SpeedGauge, speed_gauge
from bench.store import StoreResult
from bench.streaming import Samples, StreamingResult


def samples(ttft_ms: float, tokens_per_s: float, cpu_us_per_token: float) -> Samples:
    return Samples(
        ttft_ms=[ttft_ms] * 5,
        tokens_per_s=[tokens_per_s] * 5,
        cpu_s=cpu_us_per_token * 1000 / 1e6,
        tokens=1000,
    )


def level(system: str, runs: int, gap_p99_ms: float, errors: int = 0) -> LevelResult:
    return LevelResult(
        system=system,
        concurrency=runs,
        errors=errors,
        error_samples=["CANCELLED"] * min(errors, 1),
        gap_p50_ms=100.0,
        gap_p99_ms=gap_p99_ms,
        ttft_p50_ms=500.0,
        cpu_ms_per_run=40.0,
        peak_rss_mb=100.0,
        wall_s=12.0,
        machine_cores=1.2,
    )


def whole(shape: str, system: str, backend: str, cpu_ms: float) -> RunsRow:
    return RunsRow(system, backend, shape, 1000, 25, 0, cpu_ms, 200.0, 20.0, [])


def report(
    *,
    agio_ttft_ms: float,
    gap_p99_ms: float,
    errors: int,
    context_ms: float,
    cpu_us_per_token: float = 25.0,
    run_cpu_ms: float = 2.5,
) -> Report:
    paths = {
        "direct": samples(6.0, 3000, 300),
        "grpc relay floor": samples(8.0, 2000, 500),
        "agio-grpc": samples(agio_ttft_ms, 2800, cpu_us_per_token),
        "agents-sdk": samples(90.0, 2000, 450),
        "agio-grpc traced": samples(agio_ttft_ms, 2700, 160),
    }
    store = StoreResult(
        "sqlite",
        context_ms={1000: (context_ms, context_ms * 2)},
        full_read_ms={1000: context_ms},
        run_start_ms={1000: (context_ms + 1, 2.0)},
        writes_per_s={1: 1000.0},
    )
    return Report(
        command="python -m bench",
        streaming=StreamingResult(runs=5, tokens=200, paths=paths, spans_exported=10),
        concurrency=[
            level("agio-grpc", 1000, gap_p99_ms, errors),
            level("grpc floor", 1000, 120.0),
        ],
        store=[store, StoreResult("postgresql", skipped="no server")],
        runs=[
            whole("short", "agents-sdk", "in process", 10.0),
            whole("short", "agio-grpc", "sqlite", run_cpu_ms),
            whole("short", "agio-grpc", "postgresql, TLS", run_cpu_ms * 1.2),
            whole("tool", "agio-grpc", "sqlite", run_cpu_ms + 1.5),
            whole("tool", "agio-grpc", "postgresql, TLS", (run_cpu_ms + 1.5) * 1.3),
        ],
    )


def verdicts(markdown: str) -> dict[str, str]:
    """Target table rows: name -> last cell."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| B")]
    return {cells[0].strip(): cells[-1].strip() for cells in rows}


def test_targets_met_read_met() -> None:
    found = verdicts(to_markdown(report(agio_ttft_ms=6.8, gap_p99_ms=140, errors=0, context_ms=4)))
    assert found["B1 added TTFT p50"] == "met"  # +0.8 ms
    assert found["B1 TTFT p50 agio-grpc adds over the relay floor"] == "-"
    assert found["B2 CPU/token agio-grpc traced / agents-sdk"] == "met"
    assert found["B2 server CPU/token agio-grpc untraced"] == "met"  # 25 µs
    assert found["B3 tokens/s agio-grpc / direct"] == "met"
    # +40 ms over pace against the floor's +20: at 2x the floor's, met
    assert found["B4 agio-grpc, 1000 runs: errors, p99 gap over pace"] == "met"
    assert found["B4 agio-grpc, 1000 runs: server CPU per run / the floor's"] == "met"
    assert found["B5 context build, 1,000 steps, SQLite"] == "met"
    assert found["B6 short run, server CPU, SQLite"] == "met"  # 2.5 ms, 0.25x the SDK's
    assert found["B6 short run, PostgreSQL (TLS) / SQLite, CPU per run"] == "met"  # 1.2
    assert found["B6 tool run, server CPU, SQLite"] == "met"  # 4.0 ms


def test_targets_missed_read_missed() -> None:
    markdown = to_markdown(
        report(
            agio_ttft_ms=7.5,
            gap_p99_ms=141,
            errors=0,
            context_ms=5.5,
            cpu_us_per_token=31,
            run_cpu_ms=3.1,
        )
    )
    found = verdicts(markdown)
    assert found["B1 added TTFT p50"] == "**missed**"  # +1.5 ms
    assert found["B2 server CPU/token agio-grpc untraced"] == "**missed**"
    assert found["B4 agio-grpc, 1000 runs: errors, p99 gap over pace"] == "**missed**"  # +41 ms
    assert found["B5 context build, 1,000 steps, SQLite"] == "**missed**"
    assert found["B6 short run, server CPU, SQLite"] == "**missed**"  # 3.1 ms
    assert found["B6 tool run, server CPU, SQLite"] == "**missed**"  # 4.6 ms
    assert found["B6 tool run, PostgreSQL (TLS) / SQLite, CPU per run"] == "**missed**"  # 1.3
    assert "skipped: no server" in markdown


def test_what_agio_grpc_adds_to_the_run_floor_is_reported_per_shape() -> None:
    measured = report(agio_ttft_ms=7, gap_p99_ms=120, errors=0, context_ms=5, run_cpu_ms=4.5)
    measured.runs += [
        whole("short", "run floor", "none", 2.75),
        whole("tool", "run floor", "none", 4.0),
    ]
    rows = [line for line in to_markdown(measured).splitlines() if "adds to the run floor" in line]
    assert rows == [
        "| B6 short run, what agio-grpc on SQLite adds to the run floor | +1.75 ms (floor 2.75) "
        "| - | - |",
        "| B6 tool run, what agio-grpc on SQLite adds to the run floor | +2.00 ms (floor 4.00) "
        "| - | - |",
    ]


def test_the_run_floors_cpu_in_b4_is_read_against_the_grpc_floor() -> None:
    measured = report(agio_ttft_ms=7, gap_p99_ms=120, errors=0, context_ms=5)
    measured.concurrency.append(level("run floor", 1000, 125.0))
    measured.concurrency[1].cpu_ms_per_run = 16.0  # the grpc floor's
    found = verdicts(to_markdown(measured))
    assert found["B4 run floor, 1000 runs: server CPU per run / the floor's"] == "-"
    assert "| 2.50 (40.0 / 16.0 ms) | - | - |" in to_markdown(measured)


def test_b1_and_b2_read_the_run_floor_when_it_ran() -> None:
    measured = report(agio_ttft_ms=7, gap_p99_ms=120, errors=0, context_ms=5)
    assert not [name for name in verdicts(to_markdown(measured)) if "run floor" in name]
    assert measured.streaming is not None
    measured.streaming.paths["run floor"] = samples(6.5, 2900, 20)
    found = {
        name: line for name, line in verdicts(to_markdown(measured)).items() if "run floor" in name
    }
    assert set(found) == {
        "B1 TTFT p50 / p99 the run floor adds (run floor - direct)",
        "B1 TTFT p50 / p99 agio-grpc adds over the run floor",
        "B2 server CPU/token run floor",
    }
    assert "| B2 server CPU/token run floor | 20.0 µs | - | - |" in to_markdown(measured)
    assert "| B1 TTFT p50 / p99 agio-grpc adds over the run floor | +0.50 / +0.50 ms |" in (
        to_markdown(measured)
    )


def test_b5_reads_its_floor_when_measured() -> None:
    measured = report(agio_ttft_ms=7, gap_p99_ms=120, errors=0, context_ms=6)
    assert "B5 context build's floor, 1,000 steps, SQLite" not in verdicts(to_markdown(measured))
    measured.store[0].floor_ms = {1000: 4.0}
    line = "| B5 context build's floor, 1,000 steps, SQLite | 4.00 ms (agio-grpc 1.50x) | - | - |"
    assert line in to_markdown(measured)


def test_errors_alone_miss_b4() -> None:
    found = verdicts(to_markdown(report(agio_ttft_ms=7, gap_p99_ms=120, errors=1, context_ms=5)))
    assert found["B4 agio-grpc, 1000 runs: errors, p99 gap over pace"] == "**missed**"


def test_the_machines_speed_is_in_the_header_when_gauged() -> None:
    measured = report(agio_ttft_ms=7, gap_p99_ms=120, errors=0, context_ms=5)
    assert "machine's speed" not in to_markdown(measured)
    measured.gauges = [
        ("before B1-B3", SpeedGauge(104.2, 52.6)),
        ("at the end", SpeedGauge(180.9, 99.5)),
    ]
    header = to_markdown(measured).split("\n## ", 1)[0]
    assert "before B1-B3: Python 104 ms, threads 53 ms; at the end: Python 181 ms, " in header


def test_the_speed_gauge_measures_both_workloads() -> None:
    gauge = speed_gauge()
    assert gauge.python_ms > 0
    assert gauge.threads_ms > 0
