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
    fitTogether,
    kindOf,
)
from lockservice.core.tokens import MAX_TOKEN, TokenExhausted, TokenIssuer
from lockservice.core.waiters import Waiter, WaitQueue, identOf, nameOf

__all__ = [
    "MAX_TOKEN", "Change", "EXCLUSIVE", "READ", "READ_WRITE", "Grant", "HandOverFailed",
    "Holder", "LockTable", "ShareMismatch", "StaleHolder", "TokenExhausted", "TokenIssuer",
    "WaitQueue", "Waiter", "describeKind", "fitTogether", "identOf", "kindOf", "nameOf",
]

# One replicated change (a standby's stream, a snapshot, a heal's merge):
# (key, token, grantedAt, expiresAt, share, name, delayed) of a grant, its
# holder name, and whether it is a place kept after its expiry (then
# expiresAt is when that place frees: see the lock-delay); expiresAt None
# for the end of grant C{token}.
Change = Tuple[bytes, int, float, Optional[float], int, Optional[bytes], bool]


class _Extra:
    """
    What only some held keys need besides their holder: a renewal count,
    a queue of waiters, the grants of a shared key.  Kept in the table's
    client list in place of the bare client, for a key that was renewed,
    is waited for or is shared.
    """

    __slots__ = ("client", "renewals", "queue", "shared", "delayed")

    def __init__(self, client: object) -> None:
        self.client = client
        self.renewals = 0
        self.queue: Optional[WaitQueue] = None
        # True while the slot's grant has expired and only keeps its place
        # until the lock-delay ends (then the slot's expiry is that end).
        self.delayed = False
        # Set while the key is held in shared form (then client and
        # renewals are unused: each grant keeps its own).
        self.shared: Optional[_Shared] = None


class _SharedGrant:
    """
    One grant of a shared key (its token is its key in L{_Shared.grants}).

    @ivar name: its holder name (see L{identOf}).
    @ivar delayed: True once it expired and only keeps its place until the
        lock-delay ends (then C{expiresAt} is that end).
    """

    __slots__ = ("grantedAt", "expiresAt", "client", "renewals", "name", "delayed")

    def __init__(self, grantedAt: float, expiresAt: float, client: object,
                 name: Optional[bytes]) -> None:
        self.grantedAt = grantedAt
        self.expiresAt = expiresAt
        self.client = client
        self.renewals = 0
        self.name = name
        self.delayed = False


