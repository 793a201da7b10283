# -*- test-case-name: tests.client.test_fencing -*-
"""
The resource side of fencing: the protected resource keeps the highest
token it has seen and refuses a write that carries a lower one.

A lock service without consensus can, inside a failover or partition
window, let two clients believe they hold the same key.  The protected
resource closes that gap by remembering the highest fencing token it has
accepted and refusing any lower one:

    guard = FenceGuard()
    guard.admit("account/7", lock.token)     # raises StaleToken if late

The same check in SQL, atomic in one statement:

    UPDATE accounts SET balance = :balance, last_token = :token
     WHERE id = :id AND last_token < :token;
    -- 0 rows updated: a newer holder already wrote; reject this writer.
"""

from __future__ import annotations

import threading
from typing import Dict, Hashable


class StaleToken(Exception):
    """
    A write carried a token lower than (or equal to) one already accepted.
    """

    def __init__(self, resource: Hashable, token: int, highest: int) -> None:
        super().__init__(f"token {token} for {resource!r} is stale; highest seen is {highest}")
        self.resource = resource
        self.token = token
        self.highest = highest


class FenceGuard:
    """
    Highest accepted token per resource.  Thread-safe, so a resource
    served by threads (a database adapter, a file writer) can share one.
    """

    def __init__(self) -> None:
        self._highest: Dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def admit(self, resource: Hashable, token: int, allowEqual: bool = True) -> None:
        """
        Accept an access carrying C{token}, or raise L{StaleToken}.

        @param allowEqual: accept the current highest token again (the same
            holder writing twice); set False to demand a strictly higher token
            on every access.
        """
        with self._lock:
            highest = self._highest.get(resource, -1)
            if token < highest or (token == highest and not allowEqual):
                raise StaleToken(resource, token, highest)
            self._highest[resource] = token

    def check(self, resource: Hashable, token: int) -> bool:
        """
        Like L{admit}, answering True or False instead of raising.
        """
        try:
            self.admit(resource, token)
        except StaleToken:
            return False
        return True

    def highest(self, resource: Hashable) -> int:
        """
        The highest token accepted for C{resource}, or -1.
        """
        with self._lock:
            return self._highest.get(resource, -1)
