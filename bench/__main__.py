"""`make bench` / `python -m bench`: B1-B6 in one run; tables printed and written to docs.

    python -m bench                 # everything, a few minutes
    python -m bench --quick         # smaller, under a minute or so, nothing written
    python -m bench --only b1 b5    # some of them (b1, b2 and b3 are one measurement)

Results go to docs/benchmarks/README.md with PNG plots (`--out` elsewhere, `--no-write`
to print only). Every figure is compared with a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from bench import concurrency, report, runs, store, streaming
from bench.stats import speed_gauge

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
ALL = ("b1", "b2", "b3", "b4", "b5", "b6")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; writes nothing")
    parser.add_argument("--only", nargs="+", choices=ALL, default=list(ALL))
    parser.add_argument("--runs", type=int, help="B1-B3 runs per path (default 30; quick 10)")
    parser.add_argument("--tokens", type=int, help="B1-B3 tokens per run (default 200)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="B4 levels (default 100 500 1000; quick 50)",
    )
    parser.add_argument("--b4-tokens", type=int, default=100, help="B4 tokens per reply")
    parser.add_argument("--b4-rate", type=float, default=10.0, help="B4 model tokens/s")
    parser.add_argument("--no-sdk", action="store_true", help="B4 and B6 without the Agents SDK")
    parser.add_argument("--no-postgres", action="store_true", help="B4-B6 on SQLite only")
    parser.add_argument("--b6-runs", type=int, help="B6 runs per row (default 1000; quick 100)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser


async def run(args: argparse.Namespace, command: str) -> report.Report:
    quick = args.quick
    only = set(args.only)
    result = report.Report(command=command, concurrency_settings=(args.b4_tokens, args.b4_rate))
    if only & {"b1", "b2", "b3"}:
        result.gauges.append(("before B1-B3", speed_gauge()))
        per_path = args.runs or (10 if quick else 30)
        tokens = args.tokens or 200
        print(f"B1-B3: {per_path} runs x {tokens} tokens per path...", file=sys.stderr)
        result.streaming = await streaming.measure(per_path, tokens, args.warmup)
    if "b4" in only:
        result.gauges.append(("before B4", speed_gauge()))
        levels = args.concurrency or ([50] if quick else [100, 500, 1000])
        print(f"B4: concurrency {levels}...", file=sys.stderr)
        result.concurrency = await concurrency.measure(
            levels, args.b4_tokens, args.b4_rate, sdk=not args.no_sdk, postgres=not args.no_postgres
        )
    if "b5" in only:
        result.gauges.append(("before B5", speed_gauge()))
        sizes = [100, 1000] if quick else [100, 1000, 10000]
        writers = [1, 10] if quick else [1, 10, 50]
        print(f"B5: context build {sizes} steps, writers {writers}...", file=sys.stderr)
        result.store = await store.measure(
            sizes,
            writers,
            repeats=10 if quick else 30,
            write_s=1.0 if quick else 3.0,
            postgres=not args.no_postgres,
        )
    if "b6" in only:
        result.gauges.append(("before B6", speed_gauge()))
        count = args.b6_runs or (100 if quick else 1000)
        print(f"B6: {count} short and tool runs per system...", file=sys.stderr)
        result.runs = await runs.measure(
            count,
            concurrency=25,
            warmup=20 if quick else 100,
            postgres=not args.no_postgres,
            sdk=not args.no_sdk,
        )
    result.gauges.append(("at the end", speed_gauge()))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", "-m", "bench", *argv])
    result = asyncio.run(run(args, command))
    markdown = report.to_markdown(result)
    print(markdown)
    if not (args.no_write or args.quick):
        args.out.mkdir(parents=True, exist_ok=True)
        report.write_plots(result, args.out)
        (args.out / "README.md").write_text(markdown)
        print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
