# -*- test-case-name: tests.client.test_client -*-
"""
The Twisted client's C{async with client.lock(...)}.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Union

from twisted.internet.defer import Deferred

from lockservice.client.errors import ReleaseFailed
from lockservice.client.lock import Lock


class LockingClient(Protocol):
    log: Any

    def acquire(self, key: Union[str, bytes], lease: float, wait: float = 0,
                keepAlive: bool = False) -> "Deferred[Lock]": ...

    def release(self, lock: Lock) -> "Deferred[bool]": ...


class HeldLock:
    """
    C{async with client.lock(...) as lock}: acquired on entry, released on
    exit (a failed release is logged: the lease ends it).
    """

    def __init__(self, client: LockingClient, key: Union[str, bytes], lease: float,
                 wait: float, keepAlive: bool) -> None:
        self.client = client
        self.key = key
        self.lease = lease
        self.wait = wait
        self.keepAlive = keepAlive
        self.held: Optional[Lock] = None

    async def __aenter__(self) -> Lock:
        self.held = await self.client.acquire(self.key, self.lease, self.wait,
                                              keepAlive=self.keepAlive)
        return self.held

    async def __aexit__(self, *exc: object) -> None:
        if self.held is not None:
            try:
                await self.client.release(self.held)
            except ReleaseFailed:
                self.client.log.warn("could not release {lock}; its lease will", lock=self.held)
