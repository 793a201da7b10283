# -*- test-case-name: tests.core.test_core -*-
"""
The lock table: holders, FIFO queues and fencing tokens.

Pure Python with no reactor: every call that depends on time is told the
current (monotonic) time, and answers with what must happen next.  The
service around it owns the clock and arms the timers.
"""

from __future__ import annotations

from array import array
from typing import List, Optional, Tuple

from lockservice.core.holder import Holder, StaleHolder
from lockservice.core.lockdelay import LockDelay
from lockservice.core.replica import Change, Replica
from lockservice.core.shares import (
    EXCLUSIVE,
    READ,
    READ_WRITE,
    ShareMismatch,
    describeKind,
    fitTogether,
    kindOf,
)
from lockservice.core.slots import LIVE, _Key
from lockservice.core.tokens import MAX_TOKEN, TokenExhausted, TokenIssuer
from lockservice.core.views import TableViews
from lockservice.core.waiters import Waiter, WaitQueue, nameOf

__all__ = [
    "MAX_TOKEN", "Change", "EXCLUSIVE", "READ", "READ_WRITE", "Grant", "HandOverFailed",
    "Holder", "LockTable", "ShareMismatch", "StaleHolder", "TokenExhausted", "TokenIssuer",
    "WaitQueue", "Waiter", "describeKind", "fitTogether", "kindOf", "nameOf",
]


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


# What release and expire answer when nothing is handed over.
_NOT_HELD: Tuple[bool, Optional[Grant]] = (False, None)
_FREED: Tuple[bool, Optional[Grant]] = (True, None)


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


