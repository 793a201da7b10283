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
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from lockservice.client.api import LockClient, LockTimeout, ReleaseFailed, connect
from lockservice.client.fencing import FenceGuard, StaleToken
from lockservice.tcp import clientEndpoint
from lockservice.testing import netns
from lockservice.testing.harness import Cluster, activeNodes, firstGrant, twistdEnvironment
from lockservice.testing.proxy import FaultProxy
from lockservice.verify.failover import summary

LEASE = 3.0
WAIT = 4.0
KEYS = ["res/0", "res/1", "res/2"]
SENTINELS = ["sentinel/0", "sentinel/1", "sentinel/2"]
FAULT_KINDS = ["kill9-active", "sigstop-active", "sigint-active", "kill9-client",
               "proxy-cut", "proxy-stall"]
NET_FAULT_KINDS = ["peer-cut", "client-cut", "asym-cut", "peer-reset"]
now = time.monotonic


@dataclass
class AcquireRecord:
    worker: str
    key: str
    wait: float
    start: float
    end: Optional[float] = None
    outcome: Optional[str] = None  # granted, timeout, error
    token: Optional[int] = None


@dataclass
class Section:
    worker: str
    key: str
    token: int
    enter: float
    exit: float


@dataclass
class Access:
    key: str
    token: int
    at: float
    accepted: bool


@dataclass
class Fault:
    kind: str
    start: float
    windowEnd: Optional[float] = None  # None: not a window where overlap is allowed
    detail: str = ""


@dataclass
class History:
    acquires: List[AcquireRecord] = field(default_factory=list)
    sections: List[Section] = field(default_factory=list)
    accesses: List[Access] = field(default_factory=list)
    faults: List[Fault] = field(default_factory=list)
    gaps: Dict[str, List[float]] = field(default_factory=dict)
    abandoned: List[Tuple[float, float, Optional[float]]] = field(default_factory=list)
    abandonedWaiters: List[Tuple[float, Optional[float]]] = field(default_factory=list)
    resetPromotions: int = 0
    handoffChecks: int = 0
    handoffLost: int = 0
    staleReleases: int = 0
    failedReleases: int = 0


class FencedResource:
    """
    The protected resource: every access carries the token; the fence
    refuses a token lower than one already accepted.  Every access is
    recorded, accepted or not.
    """

    def __init__(self, history: History) -> None:
        self.guard = FenceGuard()
        self.history = history

    def write(self, key: str, token: int) -> bool:
        try:
            self.guard.admit(key, token)
            accepted = True
        except StaleToken:
            accepted = False
        self.history.accesses.append(Access(key, token, now(), accepted))
        return accepted


# -- checkers ------------------------------------------------------------------------


def checkFence(h: History) -> int:
    """
    What the resource actually accepted, judged on its own record (not on
    the guard's logic): per key, an accepted token lower than one accepted
    before is a violation, and so are two grants whose accepted accesses
    interleave (an overlap of accepted critical sections: A, B, A).
    """
    violations = 0
    byKey: Dict[str, List[Access]] = {}
    for access in sorted(h.accesses, key=lambda a: a.at):
        if access.accepted:
            byKey.setdefault(access.key, []).append(access)
    for accepted in byKey.values():
        highest = -1
        spans: Dict[int, List[float]] = {}
        for access in accepted:
            if access.token < highest:
                violations += 1
            highest = max(highest, access.token)
            span = spans.setdefault(access.token, [access.at, access.at])
            span[1] = access.at
        ordered = sorted(spans.values())
        for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False):
            if start < end:
                violations += 1
    return violations


def checkTokens(h: History) -> int:
    """
    No token is issued twice, and a grant requested after another grant was
    acknowledged carries a higher token (across failovers and split brains).
    """
    grants = [a for a in h.acquires if a.outcome == "granted"]
    violations = len(grants) - len({a.token for a in grants})
    byAck = sorted(grants, key=lambda a: a.end or 0.0)
    byStart = sorted(grants, key=lambda a: a.start)
    highest = -1
    i = 0
    for g in byStart:
        while i < len(byAck) and (byAck[i].end or 0.0) < g.start:
            highest = max(highest, byAck[i].token or 0)
            i += 1
        if (g.token or 0) <= highest:
            violations += 1
    return violations


