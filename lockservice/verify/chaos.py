"""
The chaos suite: a real 3-node cluster under load while faults are
injected on a seeded schedule, with checkers over the recorded history.

    python -m lockservice.chaos --duration SECONDS --seed N [--workers 8] [--json]

Exit status 0 only when every checker reports 0.

Workers (the project's own client, connected through fault-injecting TCP
proxies) loop: acquire one of a few shared keys -> critical section (two
writes to an in-harness fenced resource, with the grant's token) ->
release.

Process faults: kill -9 of the active (and restart), SIGSTOP/SIGCONT of
the active (split brain), SIGINT of the active (graceful handoff, and
restart), kill -9 of client processes (one holding a lock, one queued
behind it), client connections cut or stalled through the proxies.

Network faults (root only: each node then runs in its own network
namespace on a bridge, see L{lockservice.testing.netns}): the active's
peer links cut while clients still reach it, the active cut off from its
clients, an asymmetric cut (the active hears no peer but they hear it),
and 0.5 s of TCP resets on the active's peer links (must promote nobody).
Without root these are skipped with one line, and the rest runs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from typing import Any, Dict, List, Optional

from twisted.internet.defer import Deferred, gatherResults

from lockservice.client.api import LockTimeout, ReleaseFailed, connect
from lockservice.verify.failover import summary
from lockservice.verify.faults import Faults
from lockservice.verify.history import (
    AcquireRecord,
    FencedResource,
    History,
    Section,
    checkAbandoned,
    checkAbandonedWaiters,
    checkAcquires,
    checkFence,
    checkOverlaps,
    checkTokens,
    now,
)
from lockservice.verify.rig import Rig

LEASE = 3.0
WAIT = 4.0
KEYS = ["res/0", "res/1", "res/2"]


class Chaos:
    """
    One run: the workers' load on the rig while the faults are injected,
    then the report of the checkers.
    """

    def __init__(self, reactor: Any, duration: float, seed: int, workers: int,
                 log: Any = print) -> None:
        self.duration = duration
        self.seed = seed
        self.workerCount = workers
        self.log = log
        self.history = History()
        self.resource = FencedResource(self.history)
        self.stopping = False
        self.rig = Rig(reactor, workers, self.history, log)
        self.faults = Faults(self.rig, self.history, random.Random(seed), log)

    # -- load ------------------------------------------------------------------

    async def work(self, index: int) -> None:
        client = self.rig.workers[index]
        rng = random.Random(self.seed * 1000 + index)
        name = f"w{index}"
        while not self.stopping:
            key = rng.choice(KEYS)
            record = AcquireRecord(name, key, WAIT, now())
            self.history.acquires.append(record)
            try:
                lock = await client.acquire(key, LEASE, WAIT)
            except LockTimeout:
                record.outcome, record.end = "timeout", now()
                continue
            except Exception:
                record.outcome, record.end = "error", now()
                await self.rig.sleep(0.1)
                continue
            record.outcome, record.end, record.token = "granted", now(), lock.token
            enter = now()
            self.resource.write(key, lock.token)
            await self.rig.sleep(rng.uniform(0.005, 0.04))
            self.resource.write(key, lock.token)
            self.history.sections.append(Section(name, key, lock.token, enter, now()))
            try:
                if not await client.release(lock):
                    self.history.staleReleases += 1
            except ReleaseFailed:
                self.history.failedReleases += 1

    # -- the whole run ---------------------------------------------------------

    async def run(self) -> Dict[str, Any]:
        started = now()
        try:
            await self.rig.setUp()
            self.log(f"cluster up in {now() - started:.1f} s; {self.workerCount} workers; "
                     f"seed {self.seed}; logs in {self.rig.logDir}")
            if self.rig.netSkipped is not None:
                self.log(f"network faults skipped: {self.rig.netSkipped}")
            else:
                self.log("network faults on: each node in its own network namespace")
            workers = [Deferred.fromCoroutine(self.work(i)) for i in range(self.workerCount)]
            end = now() + self.duration
            await self.faults.run(until=end - 6)
            while now() < end:
                await self.rig.sleep(0.2)
            self.stopping = True
            await gatherResults(workers, consumeErrors=True)
        finally:
            await self.rig.tearDown()
        return self.report()

    def report(self) -> Dict[str, Any]:
        h = self.history
        overlapping, outside = checkOverlaps(h)
        lost, late = checkAcquires(h)
        checkers = {
            "fence_violations": checkFence(h),
            "token_order_violations": checkTokens(h),
            "overlaps_outside_fault_windows": outside,
            "acquires_lost": lost,
            "acquires_late": late,
            "abandoned_locks_regranted_late": checkAbandoned(h),
            "dead_waiters_not_withdrawn": checkAbandonedWaiters(h),
            "promotions_after_link_resets": h.resetPromotions,
            "handoff_locks_lost": h.handoffLost,
            "answered_releases_undone": h.releasesUndone,
        }
        faults: Dict[str, int] = {}
        for f in h.faults:
            faults[f.kind] = faults.get(f.kind, 0) + 1
        gaps = {kind: summary(v) for kind, v in h.gaps.items()}
        outcomes: Dict[str, int] = {}
        for a in h.acquires:
            outcomes[a.outcome or "pending"] = outcomes.get(a.outcome or "pending", 0) + 1
        return {
            "duration_s": self.duration,
            "seed": self.seed,
            "grants": outcomes.get("granted", 0),
            "acquire_outcomes": outcomes,
            "critical_sections": len(h.sections),
            "fenced_accesses": len(h.accesses),
            "fenced_rejections": sum(1 for a in h.accesses if not a.accepted),
            "overlapping_sections_in_fault_windows": overlapping - outside,
            "stale_releases": h.staleReleases,
            "failed_releases": h.failedReleases,
            "handoff_checks": h.handoffChecks,
            "faults": faults,
            "failover_gaps": gaps,
            "checkers": checkers,
            "network_faults": self.rig.netSkipped is None,
            "logs": self.rig.logDir,
            "ok": all(v == 0 for v in checkers.values()),
        }


def formatReport(r: Dict[str, Any]) -> str:
    lines = [
        f"chaos run: {r['duration_s']:g} s, seed {r['seed']}",
        f"grants {r['grants']}  acquire outcomes {r['acquire_outcomes']}",
        f"critical sections {r['critical_sections']}  fenced accesses {r['fenced_accesses']} "
        f"(rejected by the fence: {r['fenced_rejections']})",
        f"overlapping critical sections inside fault windows: "
        f"{r['overlapping_sections_in_fault_windows']}",
        f"releases answered STALE {r['stale_releases']}, not delivered {r['failed_releases']}",
        "faults: " + ", ".join(f"{k} x{v}" for k, v in sorted(r["faults"].items())),
    ]
    for kind, g in sorted(r["failover_gaps"].items()):
        lines.append(f"gap after {kind:15} p50 {g['p50_ms']:8.1f} ms  max {g['max_ms']:8.1f} ms"
                     f"  (n={g['n']})")
    lines.append("checkers (all must be 0):")
    for name, value in r["checkers"].items():
        lines.append(f"  {name:34} {value}")
    lines.append("RESULT: " + ("PASS" if r["ok"] else "FAIL"))
    return "\n".join(lines)


# -- the victim process (kill -9 of a client holding a lock) ---------------------------


def victim(addrs: str, key: str, lease: float) -> None:
    from twisted.internet.task import react

    async def hold(reactor: Any) -> None:
        client = connect(reactor, addrs)
        await client.whenConnected(20)
        print("CONNECTED", flush=True)
        lock = await client.acquire(key, lease, 60)
        print(f"GRANTED {lock.token}", flush=True)
        await Deferred()  # hold until killed

    react(lambda reactor: Deferred.fromCoroutine(hold(reactor)))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["victim"]:
        v = argparse.ArgumentParser()
        v.add_argument("--addrs", required=True)
        v.add_argument("--key", required=True)
        v.add_argument("--lease", type=float, required=True)
        a = v.parse_args(argv[1:])
        victim(a.addrs, a.key, a.lease)
        return 0
    p = argparse.ArgumentParser(prog="python -m lockservice.chaos",
                                description="fault injection against a real 3-node cluster")
    p.add_argument("--duration", type=float, required=True, help="seconds of load and faults")
    p.add_argument("--seed", type=int, required=True, help="seed of the fault schedule")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.duration < 20:
        p.error("--duration must be at least 20 seconds")
    from twisted.internet.task import react

    result: Dict[str, Any] = {}

    async def body(reactor: Any) -> None:
        chaos = Chaos(reactor, args.duration, args.seed, args.workers,
                      log=(lambda *a: None) if args.json else print)
        result.update(await chaos.run())


    try:
        react(lambda reactor: Deferred.fromCoroutine(body(reactor)))
    except SystemExit as e:
        if e.code not in (0, None):
            return int(e.code) if isinstance(e.code, int) else 1
    if not result:
        return 1
    print(json.dumps(result, indent=2) if args.json else formatReport(result))
    if result["ok"]:
        # Keep the nodes' logs only when they explain a failure.
        shutil.rmtree(result["logs"], ignore_errors=True)
    elif not args.json:
        print(f"logs kept in {result['logs']}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

