"""
Work counted rather than timed: a node's user-space instructions per
pair under callgrind (the same count whatever else the machine does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict

from lockservice.bench.load import fixedPairs


def _instructionsOf(pairs: int, detach: bool, conns: int) -> int:
    """
    The user-space instructions (callgrind) of a whole node process that
    starts, serves C{pairs} pairs and stops.
    """
    import tempfile

    from lockservice.testing.harness import freePort, ping, twistdEnvironment

    port = freePort()
    env = dict(twistdEnvironment(), LOCKSERVICE_BENCH_DETACH_MONITOR="1" if detach else "0")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             twistd, "-n", "--pidfile=", "lockservice",
             "--listen", f"tcp:{port}:interface=127.0.0.1"],
            env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while not ping(port, 1.0):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the node under valgrind did not start")
                time.sleep(0.5)
            if pairs:
                fixedPairs("127.0.0.1", port, conns, pairs)
        finally:
            proc.terminate()
            proc.wait(600)
        with open(out) as f:
            for line in f:
                if line.startswith("summary:"):
                    return int(line.split()[1])
    raise RuntimeError("callgrind wrote no summary")


def instructions(pairs: int = 20_000, conns: int = 64) -> Dict[str, Any]:
    """
    What the operator's view costs on a running node, counted rather than
    timed: the node's user-space instructions per uncontended pair
    (callgrind; the same count whatever else the machine does), with the
    monitor attached and detached.  Each is a node serving C{pairs} pairs
    less a node that only starts and stops.  Kernel time (the sockets'
    system calls) is not counted, so the share of all server CPU is lower
    than the share printed.
    """
    from concurrent.futures import ThreadPoolExecutor

    runs = [(0, False), (pairs, False), (0, True), (pairs, True)]
    with ThreadPoolExecutor(2) as pool:  # two nodes at a time: one per core
        counts = list(pool.map(lambda run: _instructionsOf(run[0], run[1], conns), runs))
    on = (counts[1] - counts[0]) / pairs
    off = (counts[3] - counts[2]) / pairs
    return {
        "pairs": pairs, "connections": conns,
        "instructions_per_pair_monitor_on": round(on),
        "instructions_per_pair_monitor_detached": round(off),
        "monitor_share_of_user_instructions": round((on - off) / on, 4),
    }
