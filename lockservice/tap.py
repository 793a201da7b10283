# -*- test-case-name: tests.process.test_tap -*-
"""
C{twistd lockservice}: the service tree (the options are
L{lockservice.options}).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IProtocolFactory
from twisted.python.components import Componentized

from lockservice.internals import dispatchWithoutLogContext, raiseBindErrorsAtStart
from lockservice.options import Options, oneLine, parseAddress
from lockservice.server.clock import useMonotonicTime, wallMicros
from lockservice.server.protocol import LockFactory
from lockservice.server.service import LockService
from lockservice.startup import (
    allowInterrupt,
    daemonized,
    fitConnections,
    fixMallocThreshold,
    raiseFileLimit,
)
from lockservice.tcp import clientEndpoint
from lockservice.tls import NodeTLS

if TYPE_CHECKING:
    from lockservice.cluster.node import Cluster
    from lockservice.logs import LogTarget
    from lockservice.state import NodeState
    from lockservice.systemd import SystemdService



class NodeService(MultiService):
    """
    The node's service tree.  On stop, the cluster hands off first (while
    the listener and the lock table still serve), then everything stops.
    """

    cluster: Optional["Cluster"] = None
    locks: Optional[LockService] = None
    nodeState: Optional["NodeState"] = None
    # The log observer to offer twistd (see lockservice.logs), and what
    # tells systemd of the node (see lockservice.systemd).
    logTarget: Optional["LogTarget"] = None
    systemd: Optional["SystemdService"] = None

    def setServiceParent(self, parent: Any) -> None:
        # twistd makes the application, adds this service to it, then asks
        # the application for its log observer before choosing its own.
        if self.logTarget is not None and isinstance(parent, Componentized):
            from twisted.logger import ILogObserver

            parent.setComponent(ILogObserver, self.logTarget.observer)
        super().setServiceParent(parent)

    def privilegedStartService(self) -> None:
        # The listeners bind here (before the reactor runs).  A port that is
        # busy or not allowed ends twistd with one line, not a traceback.
        try:
            super().privilegedStartService()
        except Exception as e:
            from twisted.internet.error import CannotListenError

            reason = oneLine(e) if isinstance(e, CannotListenError) else (
                f"cannot listen: {oneLine(e)}")
            if daemonized():
                # twistd's waiting parent reports an exception (not a
                # SystemExit) on its own stderr, and exits 1.
                raise CannotStart(reason) from None
            # twistd has sent sys.stderr to the log by now: use the real one.
            stderr = sys.__stderr__ or sys.stderr
            stderr.write(f"twistd lockservice: {reason}\n")
            stderr.flush()
            raise SystemExit(1) from None

    def stopService(self) -> "Deferred[None]":
        from lockservice.core.election import ACTIVE

        if self.systemd is not None:
            # At once, before a handoff: systemd then knows the node stops.
            self.systemd.stoppingNow()

        async def stop() -> None:
            cluster = self.cluster
            wasActive = cluster is None or cluster.role == ACTIVE
            if cluster is not None:
                await cluster.gracefulStop()
            if self.nodeState is not None and self.locks is not None:
                # The exact highest token; and the held locks, when nobody
                # took them over, for the next start.
                self.nodeState.stopped(self.locks, keepLocks=wasActive and (
                    cluster is None or cluster.leader is None))
            await super(NodeService, self).stopService()

        return Deferred.fromCoroutine(stop())


class CannotStart(Exception):
    """
    The node cannot start (a listener cannot bind).
    """


def _peerEndpoints(reactor: Any, config: Options) -> Callable[[int], Any]:
    """
    Peer links of a TLS node: TLS too (verified against --tls-ca if given).
    """
    from twisted.internet.endpoints import wrapClientTLS

    tls: NodeTLS = config["tls"]
    peers: List[str] = config["peerList"]
    timeout = max(config["peer-timeout"], 0.5)

    def endpointFor(j: int) -> Any:
        host, port = parseAddress(peers[j])
        return wrapClientTLS(tls.peerOptions(host),
                             clientEndpoint(reactor, host, port, timeout=timeout))

    return endpointFor


def _openState(config: Options, locks: LockService, cluster: Optional["Cluster"]) -> "NodeState":
    """
    --state-dir: restore the token mark and the saved locks before anything
    is served; a directory or file that cannot be used ends the process
    with one line.
    """
    from twisted.logger import Logger

    from lockservice.state import NodeState, StateDir, StateError, clusterIdentity

    peers: List[str] = config["peerList"]
    directory = StateDir(config["state-dir"], clusterIdentity(config["secretBytes"], peers),
                         config["self"] or "",
                         [clusterIdentity(s, peers) for s in config["acceptSecretBytes"]])
    state = NodeState(directory, wallMicros,
                      (lambda: cluster.maxTerm) if cluster is not None else (lambda: 0))
    try:
        kept, ended = state.start(locks)
    except StateError as e:
        stderr = sys.__stderr__ or sys.stderr
        stderr.write(f"twistd lockservice: {e}\n")
        stderr.flush()
        raise SystemExit(1) from None
    if cluster is not None:
        # Terms after a restart rise above every term recorded, too.
        cluster.learnTerm(state.restored)
        if kept:
            cluster.restoredLocks(state.state.term)
    Logger().info("state dir {path}: tokens start above {mark}; {kept} saved held locks "
                  "restored, {ended} ran out while the node was down",
                  path=config["state-dir"], mark=locks.table.tokens.last, kept=kept, ended=ended)
    return state


def makeService(config: Options) -> IService:
    from twisted.internet import reactor

    useMonotonicTime(reactor)
    if os.environ.get("LOCKSERVICE_BENCH_STOCK_DISPATCH") != "1":
        # (Stock dispatch only for `bench`'s before/after comparison.)
        dispatchWithoutLogContext(reactor)
    # Objects made at start (modules, classes: tens of thousands) live
    # forever: keep them out of every full garbage collection, whose pause
    # is proportional to the objects it walks.
    reactor.callWhenRunning(gc.freeze)
    raiseFileLimit()
    fixMallocThreshold()
    allowInterrupt()
    root = NodeService()
    from lockservice import logs

    # Under twistd (the options' parent is twistd's own): the node's log
    # observer and its signals (SIGHUP reopens the log file).
    root.logTarget = logs.targetFor(getattr(config, "parent", None), config["log-format"])
    if getattr(config, "parent", None) is not None:
        logs.handleSignals(reactor, root.logTarget)
    from twisted.logger import Logger

    for warning in config.get("warnings", []):
        Logger().warn("{warning}", warning=warning, event="secret_file_readable")
    locks = LockService(
        reactor, wallMicros, maxLease=config["max-lease"], maxWait=config["max-wait"],  # type: ignore[arg-type]
        maxKeys=config["max-keys"], maxWaiters=config["max-waiters"],
        maxObservers=config["max-observers"], lockDelay=config["lock-delay"],
    )
    locks.setServiceParent(root)
    tls: Optional[NodeTLS] = config["tls"]
    from lockservice.server.monitor import Monitor

    # Always on: long holds and deadlocks are logged even without --http.
    monitor = Monitor(reactor, locks.table.clientOf,  # type: ignore[arg-type]
                      warnHold=config["warn-hold"])
    if os.environ.get("LOCKSERVICE_BENCH_DETACH_MONITOR") != "1":
        # (Detached only by `python -m lockservice.bench suite`, to measure
        # what the operator's view costs: never in production.)
        locks.notify.attach(monitor)
        locks.notify.mirrors.append(monitor)  # grants merged on a heal
    cluster = None
    if len(config["peerList"]) > 1:
        from lockservice.cluster.node import Cluster

        cluster = Cluster(
            reactor,
            locks,
            peers=config["peerList"],
            me=config["self"],
            secret=config["secretBytes"],
            acceptSecrets=config["acceptSecretBytes"],
            heartbeat=config["heartbeat"],
            peerTimeout=config["peer-timeout"],
            replication=config["replication"],
            endpointFor=_peerEndpoints(reactor, config) if tls is not None else None,
        )
        cluster.eventSink = monitor.clusterEvent
        cluster.setServiceParent(root)
        root.cluster = cluster
    factory: IProtocolFactory = LockFactory(
        locks, cluster.acceptPeer if cluster is not None else None,
        maxConnections=fitConnections(config["max-connections"]))
    if tls is not None and tls.certificate is not None:
        factory = tls.wrapServerFactory(factory)
    if config["state-dir"]:
        root.locks = locks
        root.nodeState = _openState(config, locks, cluster)
    else:
        from lockservice.state import ClockWatch

        ClockWatch(reactor, lambda: locks.table.tokens, wallMicros).setServiceParent(root)  # type: ignore[arg-type]
    listener = StreamServerEndpointService(serverFromString(reactor, config["listen"]), factory)
    # A port that cannot be bound must stop twistd, not leave a deaf node.
    raiseBindErrorsAtStart(listener)
    listener.setServiceParent(root)
    from lockservice.systemd import SystemdService

    systemd = SystemdService.fromEnvironment(reactor, locks, cluster)
    if systemd is not None:
        systemd.setServiceParent(root)
        root.systemd = systemd
    if config["http"]:
        from lockservice.server.http import makeHTTPService

        makeHTTPService(reactor, config["http"], locks, cluster, monitor,
                        config["adminSecretBytes"], state=root.nodeState).setServiceParent(root)
    return root
