# -*- test-case-name: tests.test_core -*-
"""
The lock table: holders, FIFO queues and fencing tokens.

Pure Python with no reactor: every call that depends on time is told the
current (monotonic) time, and answers with what must happen next.  The
service around it owns the clock and arms the timers.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Tuple

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

    The table links queued waiters into an intrusive doubly linked list
    (C{prev}/C{next}), so withdrawing any one of them costs O(1) however
    long its queue is.

    @ivar key: the key asked for.
    @ivar lease: the lease (seconds) the grant will run for.
    @ivar queuedAt: (monotonic) time it joined the queue.
    @ivar queued: True while it is in a queue.
    """

    __slots__ = ("key", "lease", "queuedAt", "queued", "prev", "next")

    def __init__(self, key: bytes, lease: float) -> None:
        self.key = key
        self.lease = lease
        self.queuedAt = 0.0
        self.queued = False
        self.prev: Optional[Waiter] = None
        self.next: Optional[Waiter] = None

    def holderName(self) -> Optional[str]:
        """
        Who will hold the key if this waiter is granted (recorded on the
        L{Holder}); the service's waiters name their connection.
        """
        return None


class WaitQueue:
    """
    The FIFO queue of a held key: a doubly linked list of L{Waiter}s.

    @ivar head: the first waiter (next to be granted), or None.
    @ivar tail: the last waiter, or None.
    @ivar length: how many waiters are queued.
    """

    __slots__ = ("head", "tail", "length")

    def __init__(self) -> None:
        self.head: Optional[Waiter] = None
        self.tail: Optional[Waiter] = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Waiter]:
        waiter = self.head
        while waiter is not None:
            following = waiter.next
            yield waiter
            waiter = following

    def append(self, waiter: Waiter) -> None:
        waiter.prev = self.tail
        waiter.next = None
        if self.tail is None:
            self.head = waiter
        else:
            self.tail.next = waiter
        self.tail = waiter
        self.length += 1

    def remove(self, waiter: Waiter) -> None:
        """
        Unlink C{waiter}, which must be in this queue: O(1).
        """
        self.cut(waiter, waiter, 1)
        waiter.prev = waiter.next = None

    def cut(self, first: Waiter, last: Waiter, count: int) -> None:
        """
        Unlink the C{count} consecutive waiters C{first} .. C{last} at once:
        O(1).  Their own links are left as they are (nobody follows them).
        """
        before, after = first.prev, last.next
        if before is None:
            self.head = after
        else:
            before.next = after
        if after is None:
            self.tail = before
        else:
            after.prev = before
        self.length -= count

    def popleft(self) -> Waiter:
        waiter = self.head
        assert waiter is not None
        self.remove(waiter)
        return waiter


class _Extra:
    """
    What only some held keys need: a renewal count, a queue of waiters.
    """

    __slots__ = ("renewals", "queue")

    def __init__(self) -> None:
        self.renewals = 0
        self.queue: Optional[WaitQueue] = None