def overlaps(h: History) -> List[Tuple[Section, Section]]:
    pairs = []
    byKey: Dict[str, List[Section]] = {}
    for s in h.sections:
        byKey.setdefault(s.key, []).append(s)
    for sections in byKey.values():
        sections.sort(key=lambda s: s.enter)
        for i, a in enumerate(sections):
            for b in sections[i + 1:]:
                if b.enter >= a.exit:
                    break
                pairs.append((a, b))
    return pairs


def checkOverlaps(h: History) -> Tuple[int, int]:
    """
    @return: (overlapping critical sections, of which outside any fault window)
    """
    windows = [(f.start, f.windowEnd) for f in h.faults if f.windowEnd is not None]
    found = overlaps(h)
    outside = 0
    for a, b in found:
        start, end = max(a.enter, b.enter), min(a.exit, b.exit)
        if not any(ws <= start and end <= we for ws, we in windows):
            outside += 1
    return len(found), outside


def checkAcquires(h: History) -> Tuple[int, int]:
    """
    @return: (acquires that never ended, acquires that ended later than wait + 1 s)
    """
    lost = sum(1 for a in h.acquires if a.outcome is None)
    late = sum(1 for a in h.acquires
               if a.end is not None and a.wait > 0 and a.end - a.start > a.wait + 1.0)
    return lost, late


def checkAbandoned(h: History) -> int:
    """
    A lock whose holder was killed is granted again within lease + 10%.
    """
    return sum(1 for grantedAt, lease, regranted in h.abandoned
               if regranted is None or regranted - grantedAt > lease * 1.1)


def checkAbandonedWaiters(h: History) -> int:
    """
    A waiter killed while queued is withdrawn: when the key is released,
    the next acquire gets it within a second (not after the dead waiter's
    lease).
    """
    return sum(1 for releasedAt, regranted in h.abandonedWaiters
               if regranted is None or regranted - releasedAt > 1.0)


# -- the run ---------------------------------------------------------------------------


class _Victim(ProcessProtocol):
    def __init__(self) -> None:
        self.ready: Deferred[float] = Deferred()
        self.granted: Deferred[float] = Deferred()
        self.buffer = b""

    def outReceived(self, data: bytes) -> None:
        self.buffer += data
        if b"CONNECTED" in self.buffer and not self.ready.called:
            self.ready.callback(now())
        if b"GRANTED" in self.buffer and not self.granted.called:
            self.granted.callback(now())

    def processEnded(self, reason: Any) -> None:
        for d in (self.ready, self.granted):
            if not d.called:
                d.errback(RuntimeError("victim exited early"))
                d.addErrback(lambda _: None)  # not awaited: do not log it


