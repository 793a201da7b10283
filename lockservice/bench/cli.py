"""
C{python -m lockservice.bench} and C{lockservice bench}: the commands.
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional

from lockservice.bench.clients import compare, formatComparison, pythonBench
from lockservice.bench.counting import instructions
from lockservice.bench.echo import echoServer
from lockservice.bench.load import SCENARIOS, run
from lockservice.bench.replication import replication
from lockservice.bench.scenarios import httpStall, memory, observers, shards, sync
from lockservice.bench.suite import formatTable, ratios, suite


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="lockservice bench",
                                description="Load generator and benchmark suite.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="drive one server with one scenario")
    r.add_argument("--addr", default="127.0.0.1:7700",
                   help="host:port; several clusters (shards): active addresses joined by ';'")
    r.add_argument("--scenario", choices=SCENARIOS, default="uncontended")
    r.add_argument("-c", "--connections", type=int, default=16)
    r.add_argument("--depth", type=int, default=1, help="1 = closed loop; D = pipelined")
    r.add_argument("--duration", type=float, default=5.0)
    r.add_argument("--warmup", type=float, default=1.0)
    r.add_argument("--procs", type=int, default=None, help="load generator processes")
    r.add_argument("--server-pid", type=int, default=None, help="report this pid's CPU use")
    r.add_argument("--json", action="store_true")
    s = sub.add_parser("suite", help="start a node and an echo server; print the table")
    s.add_argument("--duration", type=float, default=5.0)
    s.add_argument("--connections", default="1,16,64")
    s.add_argument("--depth", type=int, default=16)
    s.add_argument("--json", action="store_true")
    s.add_argument("--no-cluster", action="store_true",
                   help="skip the active-of-3-nodes rows")
    s.add_argument("--rounds", type=int, default=3,
                   help="interleaved runs behind each ratio (0: no ratios)")
    e = sub.add_parser("echo-server", help="the baseline: a trivial Twisted line echo server")
    e.add_argument("--port", type=int, required=True)
    m = sub.add_parser("memory", help="RSS with many held keys and many idle connections")
    m.add_argument("--keys", type=int, default=1_000_000)
    m.add_argument("--idle", type=int, default=10_000)
    h = sub.add_parser("shards", help="aggregate pairs/s over several single-node clusters")
    h.add_argument("--counts", default="1,2", help="numbers of shards to compare")
    h.add_argument("-c", "--connections", type=int, default=16)
    h.add_argument("--duration", type=float, default=5.0)
    y = sub.add_parser("sync", help="a standby joining an active that holds many keys")
    y.add_argument("--keys", type=int, default=1_000_000)
    y.add_argument("--peer-timeout", type=float, default=1.0)
    w = sub.add_parser("http", help="lock-port stalls under heavy HTTP pages")
    w.add_argument("--concurrency", default="16,64,128")
    w.add_argument("--runs", type=int, default=3)
    w.add_argument("--seconds", type=float, default=4.0)
    w.add_argument("--non-readers", type=int, default=3000)
    o = sub.add_parser("observers", help="the lock port while 10,000 observers of a key wake")
    o.add_argument("--count", type=int, default=10_000)
    o.add_argument("--rounds", type=int, default=3)
    i = sub.add_parser("instructions",
                       help="the monitor's share, in instructions per pair (valgrind)")
    i.add_argument("--pairs", type=int, default=20_000)
    i.add_argument("-c", "--connections", type=int, default=64)
    cl = sub.add_parser("clients", help="the Python, Go and TypeScript clients side by side "
                                         "against one lone node")
    cl.add_argument("--concurrency", default="1,16", help="lockers, each on its own key")
    cl.add_argument("--duration", type=float, default=3.0)
    cl.add_argument("--rounds", type=int, default=3)
    cl.add_argument("--clients", default="python,go,js")
    cl.add_argument("--json", action="store_true")
    cp = sub.add_parser("client-python", help="the Python asyncio client's own bench "
                                              "(one JSON line)")
    cp.add_argument("--addr", required=True)
    cp.add_argument("--concurrency", type=int, default=1)
    cp.add_argument("--duration", type=float, default=3.0)
    rp = sub.add_parser("replication", help="a lone node vs the active of 3 nodes with "
                                             "--replication ack and sent; CPU of every node "
                                             "and the echo baseline (interleaved rounds)")
    rp.add_argument("--duration", type=float, default=3.0)
    rp.add_argument("--warmup", type=float, default=1.0)
    rp.add_argument("--rounds", type=int, default=3)
    rp.add_argument("--loads", default=None,
                    help="connection counts of the loads to run: 1,16,64 (the default)")
    rp.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "clients":
        found = compare([int(c) for c in args.concurrency.split(",")], args.duration,
                        args.rounds, args.clients.split(","))
        print(json.dumps(found, indent=2) if args.json else formatComparison(found))
        return 0
    if args.cmd == "client-python":
        print(json.dumps(pythonBench(args.addr, args.concurrency, args.duration)))
        return 0
    if args.cmd == "replication":
        found = replication(args.duration, args.rounds, args.warmup,
                            [int(n) for n in args.loads.split(",")] if args.loads else None,
                            out=(lambda line: None) if args.json else print)
        if args.json:
            print(json.dumps(found, indent=2))
        return 0
    if args.cmd == "observers":
        print(json.dumps(observers(args.count, args.rounds), indent=2))
        return 0
    if args.cmd == "instructions":
        print(json.dumps(instructions(args.pairs, args.connections), indent=2))
        return 0
    if args.cmd == "http":
        print(json.dumps(httpStall([int(c) for c in args.concurrency.split(",")], args.runs,
                                   args.seconds, args.non_readers), indent=2))
        return 0
    if args.cmd == "shards":
        table = shards([int(c) for c in args.counts.split(",")], args.connections,
                       args.duration)
        print(json.dumps(table, indent=2))
        return 0
    if args.cmd == "sync":
        print(json.dumps(sync(args.keys, args.peer_timeout), indent=2))
        return 0
    if args.cmd == "echo-server":
        echoServer(args.port)
        return 0
    if args.cmd == "run":
        result = run(args.addr, args.scenario, args.connections, args.depth, args.duration,
                     args.warmup, args.procs, args.server_pid, progress=not args.json)
        if args.json:
            print(json.dumps(result))
        else:
            for k, v in result.items():
                print(f"{k:20} {v}")
        return 0 if result["errors"] == 0 else 1
    if args.cmd == "suite":
        rows = suite(args.duration, [int(c) for c in args.connections.split(",")], args.depth,
                     cluster=not args.no_cluster)
        print(json.dumps(rows, indent=2) if args.json else formatTable(rows))
        if args.rounds > 0:
            found = ratios(args.duration, args.rounds,
                           out=(lambda line: None) if args.json else print,
                           cluster=not args.no_cluster)
            if args.json:
                print(json.dumps(found, indent=2))
        return 0
    print(json.dumps(memory(args.keys, args.idle), indent=2))
    return 0
