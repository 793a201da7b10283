# -*- test-case-name: tests.server.test_http -*-
"""
The node's own pages: C{GET /status}, and C{GET /locks} (who holds what
and who waits: a page of held keys, or one key).  C{POST} on C{/locks}
is the admin's force-release (L{lockservice.server.webrelease}), and
C{/locks/stats} the busiest keys (L{lockservice.server.webevents}).
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any, Dict, Iterator, List, Optional, Tuple

from twisted.internet.task import Cooperator
from twisted.web.server import Request

import lockservice
from lockservice.core.table import EXCLUSIVE, READ, READ_WRITE, Holder, nameOf
from lockservice.server import health
from lockservice.server.clusterview import ClusterView, replication
from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.server.webevents import STATS_LIMIT, STATS_MAX, statsParts
from lockservice.server.webjson import (
    Items,
    NodeResource,
    answerJSON,
    jsonPieces,
    queryArg,
    queryInt,
    queryKey,
)
from lockservice.server.webrelease import ForceRelease
from lockservice.state import clockBehind

# Defaults and ceilings of what one request may ask for (a larger ask is
# answered 400).  Big answers are produced a step at a time (see
# L{Answer}), so these bound an answer's size, not a stall.
LOCKS_LIMIT = 1000      # keys per /locks page (default and most)
WAITERS_LIMIT = 100     # waiters listed per key (default)
WAITERS_MAX = 1000      # waiters listed per key (most)
WAITERS_TOTAL = 5000    # waiters listed in one answer, all keys together
HOLDERS_LIMIT = 100     # grants listed per key (default; a shared key has many)
HOLDERS_MAX = 1000      # grants listed per key (most)
HOLDERS_TOTAL = 5000    # grants listed in one answer, all keys together


def status(locks: LockService, cluster: Optional[ClusterView],
           monitor: Optional[Monitor] = None) -> Dict[str, Any]:
    """
    This node and what it knows of the cluster, as plain data.
    """
    now = locks.clock.seconds()
    peers: List[Dict[str, Any]] = []
    node: Optional[str] = None  # a single node has no --peers entry
    active: Optional[str] = None
    term = 0
    if cluster is not None:
        node = cluster.myEntry.decode()
        address = cluster.activeAddress()
        active = address.decode() if address is not None else None
        term = cluster.term
        for j, view in sorted(cluster.views.items()):
            heard = cluster.lastHeard.get(j)
            peers.append({
                "address": cluster.peers[j].decode(),
                "priority": j,
                "alive": view.alive,
                "role": view.role if view.alive else "unknown",
                "term": view.term,
                "secret_mismatch": view.secretMismatch,
                "last_heard_seconds_ago": round(now - heard, 3) if heard is not None else None,
            })
    data: Dict[str, Any] = {
        "node": node,
        "role": locks.role,
        # What the node is doing now (lockservice.cluster.serving's states;
        # a node without peers: its lock service's mode): the role alone
        # says handing-off whenever the node is frozen, for any reason.
        "state": getattr(cluster, "state", None) or locks.mode,
        "term": term,
        "active": active,
        "peers": peers,
        "held_keys": len(locks.table),
        "waiters": locks.table.waiterCount,
        # Grants of keys held by readers or as semaphores (each key above
        # counts once, however many grants hold it).
        "shared_grants": locks.table.sharedGrants,
        "connections": len(locks.connections),
        # Observers (O) waiting for a change, and keys kept by the
        # lock-delay after an expiry.
        "observers": locks.observing.count,
        "lock_delay_seconds": locks.lockDelay,
        # Queued acquires withdrawn by their client (C), and dropped
        # because their connection went away.
        "withdrawals": locks.stats.withdrawals,
        "waiters_dropped": locks.stats.waitersDropped,
        "highest_token": locks.table.tokens.last,
        # Why this node's clock looks wrong, or null: the cluster's own
        # suspicion (a peer far ahead) first, else lockservice.state's.
        "clock_warning": (getattr(cluster, "clockSuspect", None)
                          or clockBehind(locks.table.tokens, time.time_ns() // 1000)),
        "uptime_seconds": round(locks.uptime(), 3),
        "version": lockservice.__version__,
    }
    if cluster is not None:
        # Peer handshakes this node refused (a stranger, another cluster's
        # node): counted here, logged once per source and reason.
        data["refused_handshakes"] = getattr(getattr(cluster, "links", None),
                                             "refusedHandshakes", 0)
        # Peers refused for speaking no peer protocol version of ours.
        data["incompatible_peers"] = list(getattr(cluster, "incompatiblePeers", []))
        # The replication stream: its mode, the standbys in sync, the
        # acknowledgement wait (see clusterview.replication).
        data["replication"] = replication(cluster)
    if monitor is not None:
        data["warn_hold_seconds"] = monitor.warnHold
        data["long_holds"] = monitor.currentLongHolds()
        # Bounded: the first cycles, and how many there are in all.
        data["deadlocks"] = monitor.deadlocks()
        data["deadlocks_count"] = len(monitor.graph.cycles)
    return data


def _wallAt(locks: LockService, monitor: Optional[Monitor], when: float) -> float:
    """
    The Unix time of the service's (monotonic) time C{when}.
    """
    wall = monitor.wallTime() if monitor is not None else time.time()
    return wall - (locks.clock.seconds() - when)


# How a grant holds its key, or how a waiter would (the "mode" fields).
def modeOf(share: int) -> str:
    """
    C{exclusive} (a plain lock, or the writer of a read-write key),
    C{reader}, or C{semaphore} (one of its slots).
    """
    if share == EXCLUSIVE:
        return "exclusive"
    return "reader" if share == READ else "semaphore"


def kindOf(locks: LockService, key: bytes) -> Tuple[str, Optional[int]]:
    """
    A held key's kind as the pages show it, and a semaphore's slot count:
    C{semaphore}; C{read-write} while readers hold it; C{exclusive} while
    one exclusive grant holds it (a plain lock, or the writer of a
    read-write key).
    """
    table = locks.table
    kind = table.kindOf(key)
    if kind is not None and kind != READ_WRITE:
        return "semaphore", kind
    return ("read-write" if table.isShared(key) else "exclusive"), None


def holderName(name: Optional[bytes], client: object) -> Optional[str]:
    """
    How a grant's holder is shown: the C{I} name its connection had when
    it was granted, else (a connection that never named itself) that
    connection's address while this node knows it.
    """
    if name is not None:
        return name.decode("utf-8", "replace")
    return nameOf(client)


def describeLock(locks: LockService, monitor: Optional[Monitor], key: bytes,
                 holder: Holder, waiters: int = WAITERS_LIMIT,
                 holders: int = HOLDERS_LIMIT) -> Dict[str, Any]:
    """
    One held key: its kind, its holders (the first C{holders} of them,
    oldest first) and the first C{waiters} of its queue.  The top-level
    C{token}, C{holder}, ... fields are those of C{holder}: the key's one
    grant, or of a shared key the grant whose lease runs out first.

    @param holder: a view of the key's grant, read here and dropped.
    """
    now = locks.clock.seconds()
    table = locks.table
    queue = []
    for waiter in islice(holder.waiters(), waiters):
        queue.append({
            "who": waiter.holderName(),
            "lease_seconds": waiter.lease,
            "waited_seconds": round(now - waiter.queuedAt, 3),
            "mode": modeOf(waiter.share),
        })
    kind, slots = kindOf(locks, key)
    share = holder.share
    listed = []
    for token, grantedAt, expiresAt, client, renewals, name, delayed in table.firstGrants(
            key, holders):
        listed.append({
            "token": token,
            "holder": holderName(name, client),
            "delayed": delayed,
            "mode": modeOf(share),
            "granted_at": round(_wallAt(locks, monitor, grantedAt), 3),
            "age_seconds": round(now - grantedAt, 3),
            "remaining_seconds": round(max(0.0, expiresAt - now), 3),
            "renewals": renewals,
            "long_hold": monitor is not None and monitor.isLongHold(key, token),
        })
    count = table.holderCount(key)
    delayedUntil = table.delayedUntil(key)
    return {
        "key": key.decode("utf-8", "replace"),
        "token": holder.token,
        "holder": holderName(table.nameOfGrant(key, holder.token), holder.client),
        "granted_at": round(_wallAt(locks, monitor, holder.grantedAt), 3),
        "age_seconds": round(now - holder.grantedAt, 3),
        "remaining_seconds": round(max(0.0, holder.expiresAt - now), 3),
        "renewals": holder.renewals,
        "long_hold": monitor is not None and (monitor.isLongHold(key, holder.token)
                                              or any(h["long_hold"] for h in listed)),
        "queue_length": holder.waiting,
        "waiters": queue,
        "waiters_truncated": holder.waiting > len(queue),
        "kind": kind,
        "slots": slots,
        "holder_count": count,
        "holders": listed,
        "holders_truncated": count > len(listed),
        # The lock-delay: places kept after their grants expired.
        "delayed": delayedUntil is not None,
        "delay_ends_at": (None if delayedUntil is None
                          else round(_wallAt(locks, monitor, delayedUntil), 3)),
        "delay_remaining_seconds": (None if delayedUntil is None
                                    else round(max(0.0, delayedUntil - now), 3)),
    }


def heldLocks(locks: LockService, key: Optional[bytes] = None, limit: int = LOCKS_LIMIT,
              offset: int = 0, monitor: Optional[Monitor] = None,
              waiters: int = WAITERS_LIMIT, holders: int = HOLDERS_LIMIT) -> Dict[str, Any]:
    """
    Who holds what and who waits, for one key or a page of held keys.
    """
    table = locks.table
    if key is not None:
        holder = table.holder(key)
        if holder is None:
            return {"key": key.decode("utf-8", "replace"), "held": False}
        return dict(describeLock(locks, monitor, key, holder, waiters, holders), held=True)
    listed = []
    # Waiters and grants listed in all; the rest are counted only.
    budget, grants = WAITERS_TOTAL, HOLDERS_TOTAL
    for k in table.page(offset, limit):
        h = table.holder(k)
        assert h is not None
        entry = describeLock(locks, monitor, k, h, min(waiters, budget), min(holders, grants))
        budget -= len(entry["waiters"])
        grants -= len(entry["holders"])
        listed.append(entry)
    return {
        "count": len(table),
        "offset": offset,
        "limit": limit,
        "truncated": offset + len(listed) < len(table),
        "locks": listed,
    }


def heldLocksParts(locks: LockService, limit: int = LOCKS_LIMIT, offset: int = 0,
                   monitor: Optional[Monitor] = None, waiters: int = WAITERS_LIMIT,
                   holders: int = HOLDERS_LIMIT) -> List[Tuple[str, Any]]:
    """
    A page of held keys as L{jsonPieces} parts, C{locks} made key by key.
    Each key is described as it is when its turn comes: a key released
    while the page is written is left out (C{count} and C{truncated} are
    as they were when the page was asked for).
    """
    table = locks.table
    keys = table.page(offset, limit)

    def entries() -> Iterator[Tuple[Dict[str, Any], int]]:
        # Waiters and grants listed in all; the rest are counted only.
        budget, grants = WAITERS_TOTAL, HOLDERS_TOTAL
        for k in keys:
            h = table.holder(k)
            if h is None:
                continue
            entry = describeLock(locks, monitor, k, h, min(waiters, budget),
                                 min(holders, grants))
            listed, held = len(entry["waiters"]), len(entry["holders"])
            budget -= listed
            grants -= held
            yield entry, 1 + listed + held

    return [("count", len(table)), ("offset", offset), ("limit", limit),
            ("truncated", offset + len(keys) < len(table)), ("locks", Items(entries()))]


class StatusResource(NodeResource):
    # The state directory whose write failures /status shows (makeRoot).
    state: Optional[health.StateSaves] = None

    def render_GET(self, request: Request) -> bytes:
        return answerJSON(request, {**status(self.locks, self.cluster, self.monitor),
                               **health.stateFields(self.state)})


class LocksResource(NodeResource):
    """
    C{GET /locks}, C{GET /locks?key=K}, C{GET /locks/K}, C{GET /locks/stats},
    and the admin's C{POST /locks/K/release} or C{POST /locks/release?key=K}.
    Keys may hold slashes (C{/locks/orders/42/release}) or percent-escapes
    (C{%2F} is a slash, C{%25} a percent sign).

    The query form (C{?key=K}) names any key without ambiguity; the path
    form cannot name a key called C{stats} (that is the statistics page).
    """

    def __init__(self, locks: LockService, cluster: Optional[ClusterView],
                 monitor: Optional[Monitor] = None,
                 adminSecret: Optional[bytes] = None,
                 cooperator: Optional[Cooperator] = None) -> None:
        super().__init__(locks, cluster, monitor, cooperator)
        self.forceRelease = ForceRelease(locks, monitor, adminSecret)

    def _path(self, request: Request) -> List[bytes]:
        # twisted.web has already percent-decoded each segment (after
        # splitting on "/", so %2F stays inside its segment): decoding
        # again would turn the key "a%41" into "aA".
        path = list(request.postpath or [])
        return [] if path == [b""] else path  # /locks/ is /locks

    def render_GET(self, request: Request) -> Any:
        path = self._path(request)
        waiters = queryInt(request, b"waiters", WAITERS_LIMIT, 0, WAITERS_MAX)
        holders = queryInt(request, b"holders", HOLDERS_LIMIT, 0, HOLDERS_MAX)
        if path == [b"stats"]:
            if self.monitor is None:
                return answerJSON(request, {"error": "no statistics on this node"}, 404)
            return self.stream(request, jsonPieces(statsParts(
                self.monitor, queryInt(request, b"limit", STATS_LIMIT, 0, STATS_MAX))))
        key = queryKey(b"/".join(path)) if path else queryKey(queryArg(request, b"key"))
        limit = queryInt(request, b"limit", LOCKS_LIMIT, 0, LOCKS_LIMIT)
        offset = queryInt(request, b"offset", 0, 0)
        if key is not None:
            # One key (up to WAITERS_MAX waiters and HOLDERS_MAX grants)
            # is one step, made on the Cooperator's turn: a queue cannot
            # be read across turns.
            def one(key: bytes = key) -> Iterator[Tuple[str, Any]]:
                yield from heldLocks(self.locks, key, monitor=self.monitor,
                                     waiters=waiters, holders=holders).items()
            return self.stream(request, jsonPieces(one()))
        return self.stream(request, jsonPieces(heldLocksParts(
            self.locks, limit, offset, self.monitor, waiters, holders)))

    def render_POST(self, request: Request) -> bytes:
        return self.forceRelease.render(request, self._path(request))