class _Shared:
    """
    The holders of a key held in shared form: a semaphore (always), or a
    read-write key while readers hold it (a writer holds a read-write key
    in the plain one-holder form, which costs no more than any exclusive
    key).

    @ivar kind: L{READ_WRITE}, or the semaphore's slot count.
    @ivar grants: token -> grant, in grant order (so tokens ascending).
    @ivar heap: C{(expiresAt, token)} of every grant, plus stale entries of
        grants released or renewed since (skipped when they come up): the
        key's earliest deadline in O(log n).
    """

    __slots__ = ("kind", "grants", "heap")

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.grants: Dict[int, _SharedGrant] = {}
        self.heap: List[Tuple[float, int]] = []

    def fits(self, share: int) -> bool:
        """
        Whether an acquire of C{share} (of this key's kind) fits beside the
        holders.
        """
        if self.kind == READ_WRITE:
            return share == READ or not self.grants
        return len(self.grants) < self.kind

    def add(self, token: int, grant: _SharedGrant) -> None:
        self.grants[token] = grant
        heappush(self.heap, (grant.expiresAt, token))

    def moved(self, token: int, grant: _SharedGrant) -> None:
        # A renewal: the old heap entry goes stale.
        heappush(self.heap, (grant.expiresAt, token))
        self._compact()

    def earliest(self) -> Tuple[int, _SharedGrant]:
        """
        The grant whose lease runs out first (the key must be held).
        """
        heap, grants = self.heap, self.grants
        while True:
            at, token = heap[0]
            grant = grants.get(token)
            if grant is not None and grant.expiresAt == at:
                return token, grant
            heappop(heap)

    def _compact(self) -> None:
        if len(self.heap) > 2 * len(self.grants) + 16:
            self.heap = [(g.expiresAt, t) for t, g in self.grants.items()]
            heapify(self.heap)


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
        table = self._table
        slot = table._keys.get(self.key)
        if (slot is None or table._tokens[slot] != self.token
                or table._sharedAt(slot) is not None):
            raise StaleHolder(f"the grant {self.token} of {self.key!r} has ended")
        return slot

    def _shared(self) -> Optional[_SharedGrant]:
        """
        The grant's record when its key is held in shared form, else None
        (its slot's arrays hold it).
        """
        table = self._table
        slot = table._keys.get(self.key)
        shared = table._sharedAt(slot) if slot is not None else None
        if shared is None:
            self._slot()
            return None
        grant = shared.grants.get(self.token)
        if grant is None:
            raise StaleHolder(f"the grant {self.token} of {self.key!r} has ended")
        return grant

    def __repr__(self) -> str:
        return f"<Holder {self.key!r} token {self.token}>"

    @property
    def share(self) -> int:
        """
        How it holds the key: L{EXCLUSIVE}, L{READ}, or the slot count of
        its semaphore.
        """
        table = self._table
        slot = table._keys.get(self.key)
        shared = table._sharedAt(slot) if slot is not None else None
        if shared is None:
            self._slot()
            return EXCLUSIVE
        self._shared()
        return READ if shared.kind == READ_WRITE else shared.kind

    @property
    def grantedAt(self) -> float:
        """
        (Monotonic) time of the grant.
        """
        grant = self._shared()
        return grant.grantedAt if grant is not None else self._table._granted[self._slot()]

    @property
    def expiresAt(self) -> float:
        """
        (Monotonic) time its lease runs out; a renewal moves it.
        """
        grant = self._shared()
        return grant.expiresAt if grant is not None else self._table._expires[self._slot()]

    @expiresAt.setter
    def expiresAt(self, expiresAt: float) -> None:
        grant = self._shared()
        if grant is None:
            self._table._expires[self._slot()] = expiresAt
        else:
            self._table._moveShared(self.key, self.token, grant, expiresAt)

    @property
    def client(self) -> object:
        """
        Who holds it: the opaque client its waiter stood for (the server's
        connection), or None when unknown (a grant learned by replication).
        """
        grant = self._shared()
        return grant.client if grant is not None else self._table._clientAt(self._slot())

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
        grant = self._shared()
        if grant is not None:
            return grant.renewals
        extra = self._table._clients[self._slot()]
        return extra.renewals if type(extra) is _Extra else 0

    @property
    def queue(self) -> Optional[WaitQueue]:
        """
        The waiters, or None when nobody waits.
        """
        self._shared()  # the grant must still hold the key
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
    waiter.  Every operation costs O(1) whatever the queue lengths.

    Held keys are stored as a structure of arrays, because a held key's
    memory is what limits how many a node can hold: C{_keys} maps each key
    to a slot number, and slot C{i} of three typed arrays holds its token
    and times (unboxed, 24 bytes) and slot C{i} of one list its client, or
    an L{_Extra} (client, renewals, queue) for the few keys that were
    renewed or are waited for.  A released key's slot goes to a free list
    and is reused by the next new key (the tables never shrink).  Nothing here is made per held key
    but its dict entry and slot number, and nothing per key is tracked by
    the garbage collector (a full collection does not walk a million held
    keys).  L{holder} gives a short-lived L{Holder} view of one grant.
    """

    def __init__(self, tokens: TokenIssuer) -> None:
        self.tokens = tokens
        self._keys: Dict[bytes, int] = {}
        # The same dict, read-only for others: len(table.held) is the
        # number of held keys without a Python call (on every acquire).
        self.held: Dict[bytes, int] = self._keys
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients: List[object] = []
        # The holder name of each slot's grant (see identOf); a shared
        # key's grants keep theirs in their records.
        self._names: List[Optional[bytes]] = []
        # Free slot numbers: a list, not an array, because list.pop and
        # append cost a quarter of array's (80 ns per acquire + release),
        # and the int of a released key's slot is the one its dict entry
        # held, so no int is made.  A free slot costs 40 bytes here (its
        # arrays' 33 stay too) until a new key takes it.
        self._free: List[int] = []
        self.waiterCount = 0
        # Keys held in shared form whose first waiter may fit beside the
        # holders now (a run of readers after a writer): the service grants
        # them a bounded number per reactor turn (L{nextPending},
        # L{grantHead}), in FIFO order, and nothing overtakes them meanwhile
        # because a new acquire queues behind any waiter.
        self.pending: Dict[bytes, None] = {}
        # Grants of keys held in shared form (see grantCount, which bounds
        # the service's lease bookkeeping).
        self.sharedGrants = 0

    # -- slots -------------------------------------------------------------

    def _newSlot(self, token: int, grantedAt: float, expiresAt: float, client: object,
                 name: Optional[bytes]) -> int:
        free = self._free
        if free:
            slot = free.pop()
            self._tokens[slot] = token
            self._granted[slot] = grantedAt
            self._expires[slot] = expiresAt
            self._clients[slot] = client
            self._names[slot] = name
            return slot
        self._tokens.append(token)
        self._granted.append(grantedAt)
        self._expires.append(expiresAt)
        self._clients.append(client)
        self._names.append(name)
        return len(self._clients) - 1

    def _freeSlot(self, key: bytes, slot: int) -> None:
        del self._keys[key]
        self._clients[slot] = None  # let the client (a closed connection) go
        self._names[slot] = None
        self._free.append(slot)

    def _regrant(self, slot: int, token: int, grantedAt: float, expiresAt: float,
                 client: object, name: Optional[bytes]) -> None:
        """
        The key of C{slot} passes to a new grant: its renewal count starts
        again, its queue stays.
        """
        self._tokens[slot] = token
        self._granted[slot] = grantedAt
        self._expires[slot] = expiresAt
        self._names[slot] = name
        extra = self._clients[slot]
        if type(extra) is _Extra and extra.queue is not None:
            extra.client = client
            extra.renewals = 0
            extra.delayed = False
        else:
            self._clients[slot] = client

    def _clientAt(self, slot: int) -> object:
        client = self._clients[slot]
        return client.client if type(client) is _Extra else client

    def _queueAt(self, slot: int) -> Optional[WaitQueue]:
        extra = self._clients[slot]
        return extra.queue if type(extra) is _Extra else None

    def _extraAt(self, slot: int) -> _Extra:
        extra = self._clients[slot]
        if type(extra) is not _Extra:
            extra = self._clients[slot] = _Extra(extra)
        return extra

    def _unqueued(self, slot: int, extra: _Extra) -> None:
        # Its queue emptied: back to the bare client unless it was renewed
        # (or is shared).
        extra.queue = None
        if not extra.renewals and extra.shared is None and not extra.delayed:
            self._clients[slot] = extra.client

    # -- shared keys -------------------------------------------------------

    def _sharedAt(self, slot: int) -> Optional[_Shared]:
        extra = self._clients[slot]
        return extra.shared if type(extra) is _Extra else None

    def _syncShared(self, slot: int, shared: _Shared) -> None:
        """
        A shared key's slot arrays show its grant that runs out first, so
        that lease deadlines (and every per-key query) work on it as on any
        key.
        """
        token, grant = shared.earliest()
        self._tokens[slot] = token
        self._granted[slot] = grant.grantedAt
        self._expires[slot] = grant.expiresAt

    def _moveShared(self, key: bytes, token: int, grant: _SharedGrant, expiresAt: float) -> None:
        slot = self._keys[key]
        shared = self._sharedAt(slot)
        assert shared is not None
        grant.expiresAt = expiresAt
        shared.moved(token, grant)
        self._syncShared(slot, shared)

    def _checkPending(self, key: bytes, extra: _Extra) -> None:
        queue, shared = extra.queue, extra.shared
        if (queue is not None and queue.head is not None and shared is not None
                and shared.fits(queue.head.share)):
            self.pending[key] = None

    def _acquireShared(self, waiter: Waiter, now: float) -> Optional[Grant]:
        key, share = waiter.key, waiter.share
        kind = kindOf(share)
        slot = self._keys.get(key)
        if slot is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            fresh = _Extra(None)
            created = fresh.shared = _Shared(kind)
            client = waiter.client()
            created.add(token, _SharedGrant(now, expiresAt, client, identOf(client)))
            self.sharedGrants += 1
            self._keys[key] = self._newSlot(token, now, expiresAt, fresh, None)
            return Grant(key, token, expiresAt, None)
        extra = self._extraAt(slot)
        shared = extra.shared
        held = shared.kind if shared is not None else READ_WRITE
        if held != kind:
            if extra.queue is None and not extra.renewals and shared is None:
                self._clients[slot] = extra.client  # nothing changed
            raise ShareMismatch(key, held)
        queue = extra.queue
        if shared is not None and queue is None and shared.fits(share):
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            client = waiter.client()
            shared.add(token, _SharedGrant(now, expiresAt, client, identOf(client)))
            self.sharedGrants += 1
            if expiresAt < self._expires[slot]:
                self._syncShared(slot, shared)
            return Grant(key, token, expiresAt, None)
        waiter.queuedAt = now
        waiter.queued = True
        if queue is None:
            queue = extra.queue = WaitQueue()
        queue.append(waiter)
        self.waiterCount += 1
        return None

    def _endShared(self, key: bytes, slot: int, extra: _Extra, token: int, now: float,
                   expiring: bool) -> Tuple[bool, Optional[Grant]]:
        """
        End the grant C{token} of a key held in shared form (released, or
        C{expiring} when its lease has run out), and let in whoever fits.
        """
        shared = extra.shared
        assert shared is not None
        grant = shared.grants.get(token)
        if grant is None or (expiring and grant.expiresAt > now):
            return _NOT_HELD
        del shared.grants[token]
        self.sharedGrants -= 1
        if shared.grants:
            self._syncShared(slot, shared)
            self._checkPending(key, extra)
            return _FREED
        if extra.queue is None:
            self._freeSlot(key, slot)
            return _FREED
        return True, self._grantFirst(key, slot, extra, now)

    def _grantFirst(self, key: bytes, slot: int, extra: _Extra, now: float) -> Grant:
        """
        Nothing holds C{key} any more and somebody waits: grant the first
        waiter (it fits), in the form that suits it (a writer of a
        read-write key holds it as an exclusive key does).

        @raise HandOverFailed: no token left (the key is freed).
        """
        queue = extra.queue
        assert queue is not None
        try:
            token = self.tokens.issue()
        except TokenExhausted:
            orphans = self._unqueue(slot, extra)
            self._freeSlot(key, slot)
            raise HandOverFailed(orphans) from None
        waiter = queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        expiresAt = now + waiter.lease
        self._tokens[slot] = token
        self._granted[slot] = now
        self._expires[slot] = expiresAt
        extra.renewals = 0
        extra.delayed = False
        client = waiter.client()
        if waiter.share == EXCLUSIVE:
            extra.shared = None
            self._names[slot] = identOf(client)
            if queue.length:
                extra.client = client
            else:
                self._clients[slot] = client
            return Grant(key, token, expiresAt, waiter)
        shared = extra.shared
        if shared is None:
            shared = extra.shared = _Shared(READ_WRITE)
        shared.add(token, _SharedGrant(now, expiresAt, client, identOf(client)))
        self.sharedGrants += 1
        extra.client = None
        if not queue.length:
            extra.queue = None
        self._syncShared(slot, shared)
        self._checkPending(key, extra)
        return Grant(key, token, expiresAt, waiter)

    def nextPending(self) -> Optional[bytes]:
        """
        A key whose first waiter fits beside its holders now (a run of
        readers, a semaphore with free slots), or None: grant its waiters
        with L{grantHead}, a bounded number per reactor turn.
        """
        pending = self.pending
        while pending:
            key = next(iter(pending))
            slot = self._keys.get(key)
            if slot is not None:
                extra = self._clients[slot]
                if type(extra) is _Extra:
                    queue, shared = extra.queue, extra.shared
                    if (queue is not None and queue.head is not None and shared is not None
                            and shared.fits(queue.head.share)):
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
        slot = self._keys.get(key)
        extra = self._clients[slot] if slot is not None else None
        if type(extra) is not _Extra or extra.queue is None or extra.shared is None:
            self.pending.pop(key, None)
            return None
        queue, shared = extra.queue, extra.shared
        waiter = queue.head
        assert slot is not None and waiter is not None
        if not shared.fits(waiter.share):
            self.pending.pop(key, None)
            return None
        try:
            token = self.tokens.issue()
        except TokenExhausted:
            self.pending.pop(key, None)
            raise HandOverFailed(self._unqueue(slot, extra)) from None
        queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        expiresAt = now + waiter.lease
        client = waiter.client()
        shared.add(token, _SharedGrant(now, expiresAt, client, identOf(client)))
        self.sharedGrants += 1
        if expiresAt < self._expires[slot]:
            self._syncShared(slot, shared)
        head = queue.head
        if head is None:
            extra.queue = None
            self.pending.pop(key, None)
        elif not shared.fits(head.share):
            self.pending.pop(key, None)
        return Grant(key, token, expiresAt, waiter)

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
        if slot is None:
            return None
        extra = self._clients[slot]
        if type(extra) is _Extra and (extra.shared is not None or extra.delayed):
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
        if type(client) is _Extra:
            shared = client.shared
            if shared is None:
                if client.delayed:
                    return None
                client = client.client
            else:
                # The slot shows the shared grant that runs out first: its
                # holder is that grant's (the key's own client is unused).
                grant = shared.grants.get(self._tokens[slot])
                if grant is None or grant.delayed:
                    return None
                client = grant.client
        return self._tokens[slot], self._granted[slot], self._expires[slot], client

    def clientOf(self, key: bytes) -> object:
        """
        Who holds C{key} (see L{Waiter.client}), or None when it is free or
        its holder is unknown (a grant learned by replication).
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        client = self._clients[slot]
        return client.client if type(client) is _Extra else client

    def ownerOf(self, key: bytes) -> Optional[str]:
        """
        The name C{key}'s holder is shown by now (L{nameOf} its client), or
        None.
        """
        # clientOf and nameOf, inline: this runs at every grant and release.
        slot = self._keys.get(key)
        if slot is None:
            return None
        client = self._clients[slot]
        if type(client) is _Extra:
            client = client.client
        return getattr(client, "name", None)

    def queueOf(self, key: bytes) -> Optional[WaitQueue]:
        """
        C{key}'s queue of waiters, or None when nobody waits (or it is free).
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        extra = self._clients[slot]
        return extra.queue if type(extra) is _Extra else None

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
        slot = self._keys.get(key)
        if slot is None:
            return None
        extra = self._clients[slot]
        if type(extra) is not _Extra or extra.queue is None:
            return 0
        return extra.queue.length

    # -- client operations -------------------------------------------------

    def acquire(self, waiter: Waiter, now: float) -> Optional[Grant]:
        """
        Grant C{waiter.key} at once if it is free, otherwise queue the waiter.

        @return: the grant, or None when the waiter was queued.
        @raise TokenExhausted: no token left; nothing changed.
        @raise ShareMismatch: the waiter's share does not match the key's
            kind; nothing changed.
        """
        if waiter.share != EXCLUSIVE:
            return self._acquireShared(waiter, now)
        key = waiter.key
        slot = self._keys.get(key)
        if slot is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            # _newSlot, inline: this is every uncontended acquire.
            client = waiter.client()
            free = self._free
            if free:
                slot = free.pop()
                self._tokens[slot] = token
                self._granted[slot] = now
                self._expires[slot] = expiresAt
                self._clients[slot] = client
                self._names[slot] = getattr(client, "ident", None)
            else:
                slot = len(self._clients)
                self._tokens.append(token)
                self._granted.append(now)
                self._expires.append(expiresAt)
                self._clients.append(client)
                self._names.append(getattr(client, "ident", None))
            self._keys[key] = slot
            return Grant(key, token, expiresAt, None)
        extra = self._clients[slot]
        if type(extra) is not _Extra:
            extra = self._clients[slot] = _Extra(extra)
        elif extra.shared is not None:
            return self._acquireShared(waiter, now)  # a reader holds, or a semaphore
        waiter.queuedAt = now
        waiter.queued = True
        queue = extra.queue
        if queue is None:
            queue = extra.queue = WaitQueue()
        queue.append(waiter)
        self.waiterCount += 1
        return None

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
        if self._tokens[slot] != token:
            return self._endOther(key, slot, token, now, expiring=False)
        clients = self._clients
        if type(clients[slot]) is not _Extra:
            # Nobody waits (the common case): free the slot here, inline.
            del self._keys[key]
            clients[slot] = None  # let the client (a closed connection) go
            self._free.append(slot)
            return _FREED
        return True, self._handOver(key, slot, now)

    def expire(self, key: bytes, token: int, now: float) -> Tuple[bool, Optional[Grant]]:
        """
        Take C{key} back from grant C{token} when its lease has run out.

        @return: C{(expired, next grant)}; nothing happens (False) when the
            grant no longer holds the key or its lease has not run out.
        @raise HandOverFailed: expired, but the waiters could not be served.
        """
        slot = self._keys.get(key)
        if slot is None:
            return _NOT_HELD
        if self._tokens[slot] != token:
            return self._endOther(key, slot, token, now, expiring=True)
        if self._expires[slot] > now:
            return _NOT_HELD
        clients = self._clients
        if type(clients[slot]) is not _Extra:
            del self._keys[key]  # as in release
            clients[slot] = None
            self._free.append(slot)
            return _FREED
        return True, self._handOver(key, slot, now)

    def _endOther(self, key: bytes, slot: int, token: int, now: float,
                  expiring: bool) -> Tuple[bool, Optional[Grant]]:
        # A token that is not the one in the key's slot: one of a shared
        # key's other grants, or stale.
        extra = self._clients[slot]
        if type(extra) is _Extra and extra.shared is not None:
            return self._endShared(key, slot, extra, token, now, expiring)
        return _NOT_HELD

    def renew(self, key: bytes, token: int, lease: float, now: float) -> Optional[Holder]:
        """
        Extend the grant C{token} of C{key}: its lease runs C{lease} seconds
        from C{now}; the token does not change.

        @return: a view of the grant, or None (nothing changed) when
            C{token} does not hold the key, or its lease has already run out.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        extra = self._clients[slot]
        if type(extra) is _Extra and extra.shared is not None:
            grant = extra.shared.grants.get(token)
            if grant is None or grant.expiresAt <= now or grant.delayed:
                return None
            self._moveShared(key, token, grant, now + lease)
            grant.renewals += 1
            return Holder(self, key, token)
        if (self._tokens[slot] != token or self._expires[slot] <= now
                or (type(extra) is _Extra and extra.delayed)):
            return None
        self._expires[slot] = now + lease
        self._extraAt(slot).renewals += 1
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
        slot = self._keys[waiter.key]
        extra = self._clients[slot]
        assert type(extra) is _Extra and extra.queue is not None
        first = waiter.prev is None
        extra.queue.remove(waiter)
        if not extra.queue.length:
            self._unqueued(slot, extra)
        elif first and extra.shared is not None:
            self._checkPending(waiter.key, extra)  # the next one may fit now
        self.waiterCount -= 1
        return True

    def cut(self, key: bytes, first: Waiter, last: Waiter, count: int) -> None:
        """
        Take the C{count} consecutive waiters C{first} .. C{last} out of
        C{key}'s queue at once, O(1) (a closed connection's pipelined
        acquires).  They stay marked C{queued}: whoever cut them withdraws
        them later, one by one, without the table.
        """
        slot = self._keys[key]
        extra = self._clients[slot]
        assert type(extra) is _Extra and extra.queue is not None
        head = first.prev is None
        extra.queue.cut(first, last, count)
        if not extra.queue.length:
            self._unqueued(slot, extra)
        elif head and extra.shared is not None:
            self._checkPending(key, extra)
        self.waiterCount -= count

    def _handOver(self, key: bytes, slot: int, now: float) -> Optional[Grant]:
        extra = self._clients[slot]
        if type(extra) is not _Extra or extra.queue is None:
            if type(extra) is _Extra and extra.shared is not None:
                return self._endShared(key, slot, extra, self._tokens[slot], now, False)[1]
            self._freeSlot(key, slot)
            return None
        if extra.shared is not None:
            return self._endShared(key, slot, extra, self._tokens[slot], now, False)[1]
        queue = extra.queue
        if queue.head is not None and queue.head.share != EXCLUSIVE:
            return self._grantFirst(key, slot, extra, now)  # readers come in
        try:
            token = self.tokens.issue()
        except TokenExhausted:
            # Never leave the key held by a grant that ended: free it and
            # give the waiters back to be answered.
            orphans = self._unqueue(slot, extra)
            self._freeSlot(key, slot)
            raise HandOverFailed(orphans) from None
        waiter = queue.popleft()
        waiter.queued = False
        self.waiterCount -= 1
        expiresAt = now + waiter.lease
        # _regrant, inline: this is every hand-over.
        self._tokens[slot] = token
        self._granted[slot] = now
        self._expires[slot] = expiresAt
        client = waiter.client()
        self._names[slot] = getattr(client, "ident", None)
        if queue.length:
            extra.client = client
            extra.renewals = 0
            extra.delayed = False
        else:
            self._clients[slot] = client  # the _Extra goes
        return Grant(key, token, expiresAt, waiter)

    def _unqueue(self, slot: int, extra: _Extra) -> List[Waiter]:
        queue = extra.queue
        orphans = list(queue) if queue is not None else []
        for waiter in orphans:
            waiter.queued = False
            waiter.prev = waiter.next = None
        self.waiterCount -= len(orphans)
        self._unqueued(slot, extra)
        return orphans

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
        slot = self._keys.get(key)
        if share != EXCLUSIVE or (slot is not None and self._sharedAt(slot) is not None):
            self._installShared(key, slot, token, grantedAt, expiresAt, share, name, delayed)
            return
        if slot is None:
            slot = self._keys[key] = self._newSlot(token, grantedAt, expiresAt, None, name)
        elif self._tokens[slot] == token:
            # The same grant again (a renewal, or a new snapshot): it keeps
            # the time it was first seen granted.
            self._expires[slot] = expiresAt
        else:
            self._regrant(slot, token, grantedAt, expiresAt, None, name)
        extra = self._clients[slot]
        if delayed:
            self._extraAt(slot).delayed = True
        elif type(extra) is _Extra and extra.delayed:
            extra.delayed = False
            if extra.queue is None and not extra.renewals:
                self._clients[slot] = extra.client

    def _installShared(self, key: bytes, slot: Optional[int], token: int, grantedAt: float,
                       expiresAt: float, share: int, name: Optional[bytes],
                       delayed: bool) -> None:
        if slot is not None:
            extra = self._clients[slot]
            shared = extra.shared if type(extra) is _Extra else None
            if shared is not None and token in shared.grants:
                grant = shared.grants[token]
                grant.delayed = delayed
                self._moveShared(key, token, grant, expiresAt)
                return
            if (shared is not None and share != EXCLUSIVE and shared.kind == kindOf(share)
                    and shared.fits(share)):
                added = _SharedGrant(grantedAt, expiresAt, None, name)
                added.delayed = delayed
                shared.add(token, added)
                self.sharedGrants += 1
                self._syncShared(slot, shared)
                return
            if shared is not None:
                self.sharedGrants -= len(shared.grants)  # replaced
            if share == EXCLUSIVE:
                assert type(extra) is _Extra
                extra.shared = None
                extra.client = None
                self._regrant(slot, token, grantedAt, expiresAt, None, name)
                extra.delayed = delayed
                if extra.queue is None and not delayed:
                    self._clients[slot] = None
                return
        shared = _Shared(kindOf(share))
        added = _SharedGrant(grantedAt, expiresAt, None, name)
        added.delayed = delayed
        shared.add(token, added)
        self.sharedGrants += 1
        if slot is None:
            extra = _Extra(None)
            extra.shared = shared
            self._keys[key] = self._newSlot(token, grantedAt, expiresAt, extra, None)
            return
        extra = self._extraAt(slot)
        extra.client = None
        extra.renewals = 0
        extra.delayed = False  # (each shared grant says for itself)
        extra.shared = shared
        self._syncShared(slot, shared)

    def mirrorAll(self, changes: Iterable[Change]) -> None:
        """
        Apply a batch of replicated changes in order, exactly as L{install}
        (a grant) and L{drop} (expiresAt None) one by one would: a
        standby's every read of its active's stream.  The two forms of
        almost every line are done inline (a key not held granted
        exclusively; the drop of a key's only grant, nobody queued), the
        rest by those methods, and the tokens are observed once.
        """
        keys, tokens, clients, free = self._keys, self._tokens, self._clients, self._free
        granted, expires, names = self._granted, self._expires, self._names
        highest = 0
        for key, token, grantedAt, expiresAt, share, name, delayed in changes:
            slot = keys.get(key)
            if expiresAt is None:
                if slot is None:
                    continue
                if type(clients[slot]) is _Extra:  # shared, or queued: the full form
                    self.drop(key, token)
                elif tokens[slot] == token:  # _freeSlot, inline
                    del keys[key]
                    clients[slot] = None
                    free.append(slot)
                continue
            if slot is not None or share != EXCLUSIVE or delayed:
                self.install(key, token, grantedAt, expiresAt, share, name, delayed)
                continue
            if token > highest:
                highest = token
            if free:  # _newSlot, inline
                slot = free.pop()
                tokens[slot] = token
                granted[slot] = grantedAt
                expires[slot] = expiresAt
                clients[slot] = None
                names[slot] = name
            else:
                slot = len(clients)
                tokens.append(token)
                granted.append(grantedAt)
                expires.append(expiresAt)
                clients.append(None)
                names.append(name)
            keys[key] = slot
        if highest:
            self.tokens.observe(highest)

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        slot = self._keys.get(key)
        if slot is None:
            return
        shared = self._sharedAt(slot)
        if shared is not None:
            if shared.grants.pop(token, None) is not None:
                self.sharedGrants -= 1
                if shared.grants:
                    self._syncShared(slot, shared)
                elif self._queueAt(slot) is None:
                    self._freeSlot(key, slot)
            return
        if self._tokens[slot] == token and self._queueAt(slot) is None:
            self._freeSlot(key, slot)

    # -- shared keys, for replication and the operator's view ----------------

    def kindOf(self, key: bytes) -> Optional[int]:
        """
        C{key}'s kind while it is held or waited for: L{READ_WRITE}, or the
        slot count of a semaphore; None when it is free.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        shared = self._sharedAt(slot)
        return shared.kind if shared is not None else READ_WRITE

    def holderCount(self, key: bytes) -> int:
        """
        How many grants hold C{key} (0 when it is free).
        """
        slot = self._keys.get(key)
        if slot is None:
            return 0
        shared = self._sharedAt(slot)
        return len(shared.grants) if shared is not None else 1

    def grantsOf(self, key: bytes) -> List[Holder]:
        """
        A view of every grant holding C{key}, oldest (lowest token) first;
        each view's C{share} says how it holds the key.  Empty when free.
        """
        slot = self._keys.get(key)
        if slot is None:
            return []
        shared = self._sharedAt(slot)
        if shared is None:
            return [Holder(self, key, self._tokens[slot])]
        return [Holder(self, key, token) for token in shared.grants]

    def sharedGrantsOf(self, key: bytes
                       ) -> List[Tuple[int, float, float, int, Optional[bytes], bool]]:
        """
        C{(token, grantedAt, expiresAt, share, name, delayed)} of every
        grant (and place kept by the lock-delay) of C{key}, highest token
        first (how a heal offers them: L{fitTogether} then keeps the same
        ones whichever order they come in); empty when free.
        """
        slot = self._keys.get(key)
        if slot is None:
            return []
        extra = self._clients[slot]
        shared = extra.shared if type(extra) is _Extra else None
        if shared is None:
            delayed = type(extra) is _Extra and extra.delayed
            return [(self._tokens[slot], self._granted[slot], self._expires[slot], EXCLUSIVE,
                     self._names[slot], delayed)]
        share = READ if shared.kind == READ_WRITE else shared.kind
        return [(token, grant.grantedAt, grant.expiresAt, share, grant.name, grant.delayed)
                for token, grant in reversed(shared.grants.items())]

    def firstGrants(self, key: bytes, count: int
                    ) -> List[Tuple[int, float, float, object, int, Optional[bytes], bool]]:
        """
        C{(token, grantedAt, expiresAt, client, renewals, name, delayed)} of
        at most C{count} grants (or places kept by the lock-delay) of
        C{key}, oldest (lowest token) first: what the operator's view
        lists, bounded however many grants a shared key has.  Empty when
        free.
        """
        slot = self._keys.get(key)
        if slot is None or count <= 0:
            return []
        shared = self._sharedAt(slot)
        if shared is None:
            extra = self._clients[slot]
            renewals = extra.renewals if type(extra) is _Extra else 0
            delayed = type(extra) is _Extra and extra.delayed
            return [(self._tokens[slot], self._granted[slot], self._expires[slot],
                     self._clientAt(slot), renewals, self._names[slot], delayed)]
        return [(token, grant.grantedAt, grant.expiresAt, grant.client, grant.renewals,
                 grant.name, grant.delayed)
                for token, grant in islice(shared.grants.items(), count)]

    def shareOf(self, key: bytes, token: int) -> int:
        """
        How the grant C{token} of C{key} holds it (L{EXCLUSIVE}, L{READ} or
        a semaphore's slots); L{EXCLUSIVE} for a key in the one-holder form.
        """
        slot = self._keys.get(key)
        shared = self._sharedAt(slot) if slot is not None else None
        if shared is None:
            return EXCLUSIVE
        return READ if shared.kind == READ_WRITE else shared.kind

    def leaseOf(self, key: bytes, token: int) -> Optional[float]:
        """
        When the grant C{token} of C{key} runs out, or None once it has
        ended (any grant, shared or not).
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        shared = self._sharedAt(slot)
        if shared is None:
            return self._expires[slot] if self._tokens[slot] == token else None
        grant = shared.grants.get(token)
        return grant.expiresAt if grant is not None else None

    def holdingOf(self, key: bytes, token: int) -> Optional[Tuple[int, float, float, object]]:
        """
        L{holding} for the grant C{token} of C{key}, whichever of a shared
        key's grants it is; None when C{token} does not hold the key.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        shared = self._sharedAt(slot)
        if shared is None:
            holding = self.holding(key)
            return holding if holding is not None and holding[0] == token else None
        grant = shared.grants.get(token)
        if grant is None or grant.delayed:
            return None
        return token, grant.grantedAt, grant.expiresAt, grant.client

    # -- the lock-delay ------------------------------------------------------

    def placeOf(self, key: bytes, token: int) -> Optional[Tuple[float, float, object, bool]]:
        """
        C{(grantedAt, expiresAt, client, delayed)} of the place C{token}
        takes in C{key}: a live grant (C{delayed} False), or one that
        expired and keeps its place until C{expiresAt} (the lock-delay);
        None when it takes none.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        extra = self._clients[slot]
        shared = extra.shared if type(extra) is _Extra else None
        if shared is None:
            if self._tokens[slot] != token:
                return None
            if type(extra) is _Extra:
                return self._granted[slot], self._expires[slot], extra.client, extra.delayed
            return self._granted[slot], self._expires[slot], extra, False
        grant = shared.grants.get(token)
        if grant is None:
            return None
        return grant.grantedAt, grant.expiresAt, grant.client, grant.delayed

    def startDelay(self, key: bytes, token: int, until: float) -> None:
        """
        The grant C{token} of C{key} expired: it is no longer held (its
        token is STALE, and L{newest} passes it by) but keeps its place in
        the key until C{until}, when its expiry comes due again and frees
        the place (L{expire}).
        """
        slot = self._keys[key]
        extra = self._extraAt(slot)
        shared = extra.shared
        if shared is None:
            assert self._tokens[slot] == token
            extra.delayed = True
            self._expires[slot] = until
            return
        grant = shared.grants[token]
        grant.delayed = True
        self._moveShared(key, token, grant, until)

    def delayedUntil(self, key: bytes) -> Optional[float]:
        """
        When the last place of C{key} kept by the lock-delay frees, or None
        when none is.
        """
        slot = self._keys.get(key)
        extra = self._clients[slot] if slot is not None else None
        if type(extra) is not _Extra:
            return None
        shared = extra.shared
        if shared is None:
            return self._expires[slot] if extra.delayed else None  # type: ignore[index]
        ends = [grant.expiresAt for grant in shared.grants.values() if grant.delayed]
        return max(ends) if ends else None

    def newest(self, key: bytes) -> Tuple[int, Optional[bytes]]:
        """
        C{(token, holder name)} of C{key}'s newest live grant (highest
        token), what an observer is shown; C{(0, None)} when no grant
        holds it (free, or only places kept by the lock-delay).
        """
        slot = self._keys.get(key)
        if slot is None:
            return 0, None
        extra = self._clients[slot]
        if type(extra) is not _Extra:
            return self._tokens[slot], self._names[slot]
        shared = extra.shared
        if shared is None:
            if extra.delayed:
                return 0, None
            return self._tokens[slot], self._names[slot]
        # Grants are kept in the order they were made, so the newest is
        # usually last; a heal may add older ones after it, hence the max.
        newest, name = 0, None
        for token, grant in shared.grants.items():
            if token > newest and not grant.delayed:
                newest, name = token, grant.name
        return newest, name

    def nameOfGrant(self, key: bytes, token: int) -> Optional[bytes]:
        """
        The holder name of the grant (or place) C{token} of C{key}.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        shared = self._sharedAt(slot)
        if shared is None:
            return self._names[slot] if self._tokens[slot] == token else None
        grant = shared.grants.get(token)
        return grant.name if grant is not None else None

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
        tokens, granted, expires = self._tokens, self._granted, self._expires
        clients, names = self._clients, self._names
        for key, slot in self._keys.items():
            extra = clients[slot]
            if type(extra) is _Extra and (extra.shared is not None or extra.delayed):
                for token, grantedAt, expiresAt, share, name, delayed in self.sharedGrantsOf(key):
                    yield key, token, grantedAt, expiresAt, share, name, delayed
            else:
                yield key, tokens[slot], granted[slot], expires[slot], EXCLUSIVE, names[slot], False

    def isShared(self, key: bytes) -> bool:
        """
        Whether C{key} is held in shared form (readers, or a semaphore):
        then L{sharedGrantsOf} lists its grants, and every per-key query
        (L{tokenOf}, L{expiresAt}, L{holder}...) shows the one that runs
        out first.
        """
        slot = self._keys.get(key)
        return slot is not None and self._sharedAt(slot) is not None

    def takeWaiters(self) -> List[Waiter]:
        """
        Empty every queue (this node stops serving); holders stay.

        @return: the waiters that were queued, in queue order per key.
        """
        orphans: List[Waiter] = []
        clients = self._clients
        for slot in self._keys.values():
            extra = clients[slot]
            if type(extra) is _Extra and extra.queue is not None:
                orphans.extend(self._unqueue(slot, extra))
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
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients = []
        self._names = []
        self._free = []
