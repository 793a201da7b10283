"""
Smoke runs of the benchmark tools: they must keep working.  No timing is
asserted here (speed is measured by the benchmarks, not by tests).
"""

from __future__ import annotations

from lockservice import bench


def test_bench_runs_every_scenario_briefly(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    for scenario, conns, depth in [("uncontended", 1, 1), ("uncontended", 4, 4),
                                   ("contended", 4, 1)]:
        result = bench.run(node.address, scenario, conns, depth, duration=0.5, warmup=0.2,
                           serverPid=node.pid, progress=False)
        assert result["errors"] == 0 and result["timeouts"] == 0
        assert result["pairs_per_s"] > 0
        assert result["p50_ms"] <= result["p99_ms"] <= result["p999_ms"]
        assert "server_cpu_percent" in result


def test_echo_ceiling_and_table() -> None:
    from lockservice.testing.harness import freePort

    port = freePort()
    echo = bench._startEcho(port)
    try:
        result = bench.run(f"127.0.0.1:{port}", "echo", 2, 1, duration=0.5, warmup=0.2,
                           progress=False)
    finally:
        echo.kill()
        echo.wait()
    assert result["round_trips_per_s"] > 0
    table = bench.formatTable([result])
    assert table.splitlines()[2].startswith("| echo | 2 | closed-loop |")


def test_memory_probe_small() -> None:
    result = bench.memory(keys=20000, idle=200)
    assert result["held_keys"] == 20000 and result["idle_connections"] == 200
    assert result["rss_held_mb"] > result["rss_empty_mb"]
