"""
Where the lock table keeps its grants: a structure of arrays of slots,
one per grant, and a record per key that has more than one exclusive
grant or waiters; the primitives every rule of the table is written with.
"""

from __future__ import annotations

from array import array
from heapq import heapify, heappop, heappush
from typing import Dict, List, Optional, Tuple

from lockservice.core.shares import EXCLUSIVE, fits, kindOf
from lockservice.core.tokens import TokenIssuer
from lockservice.core.waiters import WaitQueue

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
    place of the bare client, for a grant that was renewed, expired or
    dropped.
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
    @ivar heap: while the key has two grants or more, C{(expiresAt,
        token)} of every grant, plus stale entries of grants ended or
        moved since (skipped when they come up): the grant that runs out
        first in O(log n).  (A key's one grant is its first to run out: a
        second grant makes the heap anew.)
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


class GrantSlots:
    """
    The grants of a lock table in slots, and the records of its keys (see
    L{lockservice.core.table.LockTable}).
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

    def _place(self, key: bytes, record: Optional[_Key], slot: int, token: int,
               grantedAt: float, expiresAt: float, client: object,
               name: Optional[bytes] = None) -> int:
        """
        Put the grant C{token} of C{key} in C{slot} (the key's own, when
        its last grant ended or is replaced), or in a free or new one
        (C{slot} -1), and make it one of the key's grants: C{record}'s, or
        the key's only one when C{record} is None.

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
        keys = self._keys
        if record is None:
            keys[key] = slot
            return slot
        grants = record.grants
        grants[token] = slot
        if record.share != EXCLUSIVE:
            self.sharedGrants += 1
        if len(grants) == 1:
            keys[key] = slot
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
        File the (new) deadline of grant C{token} in C{record}'s heap (the
        key has two grants or more).
        """
        grants = record.grants
        if len(grants) == 2 or len(record.heap) > 2 * len(grants) + 16:
            # Its second grant, or mostly stale entries: make it anew.
            expires = self._expires
            record.heap = [(expires[slot], held) for held, slot in grants.items()]
            heapify(record.heap)
        else:
            heappush(record.heap, (expiresAt, token))

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
        if record is not None and len(record.grants) > 1:
            self._file(record, token, expiresAt)
            self._lead(key, record)

    def _newRecord(self, key: bytes, share: int) -> _Key:
        """
        The record of free C{key}, for its first grant of C{share} (a
        reader's, or a semaphore's).
        """
        record = self._records[key] = _Key(share)
        return record

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
            ended = self._clients[slot] = _GrantInfo(None)  # nobody holds it
            ended.state = ENDED
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
