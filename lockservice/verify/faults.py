"""
The faults of a chaos run, on a seeded schedule: process faults (kill -9,
SIGSTOP, SIGINT of the active; kill -9 of client processes), proxy cuts
and stalls, and (root only) network faults between namespaces.
"""

from __future__ import annotations

import random
import signal
import sys
from typing import Any, List, Optional, Tuple

from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.threads import deferToThread

from lockservice.testing.harness import twistdEnvironment
from lockservice.testing.proxy import FaultProxy
from lockservice.verify.history import Fault, History, now
from lockservice.verify.rig import Rig

# The lease of the lock a killed client holds.
VICTIM_LEASE = 3.0
FAULT_KINDS = ["kill9-active", "sigstop-active", "sigint-active", "kill9-client",
               "proxy-cut", "proxy-stall"]
NET_FAULT_KINDS = ["peer-cut", "client-cut", "asym-cut", "peer-reset", "oneway-kill"]


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


class Faults:
    def __init__(self, rig: Rig, history: History, rng: random.Random, log: Any = print) -> None:
        self.rig = rig
        self.history = history
        self.rng = rng
        self.log = log

    async def inject(self, kind: str) -> None:
        fault = Fault(kind, now())
        self.history.faults.append(fault)
        if kind == "kill9-active":
            node = await self.rig.activeNode()
            fault.start = now()
            node.kill()
            gap = await self.rig.gap(kind, fault.start, node)
            fault.windowEnd = now() + 1.0
            fault.detail = f"{node.name}, failover {gap * 1000:.0f} ms"
            await self.rig.sleep(0.5)
            await self.rig.restart(node)
            await self.rig.refreshSentinels(checkLost=False)
        elif kind == "sigstop-active":
            node = await self.rig.activeNode()
            fault.start = now()
            node.signal(signal.SIGSTOP)
            try:
                gap = await self.rig.gap(kind, fault.start, node)
                await self.rig.sleep(0.5)
            finally:
                node.signal(signal.SIGCONT)
            await self.rig.settled(20)
            fault.windowEnd = now() + 1.0
            fault.detail = f"{node.name}, failover {gap * 1000:.0f} ms"
            await self.rig.refreshSentinels(checkLost=False)
        elif kind == "sigint-active":
            node = await self.rig.activeNode()
            fault.start = now()
            node.signal(signal.SIGINT)
            gap = await self.rig.gap(kind, fault.start, node)
            await deferToThread(node.process.wait, 15)
            fault.detail = f"{node.name}, handoff gap {gap * 1000:.0f} ms"
            await self.rig.refreshSentinels(checkLost=True)
            await self.rig.restart(node)
            await self.rig.refreshSentinels(checkLost=True)
        elif kind == "kill9-client":
            await self.abandon(fault)
        elif kind == "proxy-cut":
            proxy = self.busiestProxy()
            fault.detail = f"cut {proxy.cutAll()} links"
        elif kind == "oneway-kill":
            await self.oneWayCutThenKill(fault)
        elif kind in NET_FAULT_KINDS:
            await self.networkFault(kind, fault)
        elif kind == "proxy-stall":
            proxy = self.busiestProxy()
            proxy.stall()
            await self.rig.sleep(1.0)
            proxy.resume()
            fault.windowEnd = now() + 0.5
            fault.detail = f"stalled {len(proxy.links)} links for 1 s"
        self.log(f"  fault {kind:15} {fault.detail}")

    async def oneWayCutThenKill(self, fault: Fault) -> None:
        """
        What the active sends one standby is dropped (one way) for longer
        than the peer timeout; the probe releases locks meanwhile (answered
        OK, replicated to the other standby); the active is killed and the
        cut heals.  Whoever serves next must hold none of those keys: an
        answered release is never undone.
        """
        lab = self.rig.lab
        assert lab is not None
        node = await self.rig.activeNode()
        nodes = self.rig.cluster.nodes
        i = nodes.index(node)
        cut = (i + 1) % len(nodes)
        keys = [f"oneway/{len(self.history.faults)}/{j}" for j in range(3)]
        locks = [await self.rig.probe.acquire(key, 60, 15) for key in keys]
        await self.rig.sleep(0.5)  # replicated to both standbys
        await deferToThread(lab.dropOneWay, i, cut)
        try:
            await self.rig.sleep(1.3)
            for lock in locks:
                await self.rig.probe.release(lock)
            await self.rig.sleep(0.3)  # the releases reach the standby still linked
            fault.start = now()
            node.kill()
        finally:
            await deferToThread(lab.heal)
        undone = 0
        for key in keys:
            try:
                await self.rig.timedGrant(key, wait=5 + 2)
            except Exception:
                undone += 1
        self.history.releasesUndone += undone
        fault.windowEnd = now() + 1.0
        fault.detail = (f"{node.name} -> {nodes[cut].name} dropped, {node.name} killed: "
                        f"{undone} of {len(keys)} answered releases undone")
        await self.rig.restart(node)
        await self.rig.refreshSentinels(checkLost=False)

    async def networkFault(self, kind: str, fault: Fault) -> None:
        lab = self.rig.lab
        assert lab is not None
        node = await self.rig.activeNode()
        i = self.rig.cluster.nodes.index(node)
        others = [n for n in self.rig.cluster.nodes if n is not node]
        promotedBefore = [n.tail(100000).count("promoted to active") for n in others]
        fault.start = now()
        if kind == "peer-cut":
            await deferToThread(lab.cutPeers, i)
            await self.rig.sleep(3.0)
        elif kind == "asym-cut":
            await deferToThread(lab.cutPeers, i, "DROP", True, False)
            await self.rig.sleep(3.0)
        elif kind == "client-cut":
            await deferToThread(lab.cutClients, i)
            await self.rig.sleep(2.0)
        elif kind == "peer-reset":
            await deferToThread(lab.cutPeers, i, "RESET", True, True, True)
            await self.rig.sleep(0.5)
        await deferToThread(lab.heal)
        healed = now()
        await self.rig.settled(20)
        settled = now() - healed
        if kind == "peer-reset":
            await self.rig.sleep(1.5)  # longer than --peer-timeout after the resets
            promoted = sum(n.tail(100000).count("promoted to active") - before
                           for n, before in zip(others, promotedBefore, strict=True))
            self.history.resetPromotions += promoted
            fault.detail = f"{node.name}: 0.5 s of resets, {promoted} promotions"
        else:
            if kind != "client-cut":
                fault.windowEnd = now() + 1.0  # split brain is allowed inside
            fault.detail = f"{node.name}: one active {settled * 1000:.0f} ms after the heal"
        await self.rig.refreshSentinels(checkLost=False)

    def busiestProxy(self) -> FaultProxy:
        """
        The proxy carrying the most worker links: redirects gather the
        workers on the active node's proxy, so that is where faults bite.
        """
        proxies = list(self.rig.proxies.values())
        self.rng.shuffle(proxies)
        return max(proxies, key=lambda p: len(p.links))

    def spawnVictim(self, key: str, lease: float) -> Tuple[_Victim, Any]:
        victim = _Victim()
        process = self.rig.reactor.spawnProcess(
            victim, sys.executable,
            [sys.executable, "-m", "lockservice.chaos", "victim", "--addrs",
             ",".join(self.rig.cluster.addresses()), "--key", key, "--lease", str(lease)],
            env=twistdEnvironment(),
        )
        self.rig.victims.append(process)
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
        blocker = await self.rig.probe.acquire(queuedKey, 30, 15)
        waiter, waiterProcess = self.spawnVictim(queuedKey, 30)
        await waiter.ready
        await self.rig.sleep(0.3)  # its acquire is on the wire and queued
        waiterProcess.signalProcess("KILL")
        await self.rig.sleep(0.2)
        await self.rig.probe.release(blocker)
        releasedAt = now()
        try:
            regrantedAfterWaiter: Optional[float] = await self.rig.timedGrant(queuedKey, wait=5)
        except Exception:
            regrantedAfterWaiter = None
        self.history.abandonedWaiters.append((releasedAt, regrantedAfterWaiter))

        key = f"abandoned/{n}"
        victim, process = self.spawnVictim(key, VICTIM_LEASE)
        grantedAt = await victim.granted
        process.signalProcess("KILL")
        try:
            regranted: Optional[float] = await self.rig.timedGrant(key, wait=VICTIM_LEASE * 2 + 2)
        except Exception:
            regranted = None
        self.history.abandoned.append((grantedAt, VICTIM_LEASE, regranted))
        fault.detail = (
            ("holder's lock regranted never" if regranted is None
             else f"holder's lock regranted after {regranted - grantedAt:.2f} s "
                  f"(lease {VICTIM_LEASE} s)")
            + ("; dead waiter's key regranted never" if regrantedAfterWaiter is None
               else f"; dead waiter's key regranted {regrantedAfterWaiter - releasedAt:.2f} s "
                    "after the release"))

    def kinds(self) -> List[str]:
        return FAULT_KINDS + (NET_FAULT_KINDS if self.rig.lab is not None else [])

    async def run(self, until: float) -> None:
        """
        Faults every 2-4 s until C{until}: each kind once, in a seeded
        order, then kinds at random.
        """
        kinds = self.kinds()
        order = list(kinds)
        self.rng.shuffle(order)
        while now() < until:
            await self.rig.sleep(self.rng.uniform(2.0, 4.0))
            if now() >= until:
                break
            kind = order.pop(0) if order else self.rng.choice(kinds)
            await self.inject(kind)