class Holder:
    """
    A held key: its current grant, and the FIFO queue of waiters.

    The same object stays in the table while the key passes from grant to
    grant; its fields change at each hand-over.  These attributes are
    public (the status pages, events and deadlock detection read them):

    @ivar token: the fencing token of the current grant.
    @ivar grantedAt: (monotonic) time of the current grant.
    @ivar expiresAt: (monotonic) time its lease runs out; a renewal moves it.
    @ivar owner: who holds it: the holding connection's name (sent with
        C{I}) or its peer address, as one shared C{str} per connection, or
        None when unknown (a grant learned by replication).
    @ivar renewals: how many times the current grant was renewed.
    @ivar queue: the waiters, or None when nobody waits.
    """

    # A held key costs RSS: four slots (64 bytes with the GC header), the
    # two times in one complex (one 32-byte object instead of two floats
    # of 32 bytes each), and the renewal count and queue in an L{_Extra}
    # made only for a key that was renewed or is waited for.
    __slots__ = ("token", "_times", "owner", "_extra")

    def __init__(
        self, token: int, grantedAt: float, expiresAt: float, owner: Optional[str] = None
    ) -> None:
        self.token = token
        self._times = complex(grantedAt, expiresAt)
        self.owner = owner
        self._extra: Optional[_Extra] = None

    @property
    def grantedAt(self) -> float:
        return self._times.real

    @property
    def expiresAt(self) -> float:
        return self._times.imag

    @expiresAt.setter
    def expiresAt(self, expiresAt: float) -> None:
        self._times = complex(self._times.real, expiresAt)

    def regrant(self, token: int, grantedAt: float, expiresAt: float,
                owner: Optional[str]) -> None:
        """
        The key passes to a new grant: its renewal count starts again.
        """
        self.token = token
        self._times = complex(grantedAt, expiresAt)
        self.owner = owner
        extra = self._extra
        if extra is not None:
            extra.renewals = 0
            if extra.queue is None:
                self._extra = None

    @property
    def renewals(self) -> int:
        extra = self._extra
        return extra.renewals if extra is not None else 0

    def renewed(self) -> None:
        extra = self._extra
        if extra is None:
            extra = self._extra = _Extra()
        extra.renewals += 1

    @property
    def queue(self) -> Optional[WaitQueue]:
        extra = self._extra
        return extra.queue if extra is not None else None

    @queue.setter
    def queue(self, queue: Optional[WaitQueue]) -> None:
        extra = self._extra
        if extra is None:
            if queue is None:
                return
            extra = self._extra = _Extra()
        extra.queue = queue
        if queue is None and not extra.renewals:
            self._extra = None

    def waiters(self) -> Iterator[Waiter]:
        """
        The queued waiters, first to be granted first.
        """
        queue = self.queue
        return iter(queue) if queue is not None else iter(())

    @property
    def waiting(self) -> int:
        """
        How many waiters are queued.
        """
        queue = self.queue
        return queue.length if queue is not None else 0


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


class HandOverFailed(Exception):
    """
    A release or expiry took effect (the key is free), but no token could be
    issued for the next waiter (L{TokenExhausted}): every waiter of the key
    was taken out of the queue and must be answered with an error.

    @ivar waiters: those waiters, in queue order.
    """

    def __init__(self, waiters: List[Waiter]) -> None:
        super().__init__("fencing token space exhausted")
        self.waiters = waiters


