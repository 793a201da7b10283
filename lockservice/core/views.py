"""
What a lock table shows of its keys and grants (the service, replication
and the operator's view read it): nothing here changes the table.
"""

from __future__ import annotations

from itertools import islice
from typing import Iterator, List, Optional, Tuple

from lockservice.core.holder import Holder
from lockservice.core.replica import Change
from lockservice.core.shares import EXCLUSIVE, READ_WRITE
from lockservice.core.slots import KEPT, LIVE, GrantSlots, _GrantInfo
from lockservice.core.waiters import WaitQueue, nameOf


class TableViews(GrantSlots):
    """
    The queries of a L{lockservice.core.table.LockTable}.
    """

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
        if key not in self._keys:
            return None
        record = self._records.get(key)
        queue = record.queue if record is not None else None
        return queue.length if queue is not None else 0

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