class Chaos:
    def __init__(self, reactor: Any, duration: float, seed: int, workers: int,
                 log: Any = print) -> None:
        self.reactor = reactor
        self.duration = duration
        self.rng = random.Random(seed)
        self.seed = seed
        self.workerCount = workers
        self.log = log
        self.history = History()
        self.resource = FencedResource(self.history)
        self.stopping = False
        self.sentinels: Dict[str, Any] = {}
        self.victims: List[Any] = []
        self.logDir = tempfile.mkdtemp(prefix="lockservice-chaos-")
        why = netns.unavailable()
        self.lab: Optional[netns.Lab] = None
        self.netSkipped = why
        if why is None:
            self.lab = netns.Lab(3)

    def sleep(self, seconds: float) -> "Deferred[None]":
        return deferLater(self.reactor, seconds, lambda: None)

    # -- set-up --------------------------------------------------------------

    async def setUp(self) -> None:
        self.cluster: Any
        if self.lab is not None:
            await deferToThread(self.lab.open)
            self.cluster = netns.LabCluster(self.lab, self.logDir)
        else:
            self.cluster = Cluster(3, logDir=self.logDir)
        await deferToThread(self.cluster.start)
        self.proxies: Dict[str, FaultProxy] = {}
        for node in self.cluster.nodes:
            proxy = FaultProxy(self.reactor, node.host, node.port)
            await proxy.start()
            self.proxies[node.address] = proxy
        await self.settled(20)

        def throughProxy(address: Any) -> Any:
            # Redirects name nodes; keep every worker link on a proxy.
            if isinstance(address, str) and address in self.proxies:
                address = self.proxies[address].address
            host, _, port = address.rpartition(":")
            return clientEndpoint(self.reactor, host, int(port), timeout=2)

        self.workers: List[LockClient] = [
            connect(self.reactor, list(self.proxies), endpointFor=throughProxy)
            for _ in range(self.workerCount)
        ]
        self.probe = connect(self.reactor, self.cluster.addresses())
        for client in self.workers + [self.probe]:
            await client.whenConnected(20)
        await self.refreshSentinels(checkLost=False)

    async def tearDown(self) -> None:
        for client in getattr(self, "workers", []) + [getattr(self, "probe", None)]:
            if client is not None:
                await client.close()
        for proxy in getattr(self, "proxies", {}).values():
            await proxy.stop()
        for victim in self.victims:
            try:
                victim.signalProcess("KILL")
            except Exception:
                pass
        if hasattr(self, "cluster"):
            await deferToThread(self.cluster.stop)
        if self.lab is not None:
            await deferToThread(self.lab.close)

    async def settled(self, timeout: float) -> None:
        """
        Wait until every node runs and exactly one is active.
        """
        deadline = now() + timeout
        while now() < deadline:
            if all(n.alive() for n in self.cluster.nodes):
                active = await deferToThread(activeNodes, self.cluster.nodes)
                if len(active) == 1:
                    return
            await self.sleep(0.1)
        raise RuntimeError("cluster did not settle to one active node")

    async def activeNode(self) -> Any:
        for _ in range(100):
            active = await deferToThread(activeNodes, self.cluster.nodes)
            if active:
                return active[0]
            await self.sleep(0.1)
        raise RuntimeError("no active node")

    # -- load ------------------------------------------------------------------

    async def work(self, index: int) -> None:
        client = self.workers[index]
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
                await self.sleep(0.1)
                continue
            record.outcome, record.end, record.token = "granted", now(), lock.token
            enter = now()
            self.resource.write(key, lock.token)
            await self.sleep(rng.uniform(0.005, 0.04))
            self.resource.write(key, lock.token)
            self.history.sections.append(Section(name, key, lock.token, enter, now()))
            try:
                if not await client.release(lock):
                    self.history.staleReleases += 1
            except ReleaseFailed:
                self.history.failedReleases += 1

    async def timedGrant(self, key: str, wait: float = 15.0) -> float:
        """
        Acquire and release C{key} through the probe client; the time of the grant.
        """
        record = AcquireRecord("probe", key, wait, now())
        self.history.acquires.append(record)
        try:
            lock = await self.probe.acquire(key, 1, wait)
        except LockTimeout:
            record.outcome, record.end = "timeout", now()
            raise
        except Exception:
            record.outcome, record.end = "error", now()
            raise
        record.outcome, record.end, record.token = "granted", now(), lock.token
        await self.probe.release(lock)
        return record.end

    async def gap(self, kind: str, started: float, faulty: Any) -> float:
        """
        Time from the fault to the first grant by one of the other nodes.
        """
        others = [n for n in self.cluster.nodes if n is not faulty]
        key = b"probe/%d" % len(self.history.faults)
        gap: float = await deferToThread(firstGrant, others, started, key)
        self.history.gaps.setdefault(kind, []).append(gap)
        return gap

    async def refreshSentinels(self, checkLost: bool) -> None:
        """
        Release the sentinel locks (counting any that were lost) and take
        fresh ones.
        """
        for key, lock in list(self.sentinels.items()):
            try:
                ok = await self.probe.release(lock)
            except ReleaseFailed:
                ok = False
            if checkLost:
                self.history.handoffChecks += 1
                if not ok:
                    self.history.handoffLost += 1
                    self.log(f"  LOST sentinel {key} token {lock.token} across a handoff")
        self.sentinels = {}
        for key in SENTINELS:
            self.sentinels[key] = await self.probe.acquire(key, 600, 15)
        await self.sleep(0.2)  # let replication carry them

    # -- faults ----------------------------------------------------------------

    async def inject(self, kind: str) -> None:
        fault = Fault(kind, now())
        self.history.faults.append(fault)
        if kind == "kill9-active":
            node = await self.activeNode()
            fault.start = now()
            node.kill()
            gap = await self.gap(kind, fault.start, node)
            fault.windowEnd = now() + 1.0
            fault.detail = f"{node.name}, failover {gap * 1000:.0f} ms"
            await self.sleep(0.5)
            await self.restart(node)
            await self.refreshSentinels(checkLost=False)
        elif kind == "sigstop-active":
            node = await self.activeNode()
            fault.start = now()
            node.signal(signal.SIGSTOP)
            try:
                gap = await self.gap(kind, fault.start, node)
                await self.sleep(0.5)
            finally:
                node.signal(signal.SIGCONT)
            await self.settled(20)
            fault.windowEnd = now() + 1.0
            fault.detail = f"{node.name}, failover {gap * 1000:.0f} ms"
            await self.refreshSentinels(checkLost=False)
        elif kind == "sigint-active":
            node = await self.activeNode()
            fault.start = now()
            node.signal(signal.SIGINT)
            gap = await self.gap(kind, fault.start, node)
            await deferToThread(node.process.wait, 15)
            fault.detail = f"{node.name}, handoff gap {gap * 1000:.0f} ms"
            await self.refreshSentinels(checkLost=True)
            await self.restart(node)
            await self.refreshSentinels(checkLost=True)
        elif kind == "kill9-client":
            await self.abandon(fault)
        elif kind == "proxy-cut":
            proxy = self.busiestProxy()
            fault.detail = f"cut {proxy.cutAll()} links"
        elif kind in NET_FAULT_KINDS:
            await self.networkFault(kind, fault)
        elif kind == "proxy-stall":
            proxy = self.busiestProxy()
            proxy.stall()
            await self.sleep(1.0)
            proxy.resume()
            fault.windowEnd = now() + 0.5
            fault.detail = f"stalled {len(proxy.links)} links for 1 s"
        self.log(f"  fault {kind:15} {fault.detail}")

    async def networkFault(self, kind: str, fault: Fault) -> None:
        lab = self.lab
        assert lab is not None
        node = await self.activeNode()
        i = self.cluster.nodes.index(node)
        others = [n for n in self.cluster.nodes if n is not node]
        promotedBefore = [n.tail(100000).count("promoted to active") for n in others]
        fault.start = now()
        if kind == "peer-cut":
            await deferToThread(lab.cutPeers, i)
            await self.sleep(3.0)
        elif kind == "asym-cut":
            await deferToThread(lab.cutPeers, i, "DROP", True, False)
            await self.sleep(3.0)
        elif kind == "client-cut":
            await deferToThread(lab.cutClients, i)
            await self.sleep(2.0)
        elif kind == "peer-reset":
            await deferToThread(lab.cutPeers, i, "RESET", True, True, True)
            await self.sleep(0.5)
        await deferToThread(lab.heal)
        healed = now()
        await self.settled(20)
        settled = now() - healed
        if kind == "peer-reset":
            await self.sleep(1.5)  # longer than --peer-timeout after the resets
            promoted = sum(n.tail(100000).count("promoted to active") - before
                           for n, before in zip(others, promotedBefore, strict=True))
            self.history.resetPromotions += promoted
            fault.detail = f"{node.name}: 0.5 s of resets, {promoted} promotions"
        else:
            if kind != "client-cut":
                fault.windowEnd = now() + 1.0  # split brain is allowed inside
            fault.detail = f"{node.name}: one active {settled * 1000:.0f} ms after the heal"
        await self.refreshSentinels(checkLost=False)

    def busiestProxy(self) -> FaultProxy:
        """
        The proxy carrying the most worker links: redirects gather the
        workers on the active node's proxy, so that is where faults bite.
        """
        proxies = list(self.proxies.values())
        self.rng.shuffle(proxies)
        return max(proxies, key=lambda p: len(p.links))

    async def restart(self, node: Any) -> None:
        await deferToThread(node.start, False)
        await deferToThread(node.waitReady, 20)
        await self.settled(20)

    def spawnVictim(self, key: str, lease: float) -> Tuple[_Victim, Any]:
        victim = _Victim()
        process = self.reactor.spawnProcess(
            victim, sys.executable,
            [sys.executable, "-m", "lockservice.chaos", "victim", "--addrs",
             ",".join(self.cluster.addresses()), "--key", key, "--lease", str(lease)],
            env=twistdEnvironment(),
        )
        self.victims.append(process)
        return victim, process

    async def abandon(self, fault: Fault) -> None:
        """
        Client processes killed with SIGKILL: one queued behind a lock, one
        holding a lock.  The dead waiter is withdrawn (the key goes to the
        next acquire at once), and the dead holder's lock is granted again
        within its lease + 10%.
        """
        n = len(self.history.abandoned)
        queuedKey = f"abandoned-waiter/{n}"
        blocker = await self.probe.acquire(queuedKey, 30, 15)
        waiter, waiterProcess = self.spawnVictim(queuedKey, 30)
        await waiter.ready
        await self.sleep(0.3)  # its acquire is on the wire and queued
        waiterProcess.signalProcess("KILL")
        await self.sleep(0.2)
        await self.probe.release(blocker)
        releasedAt = now()
        try:
            regrantedAfterWaiter: Optional[float] = await self.timedGrant(queuedKey, wait=5)
        except Exception:
            regrantedAfterWaiter = None
        self.history.abandonedWaiters.append((releasedAt, regrantedAfterWaiter))

        key = f"abandoned/{n}"
        victim, process = self.spawnVictim(key, LEASE)
        grantedAt = await victim.granted
        process.signalProcess("KILL")
        try:
            regranted: Optional[float] = await self.timedGrant(key, wait=LEASE * 2 + 2)
        except Exception:
            regranted = None
        self.history.abandoned.append((grantedAt, LEASE, regranted))
        fault.detail = (
            ("holder's lock regranted never" if regranted is None
             else f"holder's lock regranted after {regranted - grantedAt:.2f} s (lease {LEASE} s)")
            + ("; dead waiter's key regranted never" if regrantedAfterWaiter is None
               else f"; dead waiter's key regranted {regrantedAfterWaiter - releasedAt:.2f} s "
                    "after the release"))

    def kinds(self) -> List[str]:
        return FAULT_KINDS + (NET_FAULT_KINDS if self.lab is not None else [])

    async def faults(self, until: float) -> None:
        kinds = self.kinds()
        order = list(kinds)
        self.rng.shuffle(order)
        while now() < until:
            await self.sleep(self.rng.uniform(2.0, 4.0))
            if now() >= until:
                break
            kind = order.pop(0) if order else self.rng.choice(kinds)
            await self.inject(kind)

    # -- the whole run ---------------------------------------------------------

    async def run(self) -> Dict[str, Any]:
        started = now()
        try:
            await self.setUp()
            self.log(f"cluster up in {now() - started:.1f} s; {self.workerCount} workers; "
                     f"seed {self.seed}; logs in {self.logDir}")
            if self.netSkipped is not None:
                self.log(f"network faults skipped: {self.netSkipped}")
            else:
                self.log("network faults on: each node in its own network namespace")
            workers = [Deferred.fromCoroutine(self.work(i)) for i in range(self.workerCount)]
            end = now() + self.duration
            await self.faults(until=end - 6)
            while now() < end:
                await self.sleep(0.2)
            self.stopping = True
            await gatherResults(workers, consumeErrors=True)
        finally:
            await self.tearDown()
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
            "network_faults": self.netSkipped is None,
            "logs": self.logDir,
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

