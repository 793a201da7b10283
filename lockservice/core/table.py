# -*- test-case-name: tests.test_core -*-
"""
The lock table: holders, FIFO queues and fencing tokens.

Pure Python with no reactor: every call that depends on time is told the
current (monotonic) time, and answers with what must happen next.  The
service around it owns the clock and arms the timers.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappop, heappush
from itertools import islice
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from lockservice.core.shares import (
    EXCLUSIVE,
    READ,
    READ_WRITE,
    ShareMismatch,
    describeKind,
    fits,
    fitTogether,
    kindOf,
)
from lockservice.core.tokens import MAX_TOKEN, TokenExhausted, TokenIssuer
from lockservice.core.waiters import Waiter, WaitQueue, nameOf

__all__ = [
    "MAX_TOKEN", "Change", "EXCLUSIVE", "READ", "READ_WRITE", "Grant", "HandOverFailed",
    "Holder", "LockTable", "ShareMismatch", "StaleHolder", "TokenExhausted", "TokenIssuer",
    "WaitQueue", "Waiter", "describeKind", "fitTogether", "kindOf", "nameOf",
]

# One replicated change (a standby's stream, a snapshot, a heal's merge):
# (key, token, grantedAt, expiresAt, share, name, delayed) of a grant, its
# holder name, and whether it is a place kept after its expiry (then
# expiresAt is when that place frees: see the lock-delay); expiresAt None
# for the end of grant C{token}.
Change = Tuple[bytes, int, float, Optional[float], int, Optional[bytes], bool]


# A grant's state: LIVE holds its key; KEPT expired and only keeps its
# place until the lock-delay ends (its expiry is then that end; see
# LockTable.startDelay); ENDED is a key's last slot whose grant a heal
# dropped while waiters wait, kept for the grant the heal installs next.
LIVE = "live"
KEPT = "kept"
ENDED = "ended"


class _GrantInfo:
    """
    What only some grants need besides their client: a renewal count, or
    a state other than L{LIVE}.  Kept in the table's client column in
    place of the bare client, for a grant that was renewed or expired.
    """

    __slots__ = ("client", "renewals", "state")

    def __init__(self, client: object) -> None:
        self.client = client
        self.renewals = 0
        self.state = LIVE


class _Key:
    """
    What a key has beyond one exclusive grant: readers or a semaphore's
    grants, or waiters.  Kept in the table's C{_records} for such a key;
    a key held by one exclusive grant with nobody waiting has none (the
    slot of its grant is all it costs).

    @ivar kind: L{READ_WRITE}, or the semaphore's slot count: fixed while
        the key is held or waited for.
    @ivar share: how every grant of the key holds it, all alike:
        L{EXCLUSIVE} (then it has one), L{READ}, or the slot count.
    @ivar grants: token -> slot of each grant (and place kept by the
        lock-delay), in the order they were made.
    @ivar heap: C{(expiresAt, token)} of every grant, plus stale entries of
        grants ended or moved since (skipped when they come up): the grant
        that runs out first in O(log n).
    @ivar queue: the waiters, or None when nobody waits.
    """

    __slots__ = ("kind", "share", "grants", "heap", "queue")

    def __init__(self, share: int) -> None:
        self.kind = kindOf(share)
        self.share = share
        self.grants: Dict[int, int] = {}
        self.heap: List[Tuple[float, int]] = []
        self.queue: Optional[WaitQueue] = None

    def fits(self, share: int) -> bool:
        """
        Whether an acquire of C{share} fits beside the key's grants.
        """
        return fits(self.share, len(self.grants), share)


class StaleHolder(LookupError):
    """
    A L{Holder} view was read after the grant it shows had ended (released,
    expired, handed over): read the table again.
    """


class Holder:
    """
    A short-lived view of one grant of a held key, read from (and, for
    C{expiresAt}, written to) the table.

    A view follows one grant: once that grant has ended (released, expired
    or handed over to a waiter), reading it raises L{StaleHolder} instead
    of showing whatever the table holds for the key since.  Take a view,
    read it, drop it; never keep one across reactor turns.

    @ivar key: the held key.
    @ivar token: the fencing token of the grant.
    """

    __slots__ = ("_table", "key", "token")

    def __init__(self, table: "LockTable", key: bytes, token: int) -> None:
        self._table = table
        self.key = key
        self.token = token

    def _slot(self) -> int:
        slot = self._table._slotOf(self.key, self.token)
        if slot < 0:
            raise StaleHolder(f"the grant {self.token} of {self.key!r} has ended")
        return slot

    def __repr__(self) -> str:
        return f"<Holder {self.key!r} token {self.token}>"

    @property
    def share(self) -> int:
        """
        How it holds the key: L{EXCLUSIVE}, L{READ}, or the slot count of
        its semaphore.
        """
        self._slot()
        return self._table.shareOf(self.key, self.token)

    @property
    def grantedAt(self) -> float:
        """
        (Monotonic) time of the grant.
        """
        return self._table._granted[self._slot()]

    @property
    def expiresAt(self) -> float:
        """
        (Monotonic) time its lease runs out; a renewal moves it.
        """
        return self._table._expires[self._slot()]

    @expiresAt.setter
    def expiresAt(self, expiresAt: float) -> None:
        self._table._move(self.key, self._slot(), self.token, expiresAt)

    @property
    def client(self) -> object:
        """
        Who holds it: the opaque client its waiter stood for (the server's
        connection), or None when unknown (a grant learned by replication).
        """
        return self._table._clientAt(self._slot())

    @property
    def owner(self) -> Optional[str]:
        """
        The holder's name as shown: L{nameOf} its C{client}, now.
        """
        return nameOf(self.client)

    @property
    def renewals(self) -> int:
        """
        How many times the grant was renewed.
        """
        info = self._table._clients[self._slot()]
        return info.renewals if type(info) is _GrantInfo else 0

    @property
    def queue(self) -> Optional[WaitQueue]:
        """
        The waiters, or None when nobody waits.
        """
        self._slot()  # the grant must still hold the key
        return self._table.queueOf(self.key)

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


class LockTable:
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

    def __init__(self, tokens: TokenIssuer) -> None:
        self.tokens = tokens
        self._keys: Dict[bytes, int] = {}
        # The same dict, read-only for others: len(table.held) is the
        # number of held keys without a Python call (on every acquire).
        self.held: Dict[bytes, int] = self._keys
        self._records: Dict[bytes, _Key] = {}
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients: List[object] = []
        self._names: List[Optional[bytes]] = []
        # Free slot numbers: a list, not an array, because list.pop and
        # append cost a quarter of array's (80 ns per acquire + release),
        # and the int of a released key's slot is the one its dict entry
        # held, so no int is made.  A free slot costs 40 bytes here (its
        # arrays' 33 stay too) until a new grant takes it.
        self._free: List[int] = []
        self.waiterCount = 0
        # Keys whose first waiter may fit beside the holders now (a run of
        # readers after a writer, a semaphore's freed slot): the service
        # grants them a bounded number per reactor turn (L{nextPending},
        # L{grantHead}), in FIFO order, and nothing overtakes them
        # meanwhile because a new acquire queues behind any waiter.
        self.pending: Dict[bytes, None] = {}
        # Grants of keys held in shared form (see grantCount, which bounds
        # the service's lease bookkeeping).
        self.sharedGrants = 0

    # -- grants in slots ---------------------------------------------------

    def _place(self, key: bytes, record: Optional[_Key], token: int, grantedAt: float,
               expiresAt: float, client: object, name: Optional[bytes] = None) -> int:
        """
        Put the grant C{token} of C{key} in a slot, and make it one of the
        key's grants (C{record}'s, or the key's only one when C{record} is
        None): in the key's own slot when the key has no other grant (its
        last ended, or is replaced), else in a free or new one.

        A grant to a client is made under the holder name the client has
        now (its C{ident}: the C{I} name of its connection, kept with the
        grant after the connection renames itself or closes, and
        replicated with it; None for a connection that never named
        itself); a mirrored grant (no client) under C{name}, as its active
        recorded it.

        @return: the slot.
        """
        if client is not None:
            name = getattr(client, "ident", None)
        keys = self._keys
        slot = keys.get(key, -1) if record is None or not record.grants else -1
        if slot < 0 and self._free:
            slot = self._free.pop()
        if slot < 0:
            slot = len(self._clients)
            self._tokens.append(token)
            self._granted.append(grantedAt)
            self._expires.append(expiresAt)
            self._clients.append(client)
            self._names.append(name)
        else:
            self._tokens[slot] = token
            self._granted[slot] = grantedAt
            self._expires[slot] = expiresAt
            self._clients[slot] = client
            self._names[slot] = name
        if record is None:
            keys[key] = slot
            return slot
        grants = record.grants
        grants[token] = slot
        if record.share != EXCLUSIVE:
            self.sharedGrants += 1
        if len(grants) == 1:
            keys[key] = slot
            record.heap = [(expiresAt, token)]
        else:
            self._file(record, token, expiresAt)
            if expiresAt < self._expires[keys[key]]:
                keys[key] = slot
        return slot

    def _freeSlot(self, slot: int) -> None:
        self._clients[slot] = None  # let the client (a closed connection) go
        self._names[slot] = None
        self._free.append(slot)

    def _slotOf(self, key: bytes, token: int) -> int:
        """
        The slot of grant C{token} of C{key}, or -1 when it has none.
        """
        slot = self._keys.get(key)
        if slot is None:
            return -1
        record = self._records.get(key)
        if record is None:
            return slot if self._tokens[slot] == token else -1
        return record.grants.get(token, -1)

    def _slotsOf(self, key: bytes) -> List[Tuple[int, int]]:
        """
        C{(token, slot)} of every grant of C{key}, in the order they were
        made (empty when it is free).
        """
        slot = self._keys.get(key)
        if slot is None:
            return []
        record = self._records.get(key)
        if record is None:
            return [(self._tokens[slot], slot)]
        return list(record.grants.items())

    def _clientAt(self, slot: int) -> object:
        client = self._clients[slot]
        return client.client if type(client) is _GrantInfo else client

    def _stateAt(self, slot: int) -> str:
        info = self._clients[slot]
        return info.state if type(info) is _GrantInfo else LIVE

    def _infoAt(self, slot: int) -> _GrantInfo:
        info = self._clients[slot]
        if type(info) is not _GrantInfo:
            info = self._clients[slot] = _GrantInfo(info)
        return info

    def _file(self, record: _Key, token: int, expiresAt: float) -> None:
        """
        File the (new) deadline of grant C{token} in C{record}'s heap.
        """
        heap = record.heap
        heappush(heap, (expiresAt, token))
        if len(heap) > 2 * len(record.grants) + 16:
            # Mostly stale entries: make it again.
            expires = self._expires
            record.heap = [(expires[slot], held) for held, slot in record.grants.items()]
            heapify(record.heap)

    def _lead(self, key: bytes, record: _Key) -> None:
        """
        Point C{key} at its grant that runs out first (C{record} has one),
        dropping the stale heap entries on the way.
        """
        heap, grants, expires = record.heap, record.grants, self._expires
        while True:
            at, token = heap[0]
            slot = grants.get(token)
            if slot is not None and expires[slot] == at:
                self._keys[key] = slot
                return
            heappop(heap)

    def _move(self, key: bytes, slot: int, token: int, expiresAt: float) -> None:
        """
        The grant C{token} of C{key}, in C{slot}, now runs out at C{expiresAt}.
        """
        self._expires[slot] = expiresAt
        record = self._records.get(key)
        if record is not None:
            self._file(record, token, expiresAt)
            self._lead(key, record)

    def _recordOf(self, key: bytes, slot: int) -> _Key:
        """
        C{key}'s record, made for a key held by one exclusive grant (in
        C{slot}) when it has none yet.
        """
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = _Key(EXCLUSIVE)
            token = self._tokens[slot]
            record.grants[token] = slot
            record.heap.append((self._expires[slot], token))
        return record

    def _forget(self, key: bytes, token: int) -> bool:
        """
        End the grant C{token} of C{key} without handing the key over: its
        slot is freed, unless it was the key's last grant and waiters wait
        (then the slot stays the key's, L{ENDED}, for the next grant); the
        first waiter is let in when it fits now (see L{pending}).

        @return: whether C{token} held C{key}.
        """
        slot = self._slotOf(key, token)
        if slot < 0:
            return False
        record = self._records.get(key)
        if record is None:
            self._freeSlot(slot)
            del self._keys[key]
            return True
        grants = record.grants
        del grants[token]
        if record.share != EXCLUSIVE:
            self.sharedGrants -= 1
        if grants:
            self._freeSlot(slot)
            if slot == self._keys[key]:
                self._lead(key, record)
            self._letIn(key, record)
        elif record.queue is None:
            self._freeSlot(slot)
            del self._keys[key]
            del self._records[key]
        else:
            self._infoAt(slot).state = ENDED
        return True

    def _settle(self, key: bytes, record: _Key) -> None:
        """
        C{key}'s queue emptied: its record goes when the key is back to one
        exclusive grant, and the key itself when it has none (its last
        slot was kept for a grant that never came).
        """
        record.queue = None
        if not record.grants:
            self._freeSlot(self._keys.pop(key))
            del self._records[key]
        elif record.share == EXCLUSIVE:
            del self._records[key]

    # -- waiters -----------------------------------------------------------

    def _headFits(self, record: _Key) -> bool:
        """
        Whether the first waiter of C{record}'s key fits beside its grants.
        """
        queue = record.queue
        return queue is not None and queue.head is not None and record.fits(queue.head.share)

    def _letIn(self, key: bytes, record: _Key) -> None:
        """
        Note C{key} as pending when its first waiter fits beside its
        grants now.
        """
        if self._headFits(record):
            self.pending[key] = None

    def _admit(self, key: bytes, record: _Key, now: float) -> Grant:
        """
        Grant C{key} to its first waiter (it fits).

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
        share = record.share = waiter.share
        expiresAt = now + waiter.lease
        self._place(key, record, token, now, expiresAt, waiter.client())
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
        self.pending.pop(key, None)
        record = self._records.get(key)
        if record is None or not self._headFits(record):
            return None
        return self._admit(key, record, now)

    # -- queries ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def holder(self, key: bytes) -> Optional[Holder]:
        """
        A view of C{key}'s current grant (read it now: see L{Holder}), or
        None when the key is free.
        """
        slot = self._keys.get(key)
        return None if slot is None else Holder(self, key, self._tokens[slot])

    def holders(self) -> Iterator[Tuple[bytes, Holder]]:
        """
        Every held key with a view of its grant (the table must not change
        while this is iterated).
        """
        tokens = self._tokens
        for key, slot in self._keys.items():
            yield key, Holder(self, key, tokens[slot])

    def keys(self) -> List[bytes]:
        """
        A copy of the held keys (to work through later, a part at a time).
        """
        return list(self._keys)

    def page(self, offset: int, count: int) -> List[bytes]:
        """
        Up to C{count} held keys from position C{offset} on, in the
        table's order: the keys before it are skipped inside the dict's C
        iterator (about 10 ms per million), with no view made for them.
        """
        return list(islice(self._keys, offset, offset + count))

    def grants(self) -> Iterator[Tuple[bytes, int, float, float]]:
        """
        Every held key as C{(key, token, grantedAt, expiresAt)}, without a
        view per key (the table must not change while this is iterated).
        """
        tokens, granted, expires = self._tokens, self._granted, self._expires
        for key, slot in self._keys.items():
            yield key, tokens[slot], granted[slot], expires[slot]

    def tokenOf(self, key: bytes) -> Optional[int]:
        """
        The token holding C{key}, or None when it is free.
        """
        slot = self._keys.get(key)
        return None if slot is None else self._tokens[slot]

    def expiresAt(self, key: bytes) -> Optional[float]:
        """
        When C{key}'s current lease runs out, or None when it is free.
        """
        slot = self._keys.get(key)
        return None if slot is None else self._expires[slot]

    def grantOf(self, key: bytes) -> Optional[Tuple[int, float, float]]:
        """
        C{(token, grantedAt, expiresAt)} of C{key}'s current grant, or None.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        return self._tokens[slot], self._granted[slot], self._expires[slot]

    def plainGrantOf(self, key: bytes) -> Optional[Tuple[int, float, float, Optional[bytes]]]:
        """
        C{(token, grantedAt, expiresAt, name)} of C{key}'s only grant when
        it is held the plain way (one live exclusive grant), else None
        (free, shared, or a place kept by the lock-delay: see
        L{sharedGrantsOf}).
        """
        slot = self._keys.get(key)
        if slot is None or self.isShared(key) or self._stateAt(slot) is not LIVE:
            return None
        return self._tokens[slot], self._granted[slot], self._expires[slot], self._names[slot]

    def holding(self, key: bytes) -> Optional[Tuple[int, float, float, object]]:
        """
        C{(token, grantedAt, expiresAt, client)} of C{key}'s current grant,
        or None: what ending it (a release, an expiry) needs, in one look-up.
        A place kept by the lock-delay is no grant: None (see
        L{placeOf}).
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        client = self._clients[slot]
        if type(client) is _GrantInfo:
            if client.state is not LIVE:
                return None
            client = client.client
        return self._tokens[slot], self._granted[slot], self._expires[slot], client

    def clientOf(self, key: bytes) -> object:
        """
        Who holds C{key} (see L{Waiter.client}), or None when it is free,
        its holder is unknown (a grant learned by replication), or it has
        several (readers, a semaphore).
        """
        slot = self._keys.get(key)
        if slot is None or self.isShared(key):
            return None
        return self._clientAt(slot)

    def ownerOf(self, key: bytes) -> Optional[str]:
        """
        The name C{key}'s holder is shown by now (L{nameOf} its client), or
        None.
        """
        return nameOf(self.clientOf(key))

    def queueOf(self, key: bytes) -> Optional[WaitQueue]:
        """
        C{key}'s queue of waiters, or None when nobody waits (or it is free).
        """
        record = self._records.get(key)
        return record.queue if record is not None else None

    def queueLength(self, key: bytes) -> int:
        """
        How many wait for C{key} (0 when it is free).
        """
        queued = self.queued(key)
        return queued or 0

    def queued(self, key: bytes) -> Optional[int]:
        """
        How many wait for C{key}, or None when it is free (one look-up for
        the service's limits on every acquire).
        """
        record = self._records.get(key)
        if record is None:
            return 0 if key in self._keys else None
        queue = record.queue
        return queue.length if queue is not None else 0

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
        if slot is None:
            record = None
        else:
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
        token = self.tokens.issue()
        if record is None and share != EXCLUSIVE:
            record = self._records[key] = _Key(share)
        expiresAt = now + waiter.lease
        self._place(key, record, token, now, expiresAt, waiter.client())
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
        record = self._records.get(key)
        if record is None:
            if self._tokens[slot] != token:
                return _NOT_HELD
            # Nobody waits, one grant (the common case): free its slot.
            del self._keys[key]
            self._clients[slot] = None  # let the client (a closed connection) go
            self._free.append(slot)
            return _FREED
        grants = record.grants
        if len(grants) == 1 and record.queue is not None and token in grants:
            # Its last grant: the key (and its slot) goes to the first waiter.
            del grants[token]
            if record.share != EXCLUSIVE:
                self.sharedGrants -= 1
            return True, self._admit(key, record, now)
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
        for key, record in list(self._records.items()):
            if record.queue is not None:
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

    # -- replication -------------------------------------------------------

    def install(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                share: int = EXCLUSIVE, name: Optional[bytes] = None,
                delayed: bool = False) -> None:
        """
        Record a holder learned from the active node (a standby's mirror).
        Waiters are never replicated, so the mirror holds none.  Installing
        the token that already holds the key only moves its expiry.

        A grant of C{share} beside the key's holders joins them when it
        fits (a reader beside readers, a semaphore's grant while it has
        room); otherwise it replaces them, as a new exclusive grant does:
        the stream is the active's word, in order.  C{name} is the grant's
        holder name, as its active recorded it; C{delayed} says it is a
        place kept by the lock-delay until C{expiresAt} (see
        L{startDelay}).
        """
        self.tokens.observe(token)
        slot = self._slotOf(key, token)
        if slot >= 0:
            # The same grant again (a renewal, or a new snapshot): it keeps
            # the time it was first seen granted.
            if delayed or self._stateAt(slot) is not LIVE:
                self._infoAt(slot).state = KEPT if delayed else LIVE
            self._move(key, slot, token, expiresAt)
            return
        record = self._records.get(key)
        if key in self._keys and not (record is not None and record.fits(share)):
            record = self._replace(key, record, share)
        if record is None and share != EXCLUSIVE:
            record = self._records[key] = _Key(share)
        slot = self._place(key, record, token, grantedAt, expiresAt, None, name)
        if delayed:
            self._infoAt(slot).state = KEPT

    def _replace(self, key: bytes, record: Optional[_Key], share: int) -> Optional[_Key]:
        """
        Every grant of C{key} goes, for a grant of C{share} that does not
        fit beside them: the key's slot stays for it, and so does the
        queue.

        @return: the key's record when it keeps one (waiters).
        """
        if record is None:
            return None  # its one grant's slot is the key's
        kept = self._keys[key]
        for slot in record.grants.values():
            if slot != kept:
                self._freeSlot(slot)
        if record.share != EXCLUSIVE:
            self.sharedGrants -= len(record.grants)
        record.grants = {}
        if record.queue is None:
            del self._records[key]
            return None
        record.kind = kindOf(share)
        record.share = share
        return record

    def mirrorAll(self, changes: Iterable[Change]) -> None:
        """
        Apply a batch of replicated changes in order, exactly as L{install}
        (a grant) and L{drop} (expiresAt None) one by one would: a
        standby's every read of its active's stream.  Almost every line
        is a new exclusive grant of a free key or the drop of a key's only
        grant: those go straight to their slot (and the tokens are
        observed once), the rest through L{install} and L{drop}.
        """
        keys, records, tokens = self._keys, self._records, self._tokens
        highest = 0
        for key, token, grantedAt, expiresAt, share, name, delayed in changes:
            slot = keys.get(key)
            if expiresAt is None:
                if slot is None:
                    continue
                if key in records:
                    self.drop(key, token)
                elif tokens[slot] == token:
                    del keys[key]
                    self._freeSlot(slot)
            elif slot is not None or share != EXCLUSIVE or delayed:
                self.install(key, token, grantedAt, expiresAt, share, name, delayed)
            else:
                if token > highest:
                    highest = token
                self._place(key, None, token, grantedAt, expiresAt, None, name)
        if highest:
            self.tokens.observe(highest)

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        self._forget(key, token)

    # -- shared keys, for replication and the operator's view ----------------

    def kindOf(self, key: bytes) -> Optional[int]:
        """
        C{key}'s kind while it is held or waited for: L{READ_WRITE}, or the
        slot count of a semaphore; None when it is free.
        """
        if key not in self._keys:
            return None
        record = self._records.get(key)
        return record.kind if record is not None else READ_WRITE

    def isShared(self, key: bytes) -> bool:
        """
        Whether C{key} is held in shared form (readers, or a semaphore):
        then L{sharedGrantsOf} lists its grants, and every per-key query
        (L{tokenOf}, L{expiresAt}, L{holder}...) shows the one that runs
        out first.
        """
        record = self._records.get(key)
        return record is not None and record.share != EXCLUSIVE

    def holderCount(self, key: bytes) -> int:
        """
        How many grants hold C{key} (0 when it is free).
        """
        return len(self._slotsOf(key))

    def grantsOf(self, key: bytes) -> List[Holder]:
        """
        A view of every grant holding C{key}, oldest (lowest token) first;
        each view's C{share} says how it holds the key.  Empty when free.
        """
        return [Holder(self, key, token) for token, _ in self._slotsOf(key)]

    def sharedGrantsOf(self, key: bytes
                       ) -> List[Tuple[int, float, float, int, Optional[bytes], bool]]:
        """
        C{(token, grantedAt, expiresAt, share, name, delayed)} of every
        grant (and place kept by the lock-delay) of C{key}, highest token
        first (how a heal offers them: L{fitTogether} then keeps the same
        ones whichever order they come in); empty when free.
        """
        share = self.shareOf(key, 0)
        return [(token, self._granted[slot], self._expires[slot], share, self._names[slot],
                 self._stateAt(slot) is KEPT)
                for token, slot in reversed(self._slotsOf(key))]

    def firstGrants(self, key: bytes, count: int
                    ) -> List[Tuple[int, float, float, object, int, Optional[bytes], bool]]:
        """
        C{(token, grantedAt, expiresAt, client, renewals, name, delayed)} of
        at most C{count} grants (or places kept by the lock-delay) of
        C{key}, oldest (lowest token) first: what the operator's view
        lists, bounded however many grants a shared key has.  Empty when
        free.
        """
        record = self._records.get(key)
        slots = islice(record.grants.items(), max(count, 0)) if record is not None \
            else self._slotsOf(key)[:max(count, 0)]
        out = []
        for token, slot in slots:
            info = self._clients[slot]
            if type(info) is _GrantInfo:
                client, renewals, state = info.client, info.renewals, info.state
            else:
                client, renewals, state = info, 0, LIVE
            out.append((token, self._granted[slot], self._expires[slot], client, renewals,
                        self._names[slot], state is KEPT))
        return out

    def shareOf(self, key: bytes, token: int) -> int:
        """
        How the grant C{token} of C{key} holds it (L{EXCLUSIVE}, L{READ} or
        a semaphore's slots); L{EXCLUSIVE} for a key in the one-holder form.
        """
        record = self._records.get(key)
        return record.share if record is not None else EXCLUSIVE

    def leaseOf(self, key: bytes, token: int) -> Optional[float]:
        """
        When the grant C{token} of C{key} runs out, or None once it has
        ended (any grant, shared or not).
        """
        slot = self._slotOf(key, token)
        return self._expires[slot] if slot >= 0 else None

    def holdingOf(self, key: bytes, token: int) -> Optional[Tuple[int, float, float, object]]:
        """
        L{holding} for the grant C{token} of C{key}, whichever of a shared
        key's grants it is; None when C{token} does not hold the key.
        """
        slot = self._slotOf(key, token)
        if slot < 0 or self._stateAt(slot) is not LIVE:
            return None
        return token, self._granted[slot], self._expires[slot], self._clientAt(slot)

    def nameOfGrant(self, key: bytes, token: int) -> Optional[bytes]:
        """
        The holder name of the grant (or place) C{token} of C{key}.
        """
        slot = self._slotOf(key, token)
        return self._names[slot] if slot >= 0 else None

    def newest(self, key: bytes) -> Tuple[int, Optional[bytes]]:
        """
        C{(token, holder name)} of C{key}'s newest live grant (highest
        token), what an observer is shown; C{(0, None)} when no grant
        holds it (free, or only places kept by the lock-delay).
        """
        # Grants are kept in the order they were made, so the newest is
        # usually last; a heal may add older ones after it, hence the max.
        newest, name = 0, None
        for token, slot in self._slotsOf(key):
            if token > newest and self._stateAt(slot) is LIVE:
                newest, name = token, self._names[slot]
        return newest, name

    def grantCount(self) -> int:
        """
        How many grants hold keys, at most (a shared key counts each of its
        grants, and once more).
        """
        return len(self._keys) + self.sharedGrants

    def everyGrant(self) -> Iterator[Change]:
        """
        Every grant (and place kept by the lock-delay) as a L{Change}, a
        shared key's highest token first (the table must not change
        meanwhile).
        """
        for key in self._keys:
            for token, grantedAt, expiresAt, share, name, delayed in self.sharedGrantsOf(key):
                yield key, token, grantedAt, expiresAt, share, name, delayed

    # -- the lock-delay ------------------------------------------------------

    def placeOf(self, key: bytes, token: int) -> Optional[Tuple[float, float, object, bool]]:
        """
        C{(grantedAt, expiresAt, client, delayed)} of the place C{token}
        takes in C{key}: a live grant (C{delayed} False), or one that
        expired and keeps its place until C{expiresAt} (the lock-delay);
        None when it takes none.
        """
        slot = self._slotOf(key, token)
        if slot < 0:
            return None
        return (self._granted[slot], self._expires[slot], self._clientAt(slot),
                self._stateAt(slot) is KEPT)

    def startDelay(self, key: bytes, token: int, until: float) -> None:
        """
        The grant C{token} of C{key} expired: it is no longer held (its
        token is STALE, and L{newest} passes it by) but keeps its place in
        the key until C{until}, when its expiry comes due again and frees
        the place (L{expire}).
        """
        slot = self._slotOf(key, token)
        assert slot >= 0
        self._infoAt(slot).state = KEPT
        self._move(key, slot, token, until)

    def delayedUntil(self, key: bytes) -> Optional[float]:
        """
        When the last place of C{key} kept by the lock-delay frees, or None
        when none is.
        """
        ends = [self._expires[slot] for _, slot in self._slotsOf(key)
                if self._stateAt(slot) is KEPT]
        return max(ends) if ends else None
