# -*- test-case-name: tests.process.test_systemd -*-
"""
The systemd notification protocol (C{sd_notify}), with the standard
library only: a datagram to the socket named by C{NOTIFY_SOCKET} (a path,
or C{@name} in the abstract namespace).

Under C{Type=notify} the node tells systemd:

  - C{READY=1} once it does its job: a lone node once it listens; a
    cluster node once it is a standby synchronised with the active, or
    active (it found none and promoted, or took over);
  - C{STATUS=...}: its role, at start and at every role change;
  - C{STOPPING=1} as soon as SIGTERM or SIGINT arrives, before an active
    hands off (L{lockservice.tap.NodeService.stopService});
  - C{WATCHDOG=1} every half of C{WATCHDOG_USEC} (when C{WATCHDOG_PID},
    if set, is this process), from the reactor: a reactor that stalls
    stops the pings, and systemd restarts the node.

Without C{NOTIFY_SOCKET} (not run by systemd) nothing here does anything.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any, Callable, Iterable, List, Mapping, Optional

from twisted.application.service import Service
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

# The node's roles (lockservice.core.election); a lone node is always active.
ACTIVE, STANDBY = "active", "standby"


def notifyAddress(environ: Mapping[str, str]) -> Optional[str]:
    """
    The socket address of C{NOTIFY_SOCKET} as C{socket.connect} takes it,
    or None when there is none (or one of a kind not supported: vsock).
    """
    value = environ.get("NOTIFY_SOCKET", "")
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdogInterval(environ: Mapping[str, str], pid: int) -> Optional[float]:
    """
    Seconds between C{WATCHDOG=1} pings: half of C{WATCHDOG_USEC}; None
    when systemd asks for none, or asks another process (C{WATCHDOG_PID}).
    """
    usec, owner = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != pid):
        return None
    return int(usec) / 2e6


class Notifier:
    """
    Sends notifications to one C{NOTIFY_SOCKET}.  A send never blocks:
    one that cannot go out now (systemd not reading) is dropped, and the
    next state replaces it.
    """

    log = Logger()

    def __init__(self, address: str) -> None:
        self.address = address
        self._socket: Optional[socket.socket] = None
        self._warned = False

    @classmethod
    def fromEnvironment(cls, environ: Mapping[str, str] = os.environ) -> Optional["Notifier"]:
        address = notifyAddress(environ)
        return cls(address) if address is not None else None

    def send(self, *assignments: str) -> bool:
        """
        Send C{assignments} (C{"READY=1"}, C{"STATUS=..."}) in one datagram.

        @return: whether it went out.
        """
        message = "\n".join(a.replace("\n", " ") for a in assignments).encode("utf-8")
        try:
            if self._socket is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                s.setblocking(False)
                self._socket = s
            self._socket.sendto(message, self.address)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ENOBUFS) and not self._warned:
                self._warned = True
                self.log.warn("cannot notify systemd at {address}: {why}",
                              address=self.address.replace("\0", "@"), why=e.strerror,
                              event="systemd_notify_failed")
            return False
        return True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class RoleWatch:
    """
    An activity observer of the lock service (L{Observers.attach}) that
    only cares for role changes: C{changed(role)} is called with each new
    role.  Its other methods do nothing.
    """

    def __init__(self, changed: Callable[[str], object]) -> None:
        self.changed = changed

    def roleChanged(self, now: float, role: str, holders: Iterable[Any]) -> None:
        self.changed(role)

    def queued(self, now: float, waiter: Any) -> None:
        pass

    def waitEnded(self, now: float, waiter: Any, reason: str) -> None:
        pass

    def granted(self, now: float, key: bytes, token: int, owner: Optional[str],
                waiter: Any, waited: float, conn: Any = None) -> None:
        pass

    def dropped(self, now: float, key: bytes, token: int, owner: Optional[str],
                heldFor: float, expired: bool) -> None:
        pass

    def renewed(self, now: float, key: bytes, token: int, owner: Optional[str],
                expiresAt: float) -> None:
        pass


def describe(role: str, activeAddress: Optional[bytes], cluster: Any) -> str:
    """
    The C{STATUS=} text for a role: the role first, then what it means.
    """
    if cluster is None:
        return "active (single node): serving"
    active = activeAddress.decode() if activeAddress else None
    if role == ACTIVE:
        peers = [v for v in cluster.views.values() if v.alive]
        return (f"active (term {cluster.term}): serving; "
                f"{len(peers)} of {len(cluster.views)} peers reachable")
    if role == STANDBY:
        if active is not None:
            return f"standby: in sync with the active {active}"
        if getattr(cluster, "clockSuspect", None):
            return "standby: this node's clock looks wrong, it does not serve"
        return "standby: no active reachable"
    if role == "syncing":
        return ("syncing: catching up with the active " + active if active
                else "syncing: looking for the active")
    if role == "handing-off":
        return "handing-off: not answering for a moment (a handoff, or peers catching up)"
    if role == "leaving":
        return "leaving: stopping"
    return role


class SystemdService(Service):
    """
    Tells systemd (L{Notifier}) the node's readiness, role, stop and
    liveness.

    @ivar ready: whether C{READY=1} was sent.
    """

    log = Logger()

    def __init__(self, reactor: Any, notifier: Notifier, locks: Any, cluster: Any = None,
                 watchdog: Optional[float] = None) -> None:
        """
        @param locks: the L{LockService}: its C{role} and C{activeAddress}.
        @param cluster: the L{Cluster}, or None for a lone node.
        @param watchdog: seconds between C{WATCHDOG=1} pings, or None.
        """
        self.reactor = reactor
        self.notifier = notifier
        self.locks = locks
        self.cluster = cluster
        self.watchdog = watchdog
        self.ready = False
        self.stopping = False
        self._running = False
        self._lastStatus: Optional[str] = None
        self._pings: Optional[LoopingCall] = None
        self.sent: List[str] = []  # (for tests: what was sent, in order)

    @classmethod
    def fromEnvironment(cls, reactor: Any, locks: Any, cluster: Any = None,
                        environ: Mapping[str, str] = os.environ) -> Optional["SystemdService"]:
        """
        The service for this process's environment, or None when not run
        by systemd.  It watches C{locks}' role changes from now on.
        """
        notifier = Notifier.fromEnvironment(environ)
        if notifier is None:
            return None
        service = cls(reactor, notifier, locks, cluster,
                      watchdogInterval(environ, os.getpid()))
        # The service's own observer list (one call per role change; the
        # grant and release calls do nothing).
        locks.notify.attach(RoleWatch(service.roleChanged))
        return service

    def _send(self, *assignments: str) -> None:
        self.sent.extend(assignments)
        self.notifier.send(*assignments)

    def startService(self) -> None:
        super().startService()
        # The listeners are bound once the reactor runs (privilegedStartService).
        self.reactor.callWhenRunning(self._running_)
        if self.watchdog is not None:
            self._pings = LoopingCall(self._send, "WATCHDOG=1")
            self._pings.clock = self.reactor
            self.reactor.callWhenRunning(self._pings.start, self.watchdog, True)

    def _running_(self) -> None:
        self._running = True
        self.roleChanged(self.locks.role)

    def roleChanged(self, role: str) -> None:
        """
        The node's role is now C{role}: say so, and that it is ready the
        first time it does its job.
        """
        if not self._running:
            return
        status = describe(role, self.locks.activeAddress, self.cluster)
        if self.stopping:
            status = "stopping; " + status
        assignments = []
        if status != self._lastStatus:
            self._lastStatus = status
            assignments.append(f"STATUS={status}")
        if not self.ready and not self.stopping and role in (ACTIVE, STANDBY):
            self.ready = True
            assignments.insert(0, "READY=1")
        if assignments:
            self._send(*assignments)

    def stoppingNow(self) -> None:
        """
        SIGTERM or SIGINT: called first thing, before any handoff.
        """
        if self.stopping:
            return
        self.stopping = True
        self._lastStatus = "stopping"
        self._send("STOPPING=1", "STATUS=stopping")

    def stopService(self) -> None:
        super().stopService()
        if self._pings is not None and self._pings.running:
            self._pings.stop()
        self.notifier.close()
