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
    The grant currently holding a key.
    """

    __slots__ = ("token", "grantedAt", "expiresAt")

    def __init__(self, token: int, grantedAt: float, expiresAt: float) -> None:
        self.token = token
        self.grantedAt = grantedAt
        self.expiresAt = expiresAt


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


class _KeyState:
    __slots__ = ("holder", "queue")

    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        self.queue: Deque[Waiter] = deque()


class LockTable:
    """
    Named, non-reentrant locks with FIFO queues and leases.

    A key has an entry only while it is held; a free key with waiters never
    exists because a release or expiry hands the key straight to the first
    waiter.
    """

    def __init__(self, tokens: TokenIssuer) -> None:
        self.tokens = tokens
        self._keys: Dict[bytes, _KeyState] = {}
        self.waiterCount = 0

    # -- queries ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def holder(self, key: bytes) -> Optional[Holder]:
        state = self._keys.get(key)
        return state.holder if state is not None else None

    def queueLength(self, key: bytes) -> int:
        state = self._keys.get(key)
        return len(state.queue) if state is not None else 0

    def holders(self) -> Iterator[Tuple[bytes, Holder]]:
        for key, state in self._keys.items():
            yield key, state.holder

    def waiters(self, key: bytes) -> List[Waiter]:
        state = self._keys.get(key)
        return list(state.queue) if state is not None else []

    # -- client operations -------------------------------------------------

    def acquire(self, waiter: Waiter, now: float) -> Optional[Grant]:
        """
        Grant C{waiter.key} at once if it is free, otherwise queue the waiter.

        @return: the grant, or None when the waiter was queued.
        """
        state = self._keys.get(waiter.key)
        if state is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            self._keys[waiter.key] = _KeyState(Holder(token, now, expiresAt))
            return Grant(waiter.key, token, expiresAt, None)
        waiter.queuedAt = now
        waiter.queued = True
        state.queue.append(waiter)
        self.waiterCount += 1
        return None

    def release(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Release the grant C{token} of C{key}.

        @return: C{(released, next grant)}; C{released} is False when
            C{token} does not hold the key (a stale or unknown token).
        """
        state = self._keys.get(key)
        if state is None or state.holder.token != token:
            return False, None
        return True, self._handOver(key, state, now)

    def expire(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Take C{key} back from grant C{token} when its lease has run out.

        @return: C{(expired, next grant)}; nothing happens (False) when the
            grant no longer holds the key or its lease has not run out.
        """
        state = self._keys.get(key)
        if state is None or state.holder.token != token or state.holder.expiresAt > now:
            return False, None
        return True, self._handOver(key, state, now)

    def withdraw(self, waiter: Waiter) -> bool:
        """
        Remove a waiter from its queue (wait ran out, or its connection
        closed).

        @return: True if it was still waiting.
        """
        if not waiter.queued:
            return False
        waiter.queued = False
        self._keys[waiter.key].queue.remove(waiter)
        self.waiterCount -= 1
        return True

    def _handOver(self, key: bytes, state: _KeyState, now: float) -> Optional[Grant]:
        if not state.queue:
            del self._keys[key]
            return None
        token = self.tokens.issue()
        waiter = state.queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        expiresAt = now + waiter.lease
        state.holder = Holder(token, now, expiresAt)
        return Grant(key, token, expiresAt, waiter)

    # -- replication -------------------------------------------------------

    def install(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        Record a holder learned from the active node (a standby's mirror).
        Waiters are never replicated, so the mirror holds none.
        """
        self.tokens.observe(token)
        state = self._keys.get(key)
        if state is None:
            self._keys[key] = _KeyState(Holder(token, grantedAt, expiresAt))
        else:
            state.holder = Holder(token, grantedAt, expiresAt)

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        state = self._keys.get(key)
        if state is not None and state.holder.token == token and not state.queue:
            del self._keys[key]

    def takeWaiters(self) -> List[Waiter]:
        """
        Empty every queue (this node stops serving); holders stay.

        @return: the waiters that were queued, in queue order per key.
        """
        orphans: List[Waiter] = []
        for state in self._keys.values():
            for waiter in state.queue:
                waiter.queued = False
                orphans.append(waiter)
            state.queue.clear()
        self.waiterCount = 0
        return orphans

    def clear(self) -> None:
        """
        Forget every holder and waiter (a fresh snapshot follows).
        """
        self.takeWaiters()
        self._keys.clear()
