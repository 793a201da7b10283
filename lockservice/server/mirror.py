# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The interface the cluster layer drives: tokens, where redirects point, and
the mirror a standby keeps of the active's grants (applied by replication,
or merged on a heal).

Replicated changes come in batches (one read of a peer link, one chunk of
a snapshot, one run of a heal's offer): L{Mirroring.mirror} applies a
batch in one loop and tells the mirror observers once per batch
(L{lockservice.server.observers.MirrorObserver}), so a grant merged on a
heal reaches the metrics, the operator's view and the active's own
standbys, and a standby's cost per line stays one table call.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from twisted.internet.interfaces import IReactorTime

from lockservice.core.table import EXCLUSIVE, Change, Holder, LockTable
from lockservice.server.deadlines import LeaseDeadlines
from lockservice.server.groups import GroupService
from lockservice.server.modes import FROZEN, SERVING
from lockservice.server.observers import Observers
from lockservice.server.observing import KeyObservers
from lockservice.server.stats import Stats
from lockservice.server.timers import Timers

__all__ = ["Change", "Mirroring"]


class Mirroring:
    """
    Part of L{lockservice.server.service.LockService}: what replication
    and the election call.
    """

    table: LockTable
    clock: IReactorTime
    mode: str
    activeAddress: Optional[bytes]
    leases: LeaseDeadlines
    timers: "Timers[Any]"
    notify: Observers
    stats: Stats
    observing: KeyObservers
    groups: GroupService
    _observed: Dict[bytes, Any]

    def setActiveAddress(self, activeAddress: Optional[bytes]) -> None:
        """
        Where redirects (C{M}) point while this node is not active.
        """
        self.activeAddress = activeAddress

    def lastToken(self) -> int:
        """
        The highest fencing token this node has issued or learned.
        """
        return self.table.tokens.last

    def observeToken(self, token: int) -> None:
        """
        Fold in a token learned from a peer (tokens must rise cluster-wide).
        """
        self.table.tokens.observe(token)

    def heldKeys(self) -> Iterator[Tuple[bytes, Holder]]:
        """
        Every held key with a view of its current grant (read each at once:
        a view of a grant that has ended raises
        L{lockservice.core.table.StaleHolder}).
        """
        return self.table.holders()

    def heldCount(self) -> int:
        return len(self.table)

    def installHolder(self, key: bytes, token: int, remaining: float, age: float = 0.0,
                      share: int = EXCLUSIVE, name: Optional[bytes] = None,
                      delayed: bool = False) -> None:
        """
        Mirror a grant learned by replication (or, on an active node, merged
        on a heal, or saved by a restart): C{key} held by C{token} for
        C{remaining} more seconds, granted C{age} seconds ago, shared as
        C{share}, by the holder named C{name}; C{delayed}: a place kept by
        the lock-delay for C{remaining} more seconds.
        """
        now = self.clock.seconds()
        self.table.install(key, token, now - age, now + remaining, share, name, delayed)
        if self.mode == SERVING:
            self.timers.fileLease(key, token, now + remaining, self.table.isShared(key))
        elif self.mode == FROZEN:
            # Armed when it serves again.
            self.leases.file(key, token, now + remaining, self.table.isShared(key))

    def mirror(self, changes: List[Change]) -> None:
        """
        Apply a batch of replicated changes, in order (a standby's read of
        its active's stream, a snapshot's chunk; on an active node, what
        it merges on a heal), then tell the mirror observers once.  On an
        active node the grants' leases run here (each counted in
        C{stats.merged}); a standby only mirrors them.
        """
        table = self.table
        install, drop = table.install, table.drop
        mode = self.mode
        if mode == SERVING or mode == FROZEN:
            fileLease = self.timers.fileLease if mode == SERVING else self.leases.file
            merged = 0
            for key, token, grantedAt, expiresAt, share, name, delayed in changes:
                if expiresAt is None:
                    drop(key, token)
                    continue
                install(key, token, grantedAt, expiresAt, share, name, delayed)
                # (Armed when a frozen node serves again.)
                fileLease(key, token, expiresAt, table.isShared(key))
                merged += 1
            self.stats.merged += merged
            observed = self._observed
            if observed:
                for key in {change[0] for change in changes if change[0] in observed}:
                    self.observing.changed(key)
        else:
            table.mirrorAll(changes)
        if self.notify.mirrors:
            self.notify.mirrored(self.clock.seconds(), changes)

    def dropHolder(self, key: bytes, token: int) -> None:
        """
        Mirror a release or expiry learned by replication.
        """
        self.table.drop(key, token)

    def clearHolders(self) -> None:
        """
        Forget every held key and every group (a full snapshot follows).
        """
        self.table.clear()
        self.groups.registry.clear()
