"""
The benchmark table (every scenario against the echo ceiling, a lone
node, a cluster's active node, dflockd) and the speed ratios measured
side by side.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional

from lockservice.bench.echo import startEcho
from lockservice.bench.load import DFLOCKD, run

# -- the suite --------------------------------------------------------------------


def suite(duration: float, conns: List[int], depth: int, cluster: bool = True,
          out=print) -> List[Dict[str, Any]]:  # type: ignore[no-untyped-def]
    """
    The whole table in one run: the echo ceiling, a single node, and (with
    C{cluster}) the active node of a 3-node cluster under the same load, so
    the cost of replication is read side by side.
    """
    from lockservice.testing.harness import Cluster, Node, activeNodes, freePort

    node = Node(freePort()).start()
    echoPort = freePort()
    echo = startEcho(echoPort)
    trio: Optional[Cluster] = None
    rows: List[Dict[str, Any]] = []
    try:
        if cluster:
            trio = Cluster(3).start()
            active = _waitForOneActive(trio, activeNodes)
            standbys = [n.pid for n in trio.nodes if n is not active]
        for c in conns:
            for d in (1, depth):
                row = run(f"127.0.0.1:{echoPort}", "echo", c, d, duration, serverPid=echo.pid)
                rows.append(dict(row, target="echo"))
                for scenario in ("uncontended", "contended"):
                    row = run(node.address, scenario, c, d, duration, serverPid=node.pid)
                    rows.append(dict(row, target="single node"))
                    if trio is not None:
                        row = run(active.address, scenario, c, d, duration,
                                  serverPid=active.pid, otherPids=standbys)
                        rows.append(dict(row, target="active of 3"))
    finally:
        node.stop()
        echo.kill()
        echo.wait()
        if trio is not None:
            trio.stop()
    return rows


def ratios(duration: float, rounds: int = 3, out=print,  # type: ignore[no-untyped-def]
           cluster: bool = True) -> Dict[str, Any]:
    """
    The speed targets, as ratios measured side by side: the single
    node (operator's view on) against the echo server's round trips ÷ 2
    (uncontended, C=64), against dflockd (uncontended C=64, contended
    C=16), the monitor's share of server CPU per pair (the same node with
    the monitor detached, for this comparison only), and (with
    C{cluster}) the active of a 3-node cluster against the single node
    (uncontended, C=64).  Each is the median of C{rounds} interleaved runs
    (A B A B ...).
    """
    import statistics

    from lockservice.testing.harness import Cluster, Node, activeNodes, freePort

    os.environ["LOCKSERVICE_BENCH_DETACH_MONITOR"] = "1"
    try:
        detached = Node(freePort()).start()
    finally:
        del os.environ["LOCKSERVICE_BENCH_DETACH_MONITOR"]
    node = Node(freePort()).start()
    echoPort = freePort()
    echo = startEcho(echoPort)
    dflockd = None
    dflockdPort = freePort()
    if os.access(DFLOCKD, os.X_OK):
        dflockd = subprocess.Popen([DFLOCKD, "--host", "127.0.0.1", "--port", str(dflockdPort),
                                    "--max-locks", "1000000"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", dflockdPort), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
    trio: Optional[Cluster] = None
    if cluster:
        trio = Cluster(3).start()
        active = _waitForOneActive(trio, activeNodes)
    runs: Dict[str, List[Dict[str, Any]]] = {}
    plan = [("echo", f"127.0.0.1:{echoPort}", "echo", 64, echo.pid),
            ("on", node.address, "uncontended", 64, node.pid),
            ("off", detached.address, "uncontended", 64, detached.pid),
            ("on contended", node.address, "contended", 16, node.pid)]
    if dflockd is not None:
        plan += [("dflockd", f"127.0.0.1:{dflockdPort}", "dflockd-uncontended", 64, dflockd.pid),
                 ("dflockd contended", f"127.0.0.1:{dflockdPort}", "dflockd-contended", 16,
                  dflockd.pid)]
    if trio is not None:
        plan.append(("active of 3", active.address, "uncontended", 64, active.pid))
    try:
        for _ in range(rounds):
            for name, addr, scenario, conns, pid in plan:
                runs.setdefault(name, []).append(
                    run(addr, scenario, conns, 1, duration, serverPid=pid, progress=False))
    finally:
        node.stop()
        detached.stop()
        echo.kill()
        echo.wait()
        if dflockd is not None:
            dflockd.kill()
            dflockd.wait()
        if trio is not None:
            trio.stop()

    def median(name: str, field: str) -> float:
        return statistics.median(r.get(field) or 0.0 for r in runs[name])

    def ratio(a: str, fa: str, b: str, fb: str, scale: float = 1.0) -> Optional[float]:
        if a not in runs or b not in runs:
            return None
        # The median of the per-round ratios (each round is one A B pair).
        values = [(x.get(fa) or 0.0) / ((y.get(fb) or 0.0) * scale or 1.0)
                  for x, y in zip(runs[a], runs[b], strict=True)]
        return round(statistics.median(values), 3)

    result = {
        "rounds": rounds,
        "single_vs_echo_half": ratio("on", "pairs_per_s", "echo", "round_trips_per_s", 0.5),
        "single_vs_dflockd_uncontended": ratio("on", "pairs_per_s", "dflockd", "pairs_per_s"),
        "contended_vs_dflockd": ratio("on contended", "pairs_per_s", "dflockd contended",
                                      "pairs_per_s"),
        "active_of_3_vs_single": ratio("active of 3", "pairs_per_s", "on", "pairs_per_s"),
        "monitor_cpu_share": None,
        "pairs_per_s": {name: median(name, "pairs_per_s" if name != "echo"
                                     else "round_trips_per_s") for name in runs},
        "server_cpu_us_per_pair": {name: median(name, "server_cpu_us_per_pair")
                                   for name in runs if name != "echo"},
    }
    shares = [1 - (off.get("server_cpu_us_per_pair") or 0.0)
              / (on.get("server_cpu_us_per_pair") or 1.0)
              for on, off in zip(runs["on"], runs["off"], strict=True)]
    result["monitor_cpu_share"] = round(statistics.median(shares), 3)
    out(f"ratios, median of {rounds} interleaved runs of {duration:g} s:")
    out(f"  single node (monitor on) uncontended C=64 vs echo rt/s / 2: "
        f"{result['single_vs_echo_half']}  (target >= 0.9)")
    out(f"  single node vs dflockd-go, uncontended C=64: {result['single_vs_dflockd_uncontended']}")
    out(f"  contended C=16 hand-offs vs dflockd-go: {result['contended_vs_dflockd']}  "
        "(target >= 1.0)")
    out(f"  operator's view share of server CPU per pair (on vs detached): "
        f"{result['monitor_cpu_share']:.1%}  (target <= 5%)")
    if trio is not None:
        out(f"  active of 3 vs single node, uncontended C=64: "
            f"{result['active_of_3_vs_single']}  (target >= 0.9)")
    return result


def _waitForOneActive(trio: Any, activeNodes: Any) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        active = activeNodes(trio.nodes)
        if len(active) == 1:
            return active[0]
        time.sleep(0.1)
    raise RuntimeError("the benchmark cluster elected no single active node")


def formatTable(rows: List[Dict[str, Any]]) -> str:
    ceilings = {(r["connections"], r["depth"]): r["round_trips_per_s"]
                for r in rows if r["scenario"] == "echo"}
    singles = {(r["scenario"], r["connections"], r["depth"]): r for r in rows
               if r.get("target") == "single node"}
    header = ("| scenario | target | C | mode | pairs/s (echo: rt/s) | vs echo rt/s ÷ 2 | "
              "vs single node | acquire p50 ms | p99 ms | p99.9 ms | server CPU % | "
              "server CPU µs/pair | standbys CPU µs/pair |")
    lines = [header, "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                     "| ---: | ---: |"]
    for r in rows:
        rate = r.get("pairs_per_s", r.get("round_trips_per_s"))
        ceiling = ceilings.get((r["connections"], r["depth"]))
        ratio = "" if r["scenario"] == "echo" or not ceiling else f"{rate / (ceiling / 2):.0%}"
        single = singles.get((r["scenario"], r["connections"], r["depth"]))
        versus = ""
        if r.get("target") == "active of 3" and single and single.get("pairs_per_s"):
            versus = f"{rate / single['pairs_per_s']:.2f}×"
            if single.get("server_cpu_us_per_pair") and r.get("server_cpu_us_per_pair"):
                cpu = r["server_cpu_us_per_pair"] / single["server_cpu_us_per_pair"]
                versus += f" (CPU {cpu:.2f}×)"
        lines.append(
            f"| {r['scenario']} | {r.get('target', '')} | {r['connections']} | {r['mode']} | "
            f"{rate:,} | {ratio} | {versus} | {r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | "
            f"{r.get('server_cpu_percent', '')} | {r.get('server_cpu_us_per_pair', '')} | "
            f"{r.get('standbys_cpu_us_per_pair', '')} |"
        )
    return "\n".join(lines)
