# -*- test-case-name: tests.server.test_leases -*-
"""
The service's deadlines: when queued acquires stop waiting, and when
leases run out, plus the one reactor alarm that rings for the earliest.

Pure bookkeeping: nothing here imports Twisted or knows the lock table.
The time is passed in, validity is asked of the caller (a lease comes
due as C{(key, token)}: a key may have several grants, each with its own
deadline), and the caller acts on what comes due.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from math import ceil, inf
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Generic,
    List,
    Optional,
    Protocol,
    Tuple,
    TypeVar,
    Union,
)

# Deadlines handled per reactor turn, for each kind: when more are due
# (10,000 waits that run out together), the rest wait for the next turn,
# so other clients' requests are served in between instead of after the
# whole pile.
TIMER_BUDGET = 1000

# A lease entry: which grant.  Several grants of one key (shared keys) are
# several entries.
LeaseEntry = Tuple[bytes, int]


class Clock(Protocol):
    """
    The part of C{IReactorTime} the alarm needs.
    """

    def seconds(self) -> float: ...

    def callLater(self, delay: float, callable: Callable[..., Any], *args: object,
                  **kwargs: object) -> Any: ...


def leaseBucket(at: float) -> int:
    """
    The millisecond bucket of a lease deadline: bucket C{b} holds the
    deadlines in C{((b - 1) / 1000, b / 1000]}, so a deadline C{<= now}
    is never in a bucket after C{leaseBucket(now)}.
    """
    return ceil(at * 1000)


class Alarm:
    """
    One reactor timer for the earliest of many deadlines.

    While it rings (C{fire} works through the due deadlines, or a budget of
    them) it is not re-armed; afterwards it is armed for C{nextDue()}, at
    once (the next reactor turn) when more are already due.  An exception
    in C{fire} never leaves it unarmed.
    """

    __slots__ = ("clock", "fire", "nextDue", "call", "at", "firing")

    def __init__(self, clock: Clock, fire: Callable[[float], None],
                 nextDue: Callable[[], Optional[float]]) -> None:
        self.clock = clock
        self.fire = fire
        self.nextDue = nextDue
        self.call: Any = None
        self.at = inf
        self.firing = False

    def arm(self, at: float) -> None:
        if self.firing or at >= self.at:
            return
        self.cancel()
        self.at = at
        self.call = self.clock.callLater(max(0.0, at - self.clock.seconds()), self._ring)

    def rearm(self) -> None:
        if self.firing:
            return  # armed when it is done
        self.cancel()
        due = self.nextDue()
        if due is not None:
            self.arm(due)

    def cancel(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None
        self.at = inf

    def _ring(self) -> None:
        at = self.at
        self.call = None
        self.at = inf
        self.firing = True
        try:
            self.fire(at)
        finally:
            self.firing = False
            self.rearm()


class HasDeadline(Protocol):
    deadline: float


W = TypeVar("W", bound=HasDeadline)


class WaitDeadlines(Generic[W]):
    """
    When queued acquires stop waiting: a heap of C{(deadline, sequence,
    waiter)}.  The waiter's own C{deadline} says whether its entry is still
    live: a waiter that leaves its queue otherwise gets C{deadline = 0}
    (L{forget}) and its entry is skipped later, or dropped by a rebuild when
    such entries pile up.
    """

    def __init__(self) -> None:
        self.heap: List[Tuple[float, int, W]] = []
        self._seq = 0
        self._stale = 0

    def __len__(self) -> int:
        return len(self.heap)

    def add(self, waiter: W, deadline: float) -> None:
        waiter.deadline = deadline
        self._seq += 1
        heappush(self.heap, (deadline, self._seq, waiter))

    def nextDue(self) -> Optional[float]:
        return self.heap[0][0] if self.heap else None

    def due(self, now: float, budget: int) -> List[W]:
        """
        Take up to C{budget} waiters whose wait runs out by C{now}, earliest
        first (their C{deadline} is reset).
        """
        heap = self.heap
        out: List[W] = []
        while heap and heap[0][0] <= now and len(out) < budget:
            deadline, _, waiter = heappop(heap)
            if waiter.deadline != deadline:
                self._stale -= 1
                continue
            waiter.deadline = 0.0
            out.append(waiter)
        return out

    def forget(self, waiter: W, mayRebuild: bool = True) -> bool:
        """
        C{waiter} left its queue before its wait ran out: its entry is now
        stale.

        @return: True when the heap was rebuilt (the alarm should look
            again).
        """
        if not waiter.deadline:
            return False
        waiter.deadline = 0.0
        self._stale += 1
        if mayRebuild and self._stale > 4096 and 2 * self._stale > len(self.heap):
            self.heap = [e for e in self.heap if e[2].deadline == e[0]]
            heapify(self.heap)
            self._stale = 0
            return True
        return False

    def clear(self) -> None:
        self.heap = []
        self._stale = 0


class LeaseDeadlines:
    """
    Lease deadlines, by millisecond bucket (L{leaseBucket}): a heap of
    bucket numbers, and per bucket the grants whose lease ends in it (one
    entry while it is the only one, else a list of entries).  Grants made
    close together share a bucket, so a grant costs about one list slot
    here instead of a heap entry of its own; the deadline itself stays with
    the grant.

    An exclusive grant (a key's only holder) is filed as its bare key: its
    token and deadline are the key's current ones (the caller's
    C{currentGrant(key)}, C{(token, expiresAt)} or None when free), so the
    entry is live while the key's current grant, whichever it is by then,
    ends in that bucket.  A grant of a shared key (one of several) is filed
    as C{(key, token)}: each ends by its own deadline (the caller's
    C{expiresAt(key, token)}, None once that grant has ended).  Not storing
    the token of an exclusive grant saves about 40 bytes per held key.

    A release, renewal or hand-over leaves its old entry behind (skipped
    when it comes up: the grant's deadline is no longer in that bucket);
    L{crowded} says when they pile up, and the caller rebuilds.
    """

    def __init__(self, expiresAt: Callable[[bytes, int], Optional[float]],
                 currentGrant: Callable[[bytes], Optional[Tuple[int, float]]]) -> None:
        self.expiresAt = expiresAt
        self.currentGrant = currentGrant
        self.buckets: Dict[int, Union[bytes, LeaseEntry, List[Union[bytes, LeaseEntry]]]] = {}
        self.order: List[int] = []
        self.entries = 0
        # Due leases left over by the per-turn budget, in expiry order:
        # handled first in the next turn (so a crowded bucket is scanned
        # once, not once per turn).
        self.backlog: Deque[LeaseEntry] = deque()

    def file(self, key: bytes, token: int, expiresAt: float, shared: bool = False) -> None:
        """
        File the grant C{token} of C{key}, whose lease ends at C{expiresAt}:
        C{shared} when it is one of a shared key's grants (then it is filed
        with its token), else it must be the key's only holder.
        """
        entry: Union[bytes, LeaseEntry] = (key, token) if shared else key
        bucket = leaseBucket(expiresAt)
        entries = self.buckets.get(bucket)
        if entries is None:
            self.buckets[bucket] = entry
            heappush(self.order, bucket)
        elif isinstance(entries, list):
            entries.append(entry)
        else:
            self.buckets[bucket] = [entries, entry]
        self.entries += 1

    def crowded(self, grants: int) -> bool:
        """
        Whether the entries left behind outnumber the C{grants} held enough
        to rebuild.
        """
        return self.entries > 2 * grants + 4096

    def clear(self) -> None:
        self.buckets = {}
        self.order = []
        self.entries = 0
        self.backlog.clear()

    def bucketEntries(self, bucket: int) -> List[LeaseEntry]:
        """
        The grants whose lease (still) ends in C{bucket}, as C{(key, token)}:
        entries left behind by a release, renewal or hand-over are skipped
        (a key's bare entry is live only while its current grant ends in
        C{bucket}), and so is a grant entered twice.
        """
        entries = self.buckets.get(bucket)
        if entries is None:
            return []
        expiresAt, currentGrant = self.expiresAt, self.currentGrant
        each: Any = entries if type(entries) is list else (entries,)
        live: Dict[LeaseEntry, None] = {}
        for entry in each:
            if type(entry) is bytes:
                grant = currentGrant(entry)
                if grant is not None and leaseBucket(grant[1]) == bucket:
                    live[(entry, grant[0])] = None
            else:
                at = expiresAt(entry[0], entry[1])
                if at is not None and leaseBucket(at) == bucket:
                    live[entry] = None
        return list(live)

    def _drop(self, bucket: int) -> None:
        entries = self.buckets.pop(bucket, None)
        if entries is not None:
            self.entries -= len(entries) if type(entries) is list else 1

    def nextDue(self) -> Optional[float]:
        if self.backlog:
            return 0.0  # due already: the next reactor turn
        order = self.order
        while order:
            bucket = order[0]
            live = self.bucketEntries(bucket)
            if live:
                # The latest deadline of the first bucket: at most a
                # millisecond after the others, so they expire together.
                expiresAt = self.expiresAt
                return max(expiresAt(key, token) or 0.0 for key, token in live)
            heappop(order)
            self._drop(bucket)
        return None

    def due(self, now: float, budget: int) -> List[LeaseEntry]:
        """
        Take up to C{budget} grants whose lease ran out by C{now}, in
        C{(deadline, key, token)} order; the rest of a crowded bucket waits
        in the backlog for the next call.
        """
        out: List[LeaseEntry] = []
        backlog = self.backlog
        while backlog and len(out) < budget:
            out.append(backlog.popleft())
        last = leaseBucket(now)
        order = self.order
        expiresAt = self.expiresAt
        # Not due yet: filed back after the loop (filing them at once
        # would bring their bucket up again).
        later: List[LeaseEntry] = []
        while order and order[0] <= last and len(out) < budget:
            bucket = heappop(order)
            live = self.bucketEntries(bucket)
            self._drop(bucket)
            due: List[Tuple[float, bytes, int]] = []
            for key, token in live:
                at = expiresAt(key, token)
                if at is None:
                    continue
                if at <= now:
                    due.append((at, key, token))
                else:
                    later.append((key, token))
            # The same order as one heap of (deadline, key, token) would give.
            due.sort()
            room = budget - len(out)
            out.extend((key, token) for _, key, token in due[:room])
            backlog.extend((key, token) for _, key, token in due[room:])
        for key, token in later:
            at = expiresAt(key, token)
            if at is not None:
                # With its token: right for any grant (these are few).
                self.file(key, token, at, shared=True)
        return out
