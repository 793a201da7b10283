"""
The cluster a chaos run works on: three real nodes (each in its own
network namespace when root), a fault-injecting proxy in front of each,
the worker clients connected through the proxies, and a probe client
connected directly.
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List, Optional

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from lockservice.client.api import LockClient, LockTimeout, ReleaseFailed, connect
from lockservice.tcp import clientEndpoint
from lockservice.testing import netns
from lockservice.testing.harness import Cluster, activeNodes, firstGrant
from lockservice.testing.proxy import FaultProxy
from lockservice.verify.history import AcquireRecord, History, now

SENTINELS = ["sentinel/0", "sentinel/1", "sentinel/2"]


class Rig:
    """
    @ivar sentinels: long locks the probe holds, checked across handoffs.
    @ivar victims: client processes spawned to be killed.
    """

    def __init__(self, reactor: Any, workerCount: int, history: History,
                 log: Any = print) -> None:
        self.reactor = reactor
        self.workerCount = workerCount
        self.history = history
        self.log = log
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

    async def restart(self, node: Any) -> None:
        await deferToThread(node.start, False)
        await deferToThread(node.waitReady, 20)
        await self.settled(20)

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
