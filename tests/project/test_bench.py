"""
Smoke runs of the benchmark tools: they must keep working.  No timing is
asserted here (speed is measured by the benchmarks, not by tests).
"""

from __future__ import annotations

from lockservice import bench
from lockservice.testing.harness import LineClient


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


def test_fixed_pairs_serves_exactly_that_many(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    The driver behind `bench instructions` (a count, not a time): every
    pair asked for is served, each an acquire granted and released.
    """
    node = spawn()
    assert bench.fixedPairs("127.0.0.1", node.port, 8, 500) == 500
    assert bench.fixedPairs("127.0.0.1", node.port, 3, 0) == 0
    with LineClient(node.port) as client:  # every pair ended in its release
        for i in range(8):
            assert client.ask(b"A fixed%d 5 0" % i).startswith(b"A fixed%d " % i)


def test_echo_ceiling_and_table() -> None:
    from lockservice.testing.harness import freePort

    port = freePort()
    echo = bench.startEcho(port)
    try:
        result = bench.run(f"127.0.0.1:{port}", "echo", 2, 1, duration=0.5, warmup=0.2,
                           progress=False)
    finally:
        echo.kill()
        echo.wait()
    assert result["round_trips_per_s"] > 0
    table = bench.formatTable([dict(result, target="echo")])
    assert table.splitlines()[2].startswith("| echo | echo | 2 | closed-loop |")


def test_suite_compares_a_single_node_with_the_active_of_a_cluster() -> None:
    rows = bench.suite(duration=0.3, conns=[2], depth=2, out=lambda *a: None)
    targets = {(r["scenario"], r["depth"], r["target"]) for r in rows}
    for scenario in ("uncontended", "contended"):
        for depth in (1, 2):
            assert (scenario, depth, "single node") in targets
            assert (scenario, depth, "active of 3") in targets
    cluster = [r for r in rows if r["target"] == "active of 3"]
    assert all(r["errors"] == 0 for r in rows)
    # CPU per pair is measured for the active and for its standbys.
    assert all("server_cpu_us_per_pair" in r and "standbys_cpu_us_per_pair" in r
               for r in cluster)
    table = bench.formatTable(rows)
    assert "active of 3" in table and "×" in table


def test_no_progress_bar_when_stderr_is_a_file(spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    node = spawn()
    with open(tmp_path / "stderr", "wb") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "lockservice.bench", "run", "--addr", node.address,
             "-c", "1", "--duration", "0.6", "--warmup", "0.1"],
            stdout=subprocess.PIPE, stderr=stderr, timeout=60,
        )
    assert done.returncode == 0, done
    assert b"pairs_per_s" in done.stdout
    written = (tmp_path / "stderr").read_bytes()
    assert b"[" not in written and b"\r" not in written, written


def test_sync_scenario_reports_join_time_and_ping_gaps() -> None:
    result = bench.sync(keys=2000)
    assert result["held_keys"] == 2000
    assert result["join_s_from_start"] > 0
    assert result["active_role_after"] == "active"
    assert result["active_max_ping_ms"] > 0 and result["standby_max_ping_ms"] > 0


def test_sharded_run_sends_each_key_to_the_cluster_that_owns_it(spawn) -> None:  # type: ignore[no-untyped-def]
    import urllib.request

    from lockservice.client.sharding import choose
    from lockservice.testing.harness import freePort

    httpPorts = [freePort(), freePort()]
    nodes = [spawn(args=["--http", f"tcp:{p}:interface=127.0.0.1"]) for p in httpPorts]
    addr = ";".join(n.address for n in nodes)
    result = bench.run(addr, "uncontended", 4, 1, duration=0.5, warmup=0.1, progress=False)
    assert result["errors"] == 0 and result["clusters"] == 2
    grants = []
    for port in httpPorts:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        grants.append(float(next(line.split()[-1] for line in text.splitlines()
                                 if line.startswith("lockservice_grants_total"))))
    assert all(g > 0 for g in grants), grants  # both clusters carried load
    # and the keys a worker used are those rendezvous hashing gives its cluster
    ids = [n.address.encode() for n in nodes]
    for mine in (0, 1):
        assert choose(ids, bench.keyOn(b"k0-0-0", (ids, mine))) == mine


def test_clients_side_by_side_prints_one_row_per_client() -> None:
    result = bench.compare([2], duration=0.3, rounds=1, clients=["python"])
    row = result["table"]["C=2"]["python"]
    assert row["pairs_per_s"] > 0 and row["errors"] == 0 and row["vs_python"] == 1.0
    assert "| 2 | python |" in bench.formatComparison(result)
