# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
Releases a cut-off follower may not know of, so that a heal does not undo
them.

A heal merges the losing side's held keys into the winner: "a key held on
one side only is kept".  But an active cut off from a follower goes on
serving (for a moment, or for the whole partition on its side), while the
follower, promoted or not, keeps its copy of every grant it had received,
including those the active releases meanwhile.  Merging that copy back
would undo a release answered C{OK}.

So once a follower is lost, the active notes the releases of grants issued
before then (tokens up to the highest at that moment: a grant issued later
cannot be in the follower's copy), and those of the moments before, while
the follower was already silent.  That is bounded by the keys held at that
moment, whatever the partition's length.  The winner of the heal skips an
offered copy of a grant it released.  Expiries are not noted: each side
runs the lease on its own, and a renewal answered by the other side must
survive.  Everything is forgotten once every peer follows this node again
and has applied its snapshot (its old copy is gone).

A node promoted in place of its leader notes likewise, from its promotion
on, its releases of the grants it took over: the old active may come back
(resumed, healed) holding them.  The side that loses a heal brings its
notes to the winner with its held keys, and the winner drops its copy of
each (see merge.py): no release answered by either side is undone.

Pure: time is passed in.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Iterator, Optional, Set, Tuple

# Notes kept at most (about 100 bytes each); beyond, releases are not noted
# (the heal then keeps the other side's copy, as without notes).
MAX_NOTED = 1_000_000


class Releases:
    """
    The releases this node answered that a peer may not know of.

    @ivar watermark: while noting, the highest token a peer's copy may
        hold; None when every peer follows us.
    """

    def __init__(self, recentFor: float) -> None:
        """
        @param recentFor: how long releases are remembered before anything
            is known to be missed (a follower is found gone only after it
            has been silent for a while).
        """
        self.recentFor = recentFor
        self.watermark: Optional[int] = None
        # (key, token) of each noted release: a shared key may have several.
        self.noted: Set[Tuple[bytes, int]] = set()
        self._recent: Deque[Tuple[float, bytes, int]] = deque()

    def released(self, key: bytes, token: int, now: float) -> None:
        recent = self._recent
        recent.append((now, key, token))
        horizon = now - self.recentFor
        while recent[0][0] < horizon:
            recent.popleft()
        if self.watermark is not None and token <= self.watermark:
            self._note(key, token)

    def _note(self, key: bytes, token: int) -> None:
        if len(self.noted) < MAX_NOTED:
            self.noted.add((key, token))

    def startNoting(self, watermark: int, since: float) -> None:
        """
        A peer may hold copies of grants up to C{watermark} and may have
        missed our releases since C{since}: note them from now on (and
        those already answered since then).
        """
        self.watermark = max(watermark, self.watermark or 0)
        for at, key, token in self._recent:
            if at >= since and token <= watermark:
                self._note(key, token)

    def releasedHere(self, key: bytes, token: int) -> bool:
        """
        Whether this node released grant C{token} of C{key} while noting.
        """
        return (key, token) in self.noted

    def notes(self) -> Iterator[Tuple[bytes, int]]:
        """
        Every noted release, as (key, token): what this node brings to a
        heal it loses (see merge.py).
        """
        return iter(self.noted)

    def forget(self) -> None:
        """
        Every peer follows us again and has applied our snapshot (its
        offer came before, and its old copy is gone): nothing more to tell
        apart.
        """
        self.watermark = None
        self.noted.clear()
