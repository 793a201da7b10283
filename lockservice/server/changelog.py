# -*- test-case-name: tests.server.test_monitor -*-
"""
The monitor's log of noted changes, and what is derived from it when
something reads it: the event ring, the per-key statistics and the
per-second series (L{lockservice.core}'s L{EventRing}, L{KeyStats},
L{Series}).

The L{Monitor<lockservice.server.monitor.Monitor>} (or, for grants and
releases, the service's fan-out through the monitor's lane) appends one
tuple per change to L{ChangeLog.log} (its hot path appends directly); L{ChangeLog.fold}
counts a batch of them at once, when a page or a check reads, or when the
log reaches L{FOLD_AT} entries.  The ring keeps the log's entries as they
are and makes events of them only when they are read (L{ChangeLog._decoder}).
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter
from typing import Any, Callable, List, Tuple

from twisted.internet.interfaces import IReactorTime

from lockservice.core import events as ev
from lockservice.core.events import TIMEOUT, EventRing
from lockservice.core.series import Series
from lockservice.core.sketch import KeyStats

# Changes noted before they are folded into the events, statistics and
# series even if nobody reads them (bounds the log's memory).
FOLD_AT = 1024

# The kinds of noted change (the first item of a log entry; its second
# is the monotonic time, its third the key, as the event ring wants).
GRANTED, DROPPED, QUEUED, ENDED, RENEWED, EVENT = range(6)

# The entries that are events, picked by C-level passes (no Python frame
# per entry): all but the queued acquires.
_kindOf, _IS_NOT_QUEUED = itemgetter(0), QUEUED.__ne__


class ChangeLog:
    """
    @ivar log: the changes noted and not folded yet.  The monitor appends
        to it on every change, so it is never replaced, only emptied.
    @ivar queuedNoted: a L{QUEUED} entry is in the log (set by the monitor).
    @ivar events: the event ring, as of the last fold.
    @ivar keys: the per-key statistics, as of the last fold.
    @ivar series: the per-second series, as of the last fold.
    """

    def __init__(self, clock: IReactorTime, wallTime: Callable[[], float],
                 events: int, trackedKeys: int, seriesSpan: int) -> None:
        self.clock = clock
        self.wallTime = wallTime
        self.events = EventRing(events, self._decoder)
        self.queuedNoted = False
        self.keys = KeyStats(trackedKeys)
        self.series = Series(seriesSpan)
        self.log: List[Tuple[Any, ...]] = []

    def fold(self) -> None:
        """
        Fold the noted changes into the events, statistics and series, in
        the order they happened.  The event ring takes the log's entries
        as they are (L{_decoder} reads them when a page does); the
        statistics and the series are counted here, one loop over the
        batch with only counters per change (what a record derives is
        counted when it is read: L{KeyRecord}).
        """
        if not self.log:
            return
        log = self.log.copy()
        self.log.clear()  # in place: the monitor holds the list
        if self.queuedNoted:
            # A queued acquire is counted, not an event.
            self.queuedNoted = False
            self.events.extend(list(compress(log, map(_IS_NOT_QUEUED, map(_kindOf, log)))))
        else:
            self.events.extend(log)
        keys = self.keys
        recordOf = keys.record
        series = self.series
        _GRANTED, _DROPPED, _QUEUED, _ENDED = GRANTED, DROPPED, QUEUED, ENDED  # locals
        # The series counts per whole second: a batch per second, not a
        # call per event.  The log is in time order, so a second ends when
        # an entry reaches the next one (and, should a time go back, when
        # one is before it).
        second = end = -1.0
        grants = waits = holds = 0
        holdTotal = holdMax = 0.0
        for entry in log:
            kind, now = entry[0], entry[1]
            if now >= end or now < second:
                if grants or waits or holds:
                    series.add(second, grants, waits, holds, holdTotal, holdMax)
                second = now // 1
                end = second + 1
                grants = waits = holds = 0
                holdTotal = holdMax = 0.0
            # Per change only counters (and the hold time's sketch): the
            # record derives its activity and the zero waits of grants at
            # once when read (KeyRecord).
            if kind == _GRANTED:
                key = entry[2]
                record = recordOf(key)
                record.grants += 1
                waited = entry[5]
                if waited != 0.0:
                    record.addGrantWait(waited)
                grants += 1
            elif kind == _DROPPED:
                key, heldFor = entry[2], entry[5]
                record = recordOf(key)
                if entry[6]:
                    record.expiries += 1  # (the releases are the hold's count less these)
                record.hold.add(heldFor)
                holds += 1
                holdTotal += heldFor
                if heldFor > holdMax:
                    holdMax = heldFor
            elif kind == _QUEUED:
                key = entry[2]
                record = recordOf(key)
                record.waits += 1
                waits += 1
            elif kind == _ENDED and entry[5] == TIMEOUT:
                keys.timedOut(entry[2], entry[4])
            # renewals and the other events: events only
        if grants or waits or holds:
            series.add(second, grants, waits, holds, holdTotal, holdMax)

    def _decoder(self) -> Callable[[Tuple[Any, ...]], Tuple[Any, ...]]:
        """
        What turns a noted change into its event's fields, for one read
        of the ring: its wall-clock time is its monotonic time moved by
        the current offset between the two clocks.
        """
        offset = self.wallTime() - self.clock.seconds()

        def decode(entry: Tuple[Any, ...]) -> Tuple[Any, ...]:
            kind, wall, key = entry[0], entry[1] + offset, entry[2]
            if kind == GRANTED:
                _, _, _, token, owner, waited, queued = entry
                if queued:
                    return wall, ev.GRANT, key, token, owner, "after waiting %.3f s", waited
                return wall, ev.GRANT, key, token, owner, None, None
            if kind == DROPPED:
                _, _, _, token, owner, heldFor, expired, forced = entry
                if forced is not None:
                    return wall, ev.FORCE_RELEASE, key, token, owner, forced, None
                return (wall, ev.EXPIRY if expired else ev.RELEASE, key, token, owner,
                        "after %.3f s", heldFor)
            if kind == ENDED:
                _, _, _, who, waited, reason = entry
                return wall, reason, key, None, who, "after %.3f s", waited
            if kind == RENEWED:
                _, _, _, token, owner, lease = entry
                return wall, ev.RENEWAL, key, token, owner, "lease %.3f s", lease
            _, _, _, type, token, who, detail, seconds = entry  # EVENT
            return wall, type, key, token, who, detail, seconds

        return decode

    def note(self, entry: Tuple[Any, ...]) -> None:
        """
        Note a change off the hot path (which appends to C{log} itself).
        """
        log = self.log
        log.append(entry)
        if len(log) >= FOLD_AT:
            self.fold()
