# -*- test-case-name: tests.test_core -*-
"""
The lock table: holders, FIFO queues and fencing tokens.

Pure Python with no reactor: every call that depends on time is told the
current (monotonic) time, and answers with what must happen next.  The
service around it owns the clock and arms the timers.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Iterator, List, Optional, Tuple

MAX_TOKEN = 2**64 - 1


class TokenExhausted(Exception):
    """
    The u64 token space is used up; no further grant can be fenced.
    """


class TokenIssuer:
    """
    Issues fencing tokens: C{max(last + 1, now in microseconds)}.

    The clock term makes tokens rise across a restart without any state on
    disk; C{observe} folds in tokens learned from elsewhere (replication).
    """

    __slots__ = ("last", "_wallMicros")

    def __init__(self, wallMicros: Callable[[], int], last: int = 0) -> None:
        self._wallMicros = wallMicros
        self.last = last

    def issue(self) -> int:
        token = max(self.last + 1, self._wallMicros())
        if token > MAX_TOKEN:
            raise TokenExhausted("fencing token space exhausted")
        self.last = token
        return token

    def observe(self, token: int) -> None:
        if token > self.last:
            self.last = token


class Waiter:
    """
    One acquire request in a key's queue.

    C{owner} is opaque to the table: the service keeps there whatever it
    needs to answer the request later (a connection, a timer).
    """

    __slots__ = ("key", "lease", "owner", "queuedAt", "queued")

    def __init__(self, key: bytes, lease: float, owner: object = None) -> None:
        self.key = key
        self.lease = lease
        self.owner = owner
        self.queuedAt = 0.0
        self.queued = False


class Holder:
    """
    A held key: its current grant, and the FIFO queue of waiters (created
    only when someone waits, to keep an uncontended key small).

    The same object stays in the table while the key passes from grant to
    grant; its fields change at each hand-over.
    """

    __slots__ = ("token", "grantedAt", "expiresAt", "queue")

    def __init__(self, token: int, grantedAt: float, expiresAt: float) -> None:
        self.token = token
        self.grantedAt = grantedAt
        self.expiresAt = expiresAt
        self.queue: Optional[Deque[Waiter]] = None


class Grant:
    """
    A grant the service must deliver: answer C{waiter} (None for a grant
    made at once) with C{token}, and arm the lease timer for C{expiresAt}.
    """

    __slots__ = ("key", "token", "expiresAt", "waiter")

    def __init__(
        self, key: bytes, token: int, expiresAt: float, waiter: Optional[Waiter]
    ) -> None:
        self.key = key
        self.token = token
        self.expiresAt = expiresAt
        self.waiter = waiter


class LockTable:
    """
    Named, non-reentrant locks with FIFO queues and leases.

    A key has an entry only while it is held; a free key with waiters never
    exists because a release or expiry hands the key straight to the first
    waiter.
    """

    def __init__(self, tokens: TokenIssuer) -> None:
        self.tokens = tokens
        self._keys: Dict[bytes, Holder] = {}
        self.waiterCount = 0

    # -- queries ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def holder(self, key: bytes) -> Optional[Holder]:
        return self._keys.get(key)

    def queueLength(self, key: bytes) -> int:
        holder = self._keys.get(key)
        return len(holder.queue) if holder is not None and holder.queue else 0

    def holders(self) -> Iterator[Tuple[bytes, Holder]]:
        return iter(self._keys.items())

    # -- client operations -------------------------------------------------

    def acquire(self, waiter: Waiter, now: float) -> Optional[Grant]:
        """
        Grant C{waiter.key} at once if it is free, otherwise queue the waiter.

        @return: the grant, or None when the waiter was queued.
        """
        holder = self._keys.get(waiter.key)
        if holder is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            self._keys[waiter.key] = Holder(token, now, expiresAt)
            return Grant(waiter.key, token, expiresAt, None)
        waiter.queuedAt = now
        waiter.queued = True
        if holder.queue is None:
            holder.queue = deque()
        holder.queue.append(waiter)
        self.waiterCount += 1
        return None

    def release(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Release the grant C{token} of C{key}.

        @return: C{(released, next grant)}; C{released} is False when
            C{token} does not hold the key (a stale or unknown token).
        """
        holder = self._keys.get(key)
        if holder is None or holder.token != token:
            return False, None
        return True, self._handOver(key, holder, now)

    def expire(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Take C{key} back from grant C{token} when its lease has run out.

        @return: C{(expired, next grant)}; nothing happens (False) when the
            grant no longer holds the key or its lease has not run out.
        """
        holder = self._keys.get(key)
        if holder is None or holder.token != token or holder.expiresAt > now:
            return False, None
        return True, self._handOver(key, holder, now)

    def withdraw(self, waiter: Waiter) -> bool:
        """
        Remove a waiter from its queue (wait ran out, or its connection
        closed).

        @return: True if it was still waiting.
        """
        if not waiter.queued:
            return False
        waiter.queued = False
        queue = self._keys[waiter.key].queue
        assert queue is not None
        queue.remove(waiter)
        self.waiterCount -= 1
        return True

    def _handOver(self, key: bytes, holder: Holder, now: float) -> Optional[Grant]:
        if not holder.queue:
            del self._keys[key]
            return None
        token = self.tokens.issue()
        waiter = holder.queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        holder.token = token
        holder.grantedAt = now
        holder.expiresAt = now + waiter.lease
        return Grant(key, token, holder.expiresAt, waiter)

    # -- replication -------------------------------------------------------

    def install(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        Record a holder learned from the active node (a standby's mirror).
        Waiters are never replicated, so the mirror holds none.
        """
        self.tokens.observe(token)
        holder = self._keys.get(key)
        if holder is None:
            self._keys[key] = Holder(token, grantedAt, expiresAt)
        else:
            holder.token = token
            holder.grantedAt = grantedAt
            holder.expiresAt = expiresAt

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        holder = self._keys.get(key)
        if holder is not None and holder.token == token and not holder.queue:
            del self._keys[key]

    def takeWaiters(self) -> List[Waiter]:
        """
        Empty every queue (this node stops serving); holders stay.

        @return: the waiters that were queued, in queue order per key.
        """
        orphans: List[Waiter] = []
        for holder in self._keys.values():
            if holder.queue:
                for waiter in holder.queue:
                    waiter.queued = False
                    orphans.append(waiter)
                holder.queue = None
        self.waiterCount = 0
        return orphans

    def clear(self) -> None:
        """
        Forget every holder and waiter (a fresh snapshot follows).
        """
        self.takeWaiters()
        self._keys.clear()
