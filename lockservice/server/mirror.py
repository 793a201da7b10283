# -*- test-case-name: tests.test_cluster_unit -*-
"""
The interface the cluster layer drives: tokens, where redirects point, and
the mirror a standby keeps of the active's grants (applied by replication,
or merged on a heal).
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

from twisted.internet.interfaces import IReactorTime

from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.core.table import EXCLUSIVE, Holder, LockTable
from lockservice.server.deadlines import LeaseDeadlines


class Mirroring:
    """
    Part of L{lockservice.server.service.LockService}: what replication
    and the election call.
    """

    table: LockTable
    clock: IReactorTime
    role: str
    activeAddress: Optional[bytes]
    leases: LeaseDeadlines

    def _fileLease(self, key: bytes, token: int, expiresAt: float, shared: bool) -> None:
        raise NotImplementedError

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
                      share: int = EXCLUSIVE) -> None:
        """
        Mirror a grant learned by replication (or, on an active node, merged
        on a heal): C{key} held by C{token} for C{remaining} more seconds,
        granted C{age} seconds ago, shared as C{share}.
        """
        now = self.clock.seconds()
        self.table.install(key, token, now - age, now + remaining, share)
        if self.role == ACTIVE:
            self._fileLease(key, token, now + remaining, self.table.isShared(key))
        elif self.role == HANDING_OFF:
            # Armed when it serves again.
            self.leases.file(key, token, now + remaining, self.table.isShared(key))

    def dropHolder(self, key: bytes, token: int) -> None:
        """
        Mirror a release or expiry learned by replication.
        """
        self.table.drop(key, token)

    def clearHolders(self) -> None:
        """
        Forget every held key (a full snapshot follows).
        """
        self.table.clear()
