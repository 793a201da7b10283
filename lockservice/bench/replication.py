"""
What replication costs: a lone node against the active of a 3-node
cluster with C{--replication ack} and with C{--replication sent}, under
the same closed-loop loads, side by side in one run, with the CPU of
every node and the echo server's as the floor of a Twisted process.

    lockservice bench replication [--duration 3] [--rounds 3]

Loads: one connection (acquire+release pairs on its own key), 16
connections contending for one key (hand-offs), 64 connections on many
keys.  Each round runs every target once per load, interleaved (lone,
ack, sent, echo, lone, ...); a ratio is the median of its rounds'
ratios, so the machine's drift between rounds cancels out.

A standby's CPU is read per change it applied: at one connection each
pair is two changes (the grant, the release), each in a frame of its
own, and the echo server's CPU per round trip is what one frame in and
one out costs any Twisted process here.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

from lockservice.bench.echo import startEcho
from lockservice.bench.load import run, say

# (name, scenario, connections): the loads of the table.
LOADS: List[Tuple[str, str, int]] = [
    ("1 connection", "uncontended", 1),
    ("16 contending for one key", "contended", 16),
    ("64 connections, many keys", "uncontended", 64),
]
TARGETS = ("lone", "ack", "sent")
# The targets of the issue this table checks, as (what, ratio key, bound,
# at least?): printed with each figure.
GOALS: List[Tuple[str, str, float, bool]] = [
    ("ack, 1 connection vs lone", "ack/lone 1 connection", 0.45, True),
    ("ack active's CPU per pair vs lone, 1 connection", "ack/lone cpu 1 connection", 2.0, False),
    ("ack, 16 contending vs lone", "ack/lone 16 contending for one key", 0.45, True),
    ("ack, 64 connections vs lone", "ack/lone 64 connections, many keys", 0.9, True),
    ("ack standby CPU per change vs echo CPU per round trip", "standby/echo", 1.3, False),
    ("sent, 1 connection vs lone", "sent/lone 1 connection", 0.85, True),
    ("sent, 16 contending vs lone", "sent/lone 16 contending for one key", 0.85, True),
]


def _activeOf(trio: Any) -> Any:
    from lockservice.testing.harness import activeNodes, waitFor

    return waitFor(lambda: (lambda found: found[0] if len(found) == 1 else None)(
        activeNodes(trio.nodes)), 30, 0.1, what="one active node")


def replication(duration: float = 3.0, rounds: int = 3, warmup: float = 1.0,
                loads: Optional[List[int]] = None,
                out: Callable[[str], None] = print) -> Dict[str, Any]:
    """
    Run the table: every load against a lone node, the active of a
    3-node cluster with C{ack} and one with C{sent}, and the echo server
    at one connection, C{rounds} times interleaved.

    @param loads: the connection counts of the L{LOADS} to run (all by default).
    @return: every run's figures and the medians of the ratios.
    """
    from lockservice.testing.harness import Cluster, Node, freePort

    chosen = [load for load in LOADS if loads is None or load[2] in loads]
    lone = Node(freePort()).start()
    echoPort = freePort()
    echo = startEcho(echoPort)
    clusters = {mode: Cluster(3, args=["--replication", mode]) for mode in ("ack", "sent")}
    runs: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    try:
        for trio in clusters.values():
            trio.start()
        actives = {mode: _activeOf(trio) for mode, trio in clusters.items()}
        standbys = {mode: [n.pid for n in trio.nodes if n is not actives[mode]]
                    for mode, trio in clusters.items()}
        # Every standby synchronised before anything is measured.
        for mode in clusters:
            run(actives[mode].address, "uncontended", 4, 1, 1.0, 0.2, progress=False)
        for r in range(rounds):
            say(f"round {r + 1} of {rounds}")
            for name, scenario, conns in chosen:
                for target in TARGETS:
                    if target == "lone":
                        row = run(lone.address, scenario, conns, 1, duration, warmup,
                                  serverPid=lone.pid, progress=False)
                    else:
                        row = run(actives[target].address, scenario, conns, 1, duration, warmup,
                                  serverPid=actives[target].pid, otherPids=standbys[target],
                                  progress=False)
                    runs.setdefault((name, target), []).append(row)
                if conns == 1:
                    row = run(f"127.0.0.1:{echoPort}", "echo", 1, 1, duration, warmup,
                              serverPid=echo.pid, progress=False)
                    runs.setdefault((name, "echo"), []).append(row)
    finally:
        lone.stop()
        echo.kill()
        echo.wait()
        for trio in clusters.values():
            trio.stop()
    result = summarise(runs, rounds, duration)
    out(formatTable(result))
    return result


def _rate(row: Dict[str, Any]) -> float:
    return float(row.get("pairs_per_s") or row.get("round_trips_per_s") or 0.0)


def summarise(runs: Dict[Tuple[str, str], List[Dict[str, Any]]], rounds: int,
              duration: float) -> Dict[str, Any]:
    """
    The medians of every figure and of every per-round ratio.
    """
    def med(values: List[float]) -> float:
        return round(statistics.median(values), 3) if values else 0.0

    figures: Dict[str, Dict[str, Any]] = {}
    ratios: Dict[str, float] = {}
    for (name, target), rows in runs.items():
        fig = figures.setdefault(name, {}).setdefault(target, {})
        fig["per_s"] = med([_rate(r) for r in rows])
        fig["p50_us"] = med([r["p50_ms"] * 1000 for r in rows])
        fig["p99_us"] = med([r["p99_ms"] * 1000 for r in rows])
        fig["cpu_us_per_pair"] = med([r.get("server_cpu_us_per_pair") or 0.0 for r in rows])
        if rows[0].get("each_standby_cpu_us_per_pair"):
            fig["each_standby_cpu_us_per_pair"] = [
                med([r["each_standby_cpu_us_per_pair"][i] for r in rows])
                for i in range(len(rows[0]["each_standby_cpu_us_per_pair"]))]
    for name, _, conns in LOADS:
        lone = runs.get((name, "lone"))
        if not lone:
            continue
        for target in ("ack", "sent"):
            mine = runs.get((name, target))
            if not mine:
                continue
            ratios[f"{target}/lone {name}"] = med(
                [_rate(a) / (_rate(b) or 1.0) for a, b in zip(mine, lone, strict=True)])
            ratios[f"{target}/lone cpu {name}"] = med(
                [(a.get("server_cpu_us_per_pair") or 0.0)
                 / (b.get("server_cpu_us_per_pair") or 1.0)
                 for a, b in zip(mine, lone, strict=True)])
        echo = runs.get((name, "echo"))
        ack = runs.get((name, "ack"))
        if conns == 1 and echo and ack:
            # Per change: a pair is two changes (grant, release); the worst
            # standby of each round against that round's echo server.
            ratios["standby/echo"] = med(
                [max(a.get("each_standby_cpu_us_per_pair") or [0.0]) / 2
                 / (e.get("server_cpu_us_per_pair") or 1.0)
                 for a, e in zip(ack, echo, strict=True)])
    return {"rounds": rounds, "duration_s": duration, "figures": figures, "ratios": ratios,
            "runs": {f"{name} / {target}": rows for (name, target), rows in runs.items()}}


def formatTable(result: Dict[str, Any]) -> str:
    figures, ratios = result["figures"], result["ratios"]
    lines = [f"replication: medians of {result['rounds']} interleaved rounds of "
             f"{result['duration_s']:g} s (ratios: the median of the rounds' ratios)", "",
             "| | lone | active of 3, ack | ack/lone | active of 3, sent | sent/lone |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]

    def cell(name: str, target: str, field: str) -> str:
        value = figures.get(name, {}).get(target, {}).get(field)
        return "" if value is None else f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"

    for name, _, conns in LOADS:
        if name not in figures:
            continue
        what = "hand-offs/s" if "contending" in name else "pairs/s"
        row = [f"{name}, {what}"]
        for target in TARGETS:
            row.append(cell(name, target, "per_s"))
            if target != "lone":
                row.append(f"{ratios.get(f'{target}/lone {name}', 0):.2f}")
        lines.append("| " + " | ".join(row) + " |")
        row = [f"{name}, acquire p50 / p99 µs"]
        for target in TARGETS:
            row.append(cell(name, target, "p50_us") + " / " + cell(name, target, "p99_us"))
            if target != "lone":
                row.append("")
        lines.append("| " + " | ".join(row) + " |")
        row = [f"{name}, server CPU µs per pair (active)"]
        for target in TARGETS:
            row.append(cell(name, target, "cpu_us_per_pair"))
            if target != "lone":
                row.append(f"{ratios.get(f'{target}/lone cpu {name}', 0):.2f}×")
        lines.append("| " + " | ".join(row) + " |")
        row = [f"{name}, each standby's CPU µs per pair"
               + (" (per change)" if conns == 1 else ""), "—"]
        for target in ("ack", "sent"):
            each = figures.get(name, {}).get(target, {}).get("each_standby_cpu_us_per_pair")
            text = ", ".join(f"{v:.1f}" for v in each or [])
            if conns == 1 and each:
                text += " (" + ", ".join(f"{v / 2:.1f}" for v in each) + ")"
            row += [text, ""]
        lines.append("| " + " | ".join(row) + " |")
        if conns == 1 and "echo" in figures.get(name, {}):
            echo = figures[name]["echo"]
            lines.append(f"| echo server, 1 connection: round trips/s, CPU µs per round trip "
                         f"| {echo['per_s']:,.0f} | {echo['cpu_us_per_pair']:.1f} | | | |")
    lines.append("")
    lines.append("targets:")
    for what, key, bound, atLeast in GOALS:
        if key not in ratios:
            continue
        value = ratios[key]
        met = value >= bound if atLeast else value <= bound
        lines.append(f"  {what}: {value:.2f} ({'>=' if atLeast else '<='} {bound:g}) "
                     f"{'met' if met else 'NOT met'}")
    return "\n".join(lines)
