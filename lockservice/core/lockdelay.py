"""
The lock-delay: an expired grant keeps its place in its key for a while,
so that a holder that was only paused can notice it lost the lock before
anyone else starts.
"""

from __future__ import annotations

from typing import Optional, Tuple

from lockservice.core.slots import KEPT, GrantSlots


class LockDelay(GrantSlots):
    """
    The places kept by the lock-delay, for a
    L{lockservice.core.table.LockTable}.
    """

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