class LockTable:
    """
    Named, non-reentrant locks with FIFO queues and leases.

    A key has an entry only while it is held; a free key with waiters never
    exists because a release or expiry hands the key straight to the first
    waiter.  Every operation costs O(1) whatever the queue lengths.
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
        return holder.waiting if holder is not None else 0

    def holders(self) -> Iterator[Tuple[bytes, Holder]]:
        return iter(self._keys.items())

    # -- client operations -------------------------------------------------

    def acquire(self, waiter: Waiter, now: float) -> Optional[Grant]:
        """
        Grant C{waiter.key} at once if it is free, otherwise queue the waiter.

        @return: the grant, or None when the waiter was queued.
        @raise TokenExhausted: no token left; nothing changed.
        """
        holder = self._keys.get(waiter.key)
        if holder is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            self._keys[waiter.key] = Holder(token, now, expiresAt, waiter.holderName())
            return Grant(waiter.key, token, expiresAt, None)
        waiter.queuedAt = now
        waiter.queued = True
        if holder.queue is None:
            holder.queue = WaitQueue()
        holder.queue.append(waiter)
        self.waiterCount += 1
        return None

    def release(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Release the grant C{token} of C{key}.

        @return: C{(released, next grant)}; C{released} is False when
            C{token} does not hold the key (a stale or unknown token).
        @raise HandOverFailed: released, but the waiters could not be served.
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
        @raise HandOverFailed: expired, but the waiters could not be served.
        """
        holder = self._keys.get(key)
        if holder is None or holder.token != token or holder.expiresAt > now:
            return False, None
        return True, self._handOver(key, holder, now)

    def renew(self, key: bytes, token: int, lease: float, now: float) -> Optional[Holder]:
        """
        Extend the grant C{token} of C{key}: its lease runs C{lease} seconds
        from C{now}; the token does not change.

        @return: the holder, or None (nothing changed) when C{token} does not
            hold the key, or its lease has already run out.
        """
        holder = self._keys.get(key)
        if holder is None or holder.token != token or holder.expiresAt <= now:
            return None
        holder.expiresAt = now + lease
        holder.renewed()
        return holder

    def withdraw(self, waiter: Waiter) -> bool:
        """
        Remove a waiter from its queue (wait ran out, or its connection
        closed): O(1).

        @return: True if it was still waiting.
        """
        if not waiter.queued:
            return False
        waiter.queued = False
        holder = self._keys[waiter.key]
        queue = holder.queue
        assert queue is not None
        queue.remove(waiter)
        if not queue.length:
            holder.queue = None
        self.waiterCount -= 1
        return True

    def cut(self, key: bytes, first: Waiter, last: Waiter, count: int) -> None:
        """
        Take the C{count} consecutive waiters C{first} .. C{last} out of
        C{key}'s queue at once, O(1) (a closed connection's pipelined
        acquires).  They stay marked C{queued}: whoever cut them withdraws
        them later, one by one, without the table.
        """
        holder = self._keys[key]
        queue = holder.queue
        assert queue is not None
        queue.cut(first, last, count)
        if not queue.length:
            holder.queue = None
        self.waiterCount -= count

    def _handOver(self, key: bytes, holder: Holder, now: float) -> Optional[Grant]:
        # The slot itself, not the property: this runs at every release.
        extra = holder._extra
        queue = extra.queue if extra is not None else None
        if queue is None:
            del self._keys[key]
            return None
        try:
            token = self.tokens.issue()
        except TokenExhausted:
            # Never leave the key held by a grant that ended: free it and
            # give the waiters back to be answered.
            del self._keys[key]
            orphans = self._unqueue(holder)
            raise HandOverFailed(orphans) from None
        waiter = queue.popleft()
        if not queue.length:
            holder.queue = None
        waiter.queued = False
        self.waiterCount -= 1
        expiresAt = now + waiter.lease
        holder.regrant(token, now, expiresAt, waiter.holderName())
        return Grant(key, token, expiresAt, waiter)

    def _unqueue(self, holder: Holder) -> List[Waiter]:
        orphans = list(holder.waiters())
        for waiter in orphans:
            waiter.queued = False
            waiter.prev = waiter.next = None
        self.waiterCount -= len(orphans)
        holder.queue = None
        return orphans

    # -- replication -------------------------------------------------------

    def install(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        Record a holder learned from the active node (a standby's mirror).
        Waiters are never replicated, so the mirror holds none.  Installing
        the token that already holds the key only moves its expiry.
        """
        self.tokens.observe(token)
        holder = self._keys.get(key)
        if holder is None:
            self._keys[key] = Holder(token, grantedAt, expiresAt)
        elif holder.token == token:
            # The same grant again (a renewal, or a new snapshot): it keeps
            # the time it was first seen granted.
            holder.expiresAt = expiresAt
        else:
            holder.regrant(token, grantedAt, expiresAt, None)

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        holder = self._keys.get(key)
        if holder is not None and holder.token == token and holder.queue is None:
            del self._keys[key]

    def takeWaiters(self) -> List[Waiter]:
        """
        Empty every queue (this node stops serving); holders stay.

        @return: the waiters that were queued, in queue order per key.
        """
        orphans: List[Waiter] = []
        for holder in self._keys.values():
            if holder.queue is not None:
                orphans.extend(self._unqueue(holder))
        self.waiterCount = 0
        return orphans

    def clear(self) -> None:
        """
        Forget every holder and waiter (a fresh snapshot follows).
        """
        self.takeWaiters()
        self._keys.clear()
