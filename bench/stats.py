"""Small statistics for benchmark tables: nearest-rank percentiles, medians; and a gauge of
the machine's speed at the moment, for reading a run's absolute figures."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (`pct` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


GAUGE_ADDITIONS = 3_000_000
GAUGE_ROUND_TRIPS = 5_000


@dataclass(frozen=True, slots=True)
class SpeedGauge:
    """How fast this machine runs at the moment, as the process's CPU ms for two fixed
    workloads (the quickest of three takes each). Its speed drifts by up to ~2x over hours
    (docs/benchmarks/NOTES.md), moving every absolute figure of a run with it; both follow
    the gRPC floor's cost per run (correlation 0.63 and 0.70 over 15 samples in half an
    hour), which a round trip within one thread did not (0.28)."""

    python_ms: float
    """`GAUGE_ADDITIONS` additions in a pure-Python loop."""
    threads_ms: float
    """`GAUGE_ROUND_TRIPS` one-byte round trips over a socket pair to a thread that echoes
    them: wake-ups and hand-offs between threads, as gRPC's poller makes."""

    def describe(self) -> str:
        return f"Python {self.python_ms:.0f} ms, threads {self.threads_ms:.0f} ms"


def speed_gauge() -> SpeedGauge:
    return SpeedGauge(_quickest_of_three(_additions), _quickest_of_three(_round_trips))


def _quickest_of_three(work: Callable[[], None]) -> float:
    quickest = float("inf")
    for _ in range(3):
        started = time.process_time()  # every thread of the process
        work()
        quickest = min(quickest, time.process_time() - started)
    return quickest * 1000


def _additions() -> None:
    total = 0
    for value in range(GAUGE_ADDITIONS):
        total += value


def _round_trips() -> None:
    left, right = socket.socketpair()

    def echo() -> None:
        for _ in range(GAUGE_ROUND_TRIPS):
            right.send(right.recv(1))

    with left, right:
        echoing = threading.Thread(target=echo, name="speed-gauge-echo")
        echoing.start()
        for _ in range(GAUGE_ROUND_TRIPS):
            left.send(b"x")
            left.recv(1)
        echoing.join()