class LockTable(Replica, LockDelay, TableViews):
    """
    Named, non-reentrant locks with FIFO queues and leases.

    A key has an entry only while it is held; a free key with waiters never
    exists because a release or expiry hands the key straight to the first
    waiter.  Every operation costs O(1) whatever the queue lengths (O(log
    n) in the grants of a shared key).

    A key is held by its grants: one exclusive grant, or several readers
    of a read-write key, or up to n grants of a semaphore of n.  Grants
    are stored as a structure of arrays, because a held key's memory is
    what limits how many a node can hold: each grant has a slot, and slot
    C{i} of three typed arrays holds its token and times (unboxed, 24
    bytes), of one list its client (or a L{_GrantInfo} for the few grants
    that were renewed or expired), and of another its holder name.
    C{_keys} maps each key to the slot of its grant that runs out first,
    which every per-key query shows; a key with more than one exclusive
    grant (readers, a semaphore) or with waiters also has a L{_Key} in
    C{_records} (its grants, queue and kind).  So a key held by one
    exclusive grant with nobody waiting costs its dict entry and its slot
    and nothing else: no object per held key, nothing the garbage
    collector tracks (a full collection does not walk a million held
    keys).  An ended grant's slot goes to a free list and is reused by the
    next grant (the tables never shrink).  L{holder} gives a short-lived
    L{Holder} view of one grant.
    """

    def _admit(self, key: bytes, record: _Key, now: float, slot: int) -> Grant:
        """
        Grant C{key} to its first waiter (it fits), in C{slot} (the key's
        own, when its last grant ended) or a free or new one (-1).

        @raise HandOverFailed: no token left: every waiter of the key was
            taken out of its queue (its grants stay; a key without any is
            freed).
        """
        try:
            token = self.tokens.issue()
        except TokenExhausted:
            raise HandOverFailed(self._unqueue(key, record)) from None
        queue = record.queue
        assert queue is not None
        waiter = queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        share = waiter.share
        if share != record.share:  # (a hand-over: writer to readers, or back)
            record.share, record.kind = share, kindOf(share)
        expiresAt = now + waiter.lease
        self._place(key, record, slot, token, now, expiresAt, waiter.client())
        head = queue.head
        if head is None:
            record.queue = None
            if share == EXCLUSIVE:
                del self._records[key]  # one exclusive grant: the plain form
        elif share != EXCLUSIVE and record.fits(head.share):
            self.pending[key] = None
        return Grant(key, token, expiresAt, waiter)

    def _unqueue(self, key: bytes, record: _Key) -> List[Waiter]:
        queue = record.queue
        orphans = list(queue) if queue is not None else []
        for waiter in orphans:
            waiter.queued = False
            waiter.prev = waiter.next = None
        self.waiterCount -= len(orphans)
        self._settle(key, record)
        return orphans

    def _dequeued(self, key: bytes, record: _Key, head: bool) -> None:
        # Waiters were taken out of the queue (the first one among them
        # when head): the next one may fit now.
        queue = record.queue
        assert queue is not None
        if not queue.length:
            self._settle(key, record)
        elif head:
            self._letIn(key, record)

    def nextPending(self) -> Optional[bytes]:
        """
        A key whose first waiter fits beside its holders now (a run of
        readers, a semaphore with free slots), or None: grant its waiters
        with L{grantHead}, a bounded number per reactor turn.
        """
        pending = self.pending
        while pending:
            key = next(iter(pending))
            record = self._records.get(key)
            if record is not None and self._headFits(record):
                return key
            del pending[key]
        return None

    def grantHead(self, key: bytes, now: float) -> Optional[Grant]:
        """
        Grant C{key}'s first waiter if it fits beside the holders (see
        L{nextPending}); the key stays pending while the next one fits too.

        @return: the grant, or None when the first waiter does not fit
            (or nobody waits).
        @raise HandOverFailed: no token left: every waiter of the key was
            taken out of its queue (its holders stay).
        """
        record = self._records.get(key)
        if record is None or not self._headFits(record):
            self.pending.pop(key, None)
            return None
        try:
            # Beside the key's grants, or in its slot kept for the next one.
            grant = self._admit(key, record, now, -1 if record.grants else self._keys[key])
        except HandOverFailed:
            self.pending.pop(key, None)
            raise
        if not self._headFits(record):
            self.pending.pop(key, None)
        return grant

    # -- client operations -------------------------------------------------

    def acquire(self, waiter: Waiter, now: float) -> Optional[Grant]:
        """
        Grant C{waiter.key} at once if it is free (or the waiter fits
        beside its holders, and nobody waits), otherwise queue the waiter.

        @return: the grant, or None when the waiter was queued.
        @raise TokenExhausted: no token left; nothing changed.
        @raise ShareMismatch: the waiter's share does not match the key's
            kind; nothing changed.
        """
        key, share = waiter.key, waiter.share
        slot = self._keys.get(key)
        if slot is None:  # a free key: its first grant
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            record = None if share == EXCLUSIVE else self._newRecord(key, share)
            self._place(key, record, -1, token, now, expiresAt, waiter.client())
            return Grant(key, token, expiresAt, None)
        record = self._records.get(key)
        if record is None:
            if share > EXCLUSIVE:
                raise ShareMismatch(key, READ_WRITE)
            record = self._recordOf(key, slot)
        # (An exclusive acquire of a read-write key always matches.)
        elif (share != EXCLUSIVE or record.kind != READ_WRITE) and \
                kindOf(share) != record.kind:
            raise ShareMismatch(key, record.kind)
        queue = record.queue
        if queue is not None or not record.fits(share):
            waiter.queuedAt = now
            waiter.queued = True
            if queue is None:
                queue = record.queue = WaitQueue()
            queue.append(waiter)
            self.waiterCount += 1
            return None
        token = self.tokens.issue()  # it fits beside the key's grants
        expiresAt = now + waiter.lease
        self._place(key, record, -1, token, now, expiresAt, waiter.client())
        return Grant(key, token, expiresAt, None)

    def release(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Release the grant C{token} of C{key}.

        @return: C{(released, next grant)}; C{released} is False when
            C{token} does not hold the key (a stale or unknown token).
        @raise HandOverFailed: released, but the waiters could not be served.
        """
        slot = self._keys.get(key)
        if slot is None:
            return _NOT_HELD
        if key not in self._records:
            if self._tokens[slot] != token:
                return _NOT_HELD
            del self._keys[key]  # nobody waits, one grant: the common case
            self._freeSlot(slot)
            return _FREED
        record = self._records[key]
        grants = record.grants
        if len(grants) == 1 and record.queue is not None and token in grants:
            # Its last grant: the key (and its slot) goes to the first waiter.
            del grants[token]
            if record.share != EXCLUSIVE:
                self.sharedGrants -= 1
            return True, self._admit(key, record, now, slot)
        return _FREED if self._forget(key, token) else _NOT_HELD

    def expire(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Take C{key} back from grant C{token} when its lease has run out.

        @return: C{(expired, next grant)}; nothing happens (False) when the
            grant no longer holds the key or its lease has not run out.
        @raise HandOverFailed: expired, but the waiters could not be served.
        """
        expiresAt = self.leaseOf(key, token)
        if expiresAt is None or expiresAt > now:
            return _NOT_HELD
        return self.release(key, token, now)

    def renew(self, key: bytes, token: int, lease: float, now: float) -> Optional[Holder]:
        """
        Extend the grant C{token} of C{key}: its lease runs C{lease} seconds
        from C{now}; the token does not change.

        @return: a view of the grant, or None (nothing changed) when
            C{token} does not hold the key, or its lease has already run out.
        """
        slot = self._slotOf(key, token)
        if slot < 0 or self._expires[slot] <= now or self._stateAt(slot) is not LIVE:
            return None
        self._move(key, slot, token, now + lease)
        self._infoAt(slot).renewals += 1
        return Holder(self, key, token)

    def withdraw(self, waiter: Waiter) -> bool:
        """
        Remove a waiter from its queue (wait ran out, or its connection
        closed): O(1).

        @return: True if it was still waiting.
        """
        if not waiter.queued:
            return False
        waiter.queued = False
        record = self._records[waiter.key]
        assert record.queue is not None
        head = waiter.prev is None
        record.queue.remove(waiter)
        self.waiterCount -= 1
        self._dequeued(waiter.key, record, head)
        return True

    def cut(self, key: bytes, first: Waiter, last: Waiter, count: int) -> None:
        """
        Take the C{count} consecutive waiters C{first} .. C{last} out of
        C{key}'s queue at once, O(1) (a closed connection's pipelined
        acquires).  They stay marked C{queued}: whoever cut them withdraws
        them later, one by one, without the table.
        """
        record = self._records[key]
        assert record.queue is not None
        head = first.prev is None
        record.queue.cut(first, last, count)
        self.waiterCount -= count
        self._dequeued(key, record, head)

    def takeWaiters(self) -> List[Waiter]:
        """
        Empty every queue (this node stops serving); holders stay.

        @return: the waiters that were queued, in queue order per key.
        """
        orphans: List[Waiter] = []
        records = self._records
        for key in list(self._keys):
            record = records.get(key)
            if record is not None and record.queue is not None:
                orphans.extend(self._unqueue(key, record))
        self.waiterCount = 0
        self.pending.clear()
        return orphans

    def clear(self) -> None:
        """
        Forget every holder and waiter (a fresh snapshot follows).
        """
        self.takeWaiters()
        self.sharedGrants = 0
        self._keys.clear()
        self._records.clear()
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients = []
        self._names = []
        self._free = []
