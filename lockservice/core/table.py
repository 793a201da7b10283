# -*- test-case-name: tests.test_core -*-
"""
The lock table: holders, FIFO queues and fencing tokens.

Pure Python with no reactor: every call that depends on time is told the
current (monotonic) time, and answers with what must happen next.  The
service around it owns the clock and arms the timers.
"""

from __future__ import annotations

from array import array
from itertools import islice
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

    def client(self) -> object:
        """
        Who will hold the key if this waiter is granted: an opaque object
        the table keeps with the grant (one per client, shared by all its
        grants, so it costs no memory per key).  The service's waiters
        give their connection; a bare waiter stands for itself.
        """
        return self

    def holderName(self) -> Optional[str]:
        """
        The name this waiter is shown by (L{nameOf} its client).
        """
        return nameOf(self.client())


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
    What only some held keys need besides their holder: a renewal count,
    a queue of waiters.  Kept in the table's client list in place of the
    bare client, for a key that was renewed or is waited for.
    """

    __slots__ = ("client", "renewals", "queue")

    def __init__(self, client: object) -> None:
        self.client = client
        self.renewals = 0
        self.queue: Optional[WaitQueue] = None


class StaleHolder(LookupError):
    """
    A L{Holder} view was read after the grant it shows had ended (released,
    expired, handed over): read the table again.
    """


def nameOf(client: object) -> Optional[str]:
    """
    The name a client is shown by: its C{name} now (a connection that
    renames itself with C{I} is shown by its new name for every key it
    holds), or None for an unknown client.
    """
    return getattr(client, "name", None) if client is not None else None


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
        if slot is None or table._tokens[slot] != self.token:
            raise StaleHolder(f"the grant {self.token} of {self.key!r} has ended")
        return slot

    def __repr__(self) -> str:
        return f"<Holder {self.key!r} token {self.token}>"

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
        self._table._expires[self._slot()] = expiresAt

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
        extra = self._table._clients[self._slot()]
        return extra.renewals if type(extra) is _Extra else 0

    @property
    def queue(self) -> Optional[WaitQueue]:
        """
        The waiters, or None when nobody waits.
        """
        return self._table._queueAt(self._slot())

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
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients: List[object] = []
        # Free slot numbers: a list, not an array, because list.pop and
        # append cost a quarter of array's (80 ns per acquire + release),
        # and the int of a released key's slot is the one its dict entry
        # held, so no int is made.  A free slot costs 40 bytes here (its
        # arrays' 33 stay too) until a new key takes it.
        self._free: List[int] = []
        self.waiterCount = 0

    # -- slots -------------------------------------------------------------

    def _newSlot(self, token: int, grantedAt: float, expiresAt: float, client: object) -> int:
        free = self._free
        if free:
            slot = free.pop()
            self._tokens[slot] = token
            self._granted[slot] = grantedAt
            self._expires[slot] = expiresAt
            self._clients[slot] = client
            return slot
        self._tokens.append(token)
        self._granted.append(grantedAt)
        self._expires.append(expiresAt)
        self._clients.append(client)
        return len(self._clients) - 1

    def _freeSlot(self, key: bytes, slot: int) -> None:
        del self._keys[key]
        self._clients[slot] = None  # let the client (a closed connection) go
        self._free.append(slot)

    def _regrant(self, slot: int, token: int, grantedAt: float, expiresAt: float,
                 client: object) -> None:
        """
        The key of C{slot} passes to a new grant: its renewal count starts
        again, its queue stays.
        """
        self._tokens[slot] = token
        self._granted[slot] = grantedAt
        self._expires[slot] = expiresAt
        extra = self._clients[slot]
        if type(extra) is _Extra and extra.queue is not None:
            extra.client = client
            extra.renewals = 0
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
        # Its queue emptied: back to the bare client unless it was renewed.
        extra.queue = None
        if not extra.renewals:
            self._clients[slot] = extra.client

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

    def holding(self, key: bytes) -> Optional[Tuple[int, float, float, object]]:
        """
        C{(token, grantedAt, expiresAt, client)} of C{key}'s current grant,
        or None: what ending it (a release, an expiry) needs, in one look-up.
        """
        slot = self._keys.get(key)
        if slot is None:
            return None
        client = self._clients[slot]
        if type(client) is _Extra:
            client = client.client
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
        """
        key = waiter.key
        slot = self._keys.get(key)
        if slot is None:
            token = self.tokens.issue()
            expiresAt = now + waiter.lease
            # _newSlot, inline: this is every uncontended acquire.
            free = self._free
            if free:
                slot = free.pop()
                self._tokens[slot] = token
                self._granted[slot] = now
                self._expires[slot] = expiresAt
                self._clients[slot] = waiter.client()
            else:
                slot = len(self._clients)
                self._tokens.append(token)
                self._granted.append(now)
                self._expires.append(expiresAt)
                self._clients.append(waiter.client())
            self._keys[key] = slot
            return Grant(key, token, expiresAt, None)
        waiter.queuedAt = now
        waiter.queued = True
        extra = self._clients[slot]
        if type(extra) is not _Extra:
            extra = self._clients[slot] = _Extra(extra)
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
        if slot is None or self._tokens[slot] != token:
            return _NOT_HELD
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
        if slot is None or self._tokens[slot] != token or self._expires[slot] > now:
            return _NOT_HELD
        clients = self._clients
        if type(clients[slot]) is not _Extra:
            del self._keys[key]  # as in release
            clients[slot] = None
            self._free.append(slot)
            return _FREED
        return True, self._handOver(key, slot, now)

    def renew(self, key: bytes, token: int, lease: float, now: float) -> Optional[Holder]:
        """
        Extend the grant C{token} of C{key}: its lease runs C{lease} seconds
        from C{now}; the token does not change.

        @return: a view of the grant, or None (nothing changed) when
            C{token} does not hold the key, or its lease has already run out.
        """
        slot = self._keys.get(key)
        if slot is None or self._tokens[slot] != token or self._expires[slot] <= now:
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
        extra.queue.remove(waiter)
        if not extra.queue.length:
            self._unqueued(slot, extra)
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
        extra.queue.cut(first, last, count)
        if not extra.queue.length:
            self._unqueued(slot, extra)
        self.waiterCount -= count

    def _handOver(self, key: bytes, slot: int, now: float) -> Optional[Grant]:
        extra = self._clients[slot]
        if type(extra) is not _Extra or extra.queue is None:
            self._freeSlot(key, slot)
            return None
        queue = extra.queue
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
        if queue.length:
            extra.client = waiter.client()
            extra.renewals = 0
        else:
            self._clients[slot] = waiter.client()  # the _Extra goes
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

    def install(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        Record a holder learned from the active node (a standby's mirror).
        Waiters are never replicated, so the mirror holds none.  Installing
        the token that already holds the key only moves its expiry.
        """
        self.tokens.observe(token)
        slot = self._keys.get(key)
        if slot is None:
            self._keys[key] = self._newSlot(token, grantedAt, expiresAt, None)
        elif self._tokens[slot] == token:
            # The same grant again (a renewal, or a new snapshot): it keeps
            # the time it was first seen granted.
            self._expires[slot] = expiresAt
        else:
            self._regrant(slot, token, grantedAt, expiresAt, None)

    def drop(self, key: bytes, token: int) -> None:
        """
        Forget the mirrored holder C{token} of C{key}, if it still holds it.
        """
        slot = self._keys.get(key)
        if slot is not None and self._tokens[slot] == token and self._queueAt(slot) is None:
            self._freeSlot(key, slot)

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
        return orphans

    def clear(self) -> None:
        """
        Forget every holder and waiter (a fresh snapshot follows).
        """
        self.takeWaiters()
        self._keys.clear()
        self._tokens = array("Q")
        self._granted = array("d")
        self._expires = array("d")
        self._clients = []
        self._free = []
