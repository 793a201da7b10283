# -*- test-case-name: tests.core.test_keystats -*-
"""
Per-key statistics for the busiest keys, in bounded memory.

L{Sketch} summarises a stream of durations (mean exactly, quantiles within
a few percent) in L{Sketch.BUCKETS} counters; L{KeyStats}
keeps one pair of sketches and a few counters for each of at most
C{capacity} keys, dropping the least active ones when a new key needs room.

Pure: no I/O and no clock; durations are given by the caller.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Tuple


class Sketch:
    """
    A log-bucketed histogram (the DDSketch idea) over a fixed range: a
    value v of at least C{FLOOR} falls in bucket
    C{ceil(log(v / FLOOR) / log(GAMMA))}, so any quantile read back is
    within C{(GAMMA - 1) / 2} (about 7%) of a real sample's value.
    C{BUCKETS} buckets reach from one microsecond to C{CEILING} (about
    nine years); longer durations share the last bucket (read back as the
    longest seen).

    The counters are a list, made at the first value at or above
    C{FLOOR}: constant memory (about 2 kB a sketch in use), and counting
    a value costs a list index, not a dict's look-up and insert (the
    monitor's fold adds a hold time per release, inline:
    L{lockservice.server.changelog}).

    Durations below C{FLOOR} seconds are counted apart (reported as 0):
    one microsecond, the resolution the summaries are shown at, so that
    a lock held for 50 microseconds reads as that and not as 0.
    """

    GAMMA = 1.15
    FLOOR = 1e-6
    BUCKETS = 240
    # log2, not log: math.log takes an optional base, and parsing it costs
    # three times the logarithm (888 instructions a call against 269 on
    # CPython 3.11, callgrind); the bucket is the same, up to rounding.
    LOG2_GAMMA = math.log2(GAMMA)
    SCALE = 1 / FLOOR
    # Below it a value's bucket is below the last one, whatever the
    # rounding; at or above it, the last one.
    CEILING = FLOOR * GAMMA ** (BUCKETS - 2)

    __slots__ = ("count", "total", "low", "high", "counts", "zeros")  # zeros: samples below FLOOR

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = 0.0
        self.counts: Optional[List[int]] = None  # per bucket, from the first value counted
        self.zeros = 0

    def add(self, value: float) -> None:
        """
        Record one duration (seconds, >= 0).
        """
        # The names it reads are module globals bound once (not class
        # attributes and math's).
        if not value >= 0.0:  # negative, or NaN
            value = 0.0
        self.count += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        if value < _FLOOR:
            self.zeros += 1
            return
        counts = self.counts
        if counts is None:
            counts = self.counts = [0] * _BUCKETS
        if value < _CEILING:
            counts[_ceil(_log2(value * _SCALE) / _LOG2_GAMMA)] += 1
        else:
            counts[-1] += 1

    @property
    def mean(self) -> Optional[float]:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> Optional[float]:
        """
        The value below which a fraction C{q} of the samples lies (None
        when there are none).
        """
        if not self.count:
            return None
        # Nearest rank: the p99 of two samples is the larger one.
        rank = max(0, math.ceil(q * self.count) - 1)
        seen = self.zeros
        if rank < seen:
            return 0.0
        for index, count in enumerate(self.counts or ()):
            seen += count
            if rank < seen and index < _BUCKETS - 1:
                # The bucket (FLOOR GAMMA^(i-1), FLOOR GAMMA^i]: report its
                # middle, clamped to what was really seen.
                estimate = 2 * self.FLOOR * self.GAMMA ** index / (self.GAMMA + 1)
                return min(max(estimate, self.low), self.high)
        return self.high

    def summary(self) -> Dict[str, Optional[float]]:
        """
        Count, mean, p50, p99 and max, rounded for display.
        """
        def r(v: Optional[float]) -> Optional[float]:
            return None if v is None else round(v, 6)

        return {
            "count": self.count,
            "mean": r(self.mean),
            "p50": r(self.quantile(0.5)),
            "p99": r(self.quantile(0.99)),
            "max": r(self.high) if self.count else None,
        }


_FLOOR, _CEILING, _SCALE = Sketch.FLOOR, Sketch.CEILING, Sketch.SCALE
_BUCKETS, _LOG2_GAMMA = Sketch.BUCKETS, Sketch.LOG2_GAMMA
_ceil, _log2 = math.ceil, math.log2


class KeyRecord:
    """
    What is known of one key: activity counters and two sketches (every
    grant that ended is in C{hold}: its count is the releases and the
    expiries).

    The counters are what the monitor's fold updates per change; the rest
    is derived when read: C{activity} (every change counted) and the
    grants at once in the C{wait} sketch (a zero wait each).

    @ivar hold: the hold times (released or expired grants).
    @ivar waitedGrants: grants whose wait was not 0 (each in C{wait}
        already); the others are zero waits, counted into C{wait} when
        it is read.
    """

    __slots__ = ("grants", "timeouts", "expiries", "waits", "waitedGrants",
                 "hold", "_wait", "_zeroWaitsCounted", "rankFloor")

    def __init__(self, rankFloor: int = 0) -> None:
        # Added to its activity when the statistics choose which keys to
        # drop (KeyStats._evict), never shown.
        self.rankFloor = rankFloor
        self.grants = 0
        self.timeouts = 0
        self.expiries = 0
        self.waits = 0  # acquires that had to queue
        self.waitedGrants = 0
        self.hold = Sketch()
        self._wait = Sketch()
        self._zeroWaitsCounted = 0

    @property
    def releases(self) -> int:
        """
        The grants released: every grant that ended is in C{hold}, so
        those that did not expire (one counter per change less: counting
        costs an int object each, ~300 instructions, on the fold's path).
        """
        return self.hold.count - self.expiries

    @property
    def activity(self) -> int:
        """
        Every change on the key: grants, queued acquires, timeouts,
        expiries and releases.
        """
        return self.grants + self.waits + self.timeouts + self.hold.count

    @property
    def wait(self) -> Sketch:
        """
        The waits of the grants and of the acquires that timed out.
        """
        zeros = self.grants - self.waitedGrants - self._zeroWaitsCounted
        if zeros:
            wait = self._wait
            wait.count += zeros
            wait.zeros += zeros
            wait.low = 0.0
            self._zeroWaitsCounted += zeros
        return self._wait

    def addGrantWait(self, waited: float) -> None:
        """
        Count the wait of a grant (the grant is the caller's to count).
        """
        if waited != 0.0:  # a zero wait is derived from the grants
            self.waitedGrants += 1
            self._wait.add(waited)  # (in any order with the derived zeros)

    def asDict(self) -> Dict[str, object]:
        return {
            "grants": self.grants,
            "releases": self.releases,
            "queued": self.waits,
            "timeouts": self.timeouts,
            "expiries": self.expiries,
            "hold_seconds": self.hold.summary(),
            "wait_seconds": self.wait.summary(),
        }


class KeyStats:
    """
    Statistics for the (about) C{capacity} most active keys.

    Every event on a key counts as activity.  A key not tracked yet gets a
    record at once; when the table grows C{capacity/4} beyond C{capacity},
    the least active records are dropped down to C{capacity} in one sort,
    so the cost per event stays O(1) amortised (O(log n) for the sort) and
    memory stays bounded whatever the number of distinct keys.
    """

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._slack = max(1, capacity // 4)
        self._records: Dict[bytes, KeyRecord] = {}
        # The same dict, for a caller that counts a batch of events itself
        # (the monitor's fold): read a record, and call L{record} for a key
        # not in it.  Never replaced, so it may be kept.
        self.records = self._records
        self.evicted = 0
        self._rankFloor = 0  # a new record's (see _evict)

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: bytes) -> KeyRecord:
        """
        C{key}'s record, made (and room made for it) when it has none.
        """
        record = self._records.get(key)
        if record is None:
            if len(self._records) >= self.capacity + self._slack:
                self._evict()
            record = self._records[key] = KeyRecord(self._rankFloor)
        return record

    def _evict(self) -> None:
        # The least active go, of equally ranked ones the oldest records
        # first (a stable sort keeps the dict's order).  A record made
        # after an eviction is ranked as if it had the activity of the
        # busiest record that eviction dropped (the Space-Saving idea;
        # its figures stay its own): else a burst of new keys (a
        # pipeline's acquires, each counted before its release) would go
        # before it was counted twice, and keys seen once long ago would
        # keep out every new key for good (found from outside: 1,000 keys
        # used once kept 1,200 used ten times each out of the statistics).
        records = self._records  # in place: the monitor's fold holds it
        ranked = sorted(records.items(), key=lambda item: item[1].activity + item[1].rankFloor)
        dropped = len(ranked) - self.capacity
        self.evicted += dropped
        for key, _ in ranked[:dropped]:
            del records[key]
        last = ranked[dropped - 1][1]
        self._rankFloor = last.activity + last.rankFloor

    # -- the events counted --------------------------------------------------

    def granted(self, key: bytes, waited: float) -> None:
        record = self.record(key)
        record.grants += 1
        record.addGrantWait(waited)

    def queued(self, key: bytes) -> None:
        self.record(key).waits += 1

    def timedOut(self, key: bytes, waited: float) -> None:
        record = self.record(key)
        record.timeouts += 1
        record.wait.add(waited)

    def dropped(self, key: bytes, heldFor: float, expired: bool) -> None:
        record = self.record(key)
        if expired:
            record.expiries += 1
        record.hold.add(heldFor)  # (the releases are derived from it)

    # -- reading -------------------------------------------------------------

    def get(self, key: bytes) -> Optional[KeyRecord]:
        return self._records.get(key)

    def top(self, limit: int) -> List[Tuple[bytes, KeyRecord]]:
        """
        The C{limit} most active keys, most active first.
        """
        ranked = sorted(self._records.items(), key=lambda item: item[1].activity,
                        reverse=True)
        return ranked[:limit]

    def __iter__(self) -> Iterator[Tuple[bytes, KeyRecord]]:
        return iter(self._records.items())
