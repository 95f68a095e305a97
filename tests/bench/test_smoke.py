"""The benchmark's moving parts run end to end at toy sizes: the gRPC floor process under the
load generator process, and the store measurements. Figures are not checked, only that each
part produces them (timing belongs to `make bench`, never to tests)."""

from __future__ import annotations

from pathlib import Path

from bench import concurrency, procs
from bench.store import measure_store


async def test_the_load_generator_drives_the_grpc_floor() -> None:
    async with procs.grpc_floor(tokens=5, tokens_per_second=200) as floor:
        load = await concurrency.run_load("agio", floor.ready, 3)
        assert floor.cpu_s() > 0
        assert floor.peak_rss_mb() > 0
    assert (load.runs, load.errors) == (3, 0), load.error_samples
    assert len(load.ttft_ms) == 3
    assert len(load.gaps_ms) == 3 * 4  # 5 deltas per run: 4 gaps


async def test_the_store_measurements_run_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'b5.db'}"
    result = await measure_store(url, "sqlite", [10], [2], repeats=2, write_s=0.2)
    assert set(result.context_ms) == set(result.full_read_ms) == {10}
    assert result.writes_per_s[2] > 0
