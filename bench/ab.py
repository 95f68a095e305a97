"""B1 as an A/B of two builds: each source tree's `agio-grpc serve`, run by run in turn with
the direct client, against one fake model, so both builds meet the same phases of the machine.

    python -m bench.ab /path/to/tree-a /path/to/tree-b --runs 100 --rounds 4

A tree is a checkout of the repository (`git worktree add /tmp/before <rev>`); its server
imports `agio_grpc` from the tree (first on `PYTHONPATH`, with `PYTHONSAFEPATH` so the
working directory cannot shadow it), the rest of the environment this one's. Each round
starts a fresh fake model and fresh servers and swaps which build goes first, because the run
right after the direct client's tends to be the slower one. Printed: per round, each build's
TTFT p50 and what it adds over the direct client's p50 of that round; then the mean of what
each build adds over the rounds.
Full runs of `python -m bench` differ between each other by more than a change to B1's path
usually moves it; this is how NOTES.md compares builds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import openai

from agio_grpc.client import AgioClient
from bench import procs
from bench.streaming import Samples, direct_run, service_run

DIRECT = "direct"


@dataclass(slots=True)
class Round:
    """One round: TTFT p50 by path (the direct client and each tree)."""

    order: list[str]
    """The trees in the order their runs followed the direct client's."""
    ttft_p50_ms: dict[str, float] = field(default_factory=dict)

    def added_ms(self, path: str) -> float:
        return self.ttft_p50_ms[path] - self.ttft_p50_ms[DIRECT]


def tree_environment(tree: str) -> dict[str, str]:
    """What makes a server import `agio_grpc` from `tree`: `python -m` would put its working
    directory ahead of `PYTHONPATH`, so the working directory is kept off the path."""
    path = os.pathsep.join(filter(None, (tree, os.environ.get("PYTHONPATH", ""))))
    return {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}


async def measure_round(trees: list[str], runs: int, tokens: int, warmup: int) -> Round:
    """One round: a fake model, a server per tree (each on a new database), `runs` runs per
    path in turn."""
    async with (
        procs.fake_model(tokens) as model_proc,
        AsyncExitStack() as stack,
    ):
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        clients: list[AgioClient] = []
        for index, tree in enumerate(trees):
            database = f"sqlite+aiosqlite:///{scratch / f'ab-{index}.db'}"
            server = await stack.enter_async_context(
                procs.agio_server(model_proc.ready, database, tree_environment(tree))
            )
            clients.append(await stack.enter_async_context(AgioClient(server.ready)))
        model = openai.AsyncOpenAI(base_url=model_proc.ready, api_key="bench", max_retries=0)
        stack.push_async_callback(model.close)
        samples = {path: Samples() for path in (DIRECT, *trees)}
        for index in range(warmup + runs):
            sink = (lambda _path: Samples()) if index < warmup else samples.__getitem__
            await direct_run(model, sink(DIRECT))
            for tree, client in zip(trees, clients, strict=True):
                await service_run(client, sink(tree), tokens)
    return Round(list(trees), {path: statistics.median(s.ttft_ms) for path, s in samples.items()})


async def measure(
    trees: list[str], runs: int, rounds: int, tokens: int, warmup: int
) -> list[Round]:
    """`rounds` rounds, the order of the builds swapped each round."""
    return [
        await measure_round(trees if number % 2 == 0 else trees[::-1], runs, tokens, warmup)
        for number in range(rounds)
    ]


def table(trees: list[str], rounds: list[Round]) -> str:
    lines = [
        "| build | " + " | ".join(f"round {n + 1}" for n in range(len(rounds))) + " | mean |",
        "|---|" + "---|" * (len(rounds) + 1),
        "| direct TTFT p50 ms | "
        + " | ".join(f"{r.ttft_p50_ms[DIRECT]:.2f}" for r in rounds)
        + f" | {statistics.fmean(r.ttft_p50_ms[DIRECT] for r in rounds):.2f} |",
    ]
    for tree in trees:
        cells = " | ".join(f"{r.ttft_p50_ms[tree]:.2f} ({r.added_ms(tree):+.2f})" for r in rounds)
        added = statistics.fmean(r.added_ms(tree) for r in rounds)
        lines.append(f"| {tree}: TTFT p50 (added) ms | {cells} | {added:+.2f} |")
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees of agio-grpc")
    parser.add_argument("--runs", type=positive, default=100, help="runs per path and round")
    parser.add_argument("--rounds", type=positive, default=4)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    trees = [str(tree.resolve()) for tree in args.trees]
    for tree in trees:
        if not (Path(tree) / "agio_grpc" / "__init__.py").is_file():
            parser.error(f"{tree} is not a source tree of agio-grpc (no agio_grpc/__init__.py)")
    if trees[0] == trees[1]:
        parser.error("the two trees are the same directory")
    rounds = asyncio.run(measure(trees, args.runs, args.rounds, args.tokens, args.warmup))
    print(table(trees, rounds))


if __name__ == "__main__":
    main()
