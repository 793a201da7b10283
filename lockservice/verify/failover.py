"""
Measure the cluster's timing targets with real processes and signals:

    python -m lockservice.failover --trials 10 [--nodes 3] [--json]

First, the time a grant takes to reach a standby (20 samples).  Then, for
each trial: the failover gap after C{kill -9} of the active (signal to
the first grant on the successor), the rejoin time of the restarted node
(start to it being active again, state intact), the handoff gap after
SIGINT of the active (signal to the first grant on the successor), the
failover gap when the active is paused with SIGSTOP (no connection closes:
the peer timeout must notice), and the time from SIGCONT until the
lower-priority node has stepped down again.

Then, with root (each node in its own network namespace, see
L{lockservice.testing.netns}), two network trials per round: a partition
(the active's peer links dropped for C{--partition} seconds while clients
still reach it: the time from the heal until one active remains, holding
both sides' locks), and 0.5 s of TCP resets on the active's peer links
with both processes alive (promotions counted: there must be none).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
import urllib.request
from typing import Dict, List

from lockservice.testing import netns
from lockservice.testing.harness import (
    Cluster,
    LineClient,
    Node,
    firstGrant,
    freePort,
    probeRole,
    waitFor,
)


def summary(values: List[float]) -> Dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "n": len(values),
    }


def replicationLatency(active: Node, standbyHttp: int, samples: int = 20) -> List[float]:
    """
    Grant a key on the active; poll the standby's /locks until it shows it.
    An upper bound: it includes one HTTP poll (about a millisecond).
    """
    latencies = []
    for i in range(samples):
        key = f"replication/{i}"
        with LineClient(active.port) as c:
            c.ask(b"A " + key.encode() + b" 30 0")
            granted = time.monotonic()
            url = f"http://127.0.0.1:{standbyHttp}/locks?key={key}"
            while True:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if json.loads(r.read()).get("held"):
                        break
                if time.monotonic() - granted > 5:
                    raise TimeoutError("grant never reached the standby")
            latencies.append(time.monotonic() - granted)
    return latencies


def run(trials: int, nodes: int, log=print) -> Dict[str, Dict[str, float]]:  # type: ignore[no-untyped-def]
    import shutil
    import tempfile

    logDir = tempfile.mkdtemp(prefix="lockservice-failover-")
    cluster = Cluster(nodes, logDir=logDir)
    httpPorts = [freePort() for _ in cluster.nodes]
    for node, port in zip(cluster.nodes, httpPorts, strict=True):
        node.args = ["--http", f"tcp:{port}:interface=127.0.0.1"]
    cluster.start()
    first, second = cluster.nodes[0], cluster.nodes[1]
    failover: List[float] = []
    rejoin: List[float] = []
    handoff: List[float] = []
    paused: List[float] = []
    healed: List[float] = []
    try:
        waitFor(lambda: probeRole(first.port) == "active", 15, what="node0 active")
        replication = replicationLatency(first, httpPorts[1])
        for trial in range(trials):
            with LineClient(first.port) as c:
                held = c.ask(b"A held/%d 60 1" % trial)
            assert held.startswith(b"A "), held
            time.sleep(0.05)
            killed = time.monotonic()
            first.kill()
            failover.append(firstGrant([second], killed, b"gap/%d" % trial))
            restarted = time.monotonic()
            first.start(wait=False)
            waitFor(lambda: probeRole(first.port, timeout=1) == "active", 20, interval=0.01,
                    what="node0 active again")
            rejoin.append(time.monotonic() - restarted)
            with LineClient(first.port) as c:
                kept = c.ask(b"R held/%d %s" % (trial, held.split()[2]))
            assert kept.endswith(b" OK"), f"held lock lost across rejoin: {kept!r}"

            interrupted = time.monotonic()
            first.signal(signal.SIGINT)
            handoff.append(firstGrant([second], interrupted, b"handoff/%d" % trial))
            assert first.process is not None
            first.process.wait(15)
            first.start(wait=False)
            waitFor(lambda: probeRole(first.port, timeout=1) == "active", 20, interval=0.01,
                    what="node0 active again")

            stopped = time.monotonic()
            first.signal(signal.SIGSTOP)
            try:
                paused.append(firstGrant([second], stopped, b"paused/%d" % trial))
            finally:
                first.signal(signal.SIGCONT)
            resumed = time.monotonic()
            waitFor(lambda: probeRole(second.port, timeout=1) == "M " + first.address, 20,
                    interval=0.01, what="node1 steps down")
            healed.append(time.monotonic() - resumed)
            waitFor(lambda: probeRole(first.port, timeout=1) == "active", 20, interval=0.01,
                    what="node0 active after split brain")
            log(f"trial {trial + 1}/{trials}: failover {failover[-1] * 1000:.0f} ms, "
                f"rejoin {rejoin[-1] * 1000:.0f} ms, handoff {handoff[-1] * 1000:.0f} ms, "
                f"SIGSTOP failover {paused[-1] * 1000:.0f} ms, "
                f"split brain healed {healed[-1] * 1000:.0f} ms")
    finally:
        cluster.stop()
    shutil.rmtree(logDir, ignore_errors=True)
    return {
        "replication": summary(replication),
        "failover_kill9": summary(failover),
        "rejoin": summary(rejoin),
        "handoff_sigint": summary(handoff),
        "failover_sigstop": summary(paused),
        "split_brain_healed": summary(healed),
    }


def networkTrials(trials: int, partition: float, log=print) -> Dict[str, Dict[str, float]]:  # type: ignore[no-untyped-def]
    """
    Partition and reset trials between nodes in network namespaces.
    """
    import tempfile

    healed: List[float] = []
    promotions: List[float] = []
    logDir = tempfile.mkdtemp(prefix="lockservice-failover-")
    with netns.Lab(3) as lab:
        cluster = netns.LabCluster(lab, logDir).start()
        nodes = cluster.nodes

        def role(n: Node) -> object:
            return probeRole(n.port, timeout=1, host=n.host)

        def onlyFirst() -> bool:
            return [i for i, n in enumerate(nodes) if role(n) == "active"] == [0]

        try:
            for trial in range(trials):
                waitFor(onlyFirst, 20, what="node0 the only active")
                with LineClient(nodes[0].port, host=nodes[0].host) as c:
                    held = c.ask(b"A kept/%d 120 5" % trial)
                lab.cutPeers(0)
                try:
                    waitFor(lambda: role(nodes[1]) == "active", 10, what="node1 promoted")
                    time.sleep(partition)  # the partition's length is the point
                finally:
                    lab.heal()
                start = time.monotonic()
                waitFor(onlyFirst, 10, interval=0.01, what="one active after the heal")
                healed.append(time.monotonic() - start)
                with LineClient(nodes[0].port, host=nodes[0].host) as c:
                    kept = c.ask(b"R kept/%d %s" % (trial, held.split()[2]))
                assert kept.endswith(b" OK"), f"lock lost across the partition: {kept!r}"

                before = sum(n.tail(100000).count("promoted to active") for n in nodes[1:])
                lab.cutPeers(0, target="RESET", bothEnds=True)
                time.sleep(0.5)
                lab.heal()
                time.sleep(2.0)  # well past --peer-timeout
                after = sum(n.tail(100000).count("promoted to active") for n in nodes[1:])
                promotions.append(after - before)
                log(f"network trial {trial + 1}/{trials}: one active "
                    f"{healed[-1] * 1000:.0f} ms after a {partition:g} s partition healed; "
                    f"0.5 s of resets: {after - before} promotions")
        finally:
            cluster.stop()
    import shutil

    shutil.rmtree(logDir, ignore_errors=True)
    return {
        "partition_healed": summary(healed),
        "reset_promotions": {"total": sum(promotions), "n": len(promotions)},
    }


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--partition", type=float, default=5.0,
                        help="seconds each partition trial lasts (default 5)")
    parser.add_argument("--no-network", action="store_true",
                        help="skip the partition and reset trials")
    args = parser.parse_args(argv)
    log = (lambda *a: None) if args.json else print
    results: Dict[str, Dict[str, float]] = run(args.trials, args.nodes, log=log)
    why = "--no-network" if args.no_network else netns.unavailable()
    if why is None:
        results.update(networkTrials(args.trials, args.partition, log=log))
    else:
        log(f"partition and reset trials skipped: {why}")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, s in results.items():
            if "p50_ms" in s:
                print(f"{name:18} p50 {s['p50_ms']:8.1f} ms   max {s['max_ms']:8.1f} ms"
                      f"   (n={s['n']})")
            else:
                print(f"{name:18} {s['total']:g} in {s['n']:g} trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
