# -*- test-case-name: tests.test_events -*-
"""
A bounded ring of recent events (grants, releases, expiries, ... peer
changes), numbered by a sequence that never repeats within a process, so
a reader can ask for "everything after N" and follow the stream.

Pure: the caller gives each event's time.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Deque, Dict, List, Optional, Tuple

GRANT = "grant"
RELEASE = "release"
EXPIRY = "expiry"
RENEWAL = "renewal"
WITHDRAWAL = "withdrawal"
TIMEOUT = "timeout"
FORCE_RELEASE = "force-release"
PROMOTION = "promotion"
HANDOFF = "handoff"
PEER_UP = "peer-up"
PEER_DOWN = "peer-down"

TYPES = (GRANT, RELEASE, EXPIRY, RENEWAL, WITHDRAWAL, TIMEOUT, FORCE_RELEASE,
         PROMOTION, HANDOFF, PEER_UP, PEER_DOWN)


class Event:
    """
    One event; C{key}, C{token}, C{who} and C{detail} are None where they
    do not apply (a peer event has no key).

    The ring stores plain tuples (cheap on the hot path) and makes an
    L{Event} only when one is read; a detail given as a format and a
    number of seconds is formatted then too.
    """

    __slots__ = ("seq", "time", "type", "key", "token", "who", "_detail", "_seconds")

    def __init__(self, seq: int, time: float, type: str, key: Optional[bytes],
                 token: Optional[int], who: Optional[str], detail: Optional[str],
                 seconds: Optional[float] = None) -> None:
        self.seq = seq
        self.time = time
        self.type = type
        self.key = key
        self.token = token
        self.who = who
        self._detail = detail
        self._seconds = seconds

    @property
    def detail(self) -> Optional[str]:
        if self._seconds is not None and self._detail is not None:
            return self._detail % self._seconds
        return self._detail

    def asDict(self) -> Dict[str, Any]:
        return {
            "seq": self.seq,
            "time": round(self.time, 6),
            "type": self.type,
            "key": self.key.decode("utf-8", "replace") if self.key is not None else None,
            "token": self.token,
            "who": self.who,
            "detail": self.detail,
        }


_Entry = Tuple[int, float, str, Optional[bytes], Optional[int], Optional[str],
               Optional[str], Optional[float]]


class EventRing:
    """
    The last C{capacity} events.  Sequence numbers start at 1 and rise by
    one per event, so the event after C{since} is found in O(1).
    """

    def __init__(self, capacity: int = 10000) -> None:
        self.capacity = capacity
        self._events: Deque[_Entry] = deque(maxlen=capacity)
        self.last = 0  # the sequence number of the newest event (0: none yet)

    def __len__(self) -> int:
        return len(self._events)

    def add(self, time: float, type: str, key: Optional[bytes] = None,
            token: Optional[int] = None, who: Optional[str] = None,
            detail: Optional[str] = None, seconds: Optional[float] = None) -> None:
        """
        Record an event.  C{detail} may be a %-format for C{seconds}
        (C{"after %.3f s"}), formatted only if the event is read.
        """
        self.last += 1
        self._events.append((self.last, time, type, key, token, who, detail, seconds))

    @property
    def oldest(self) -> int:
        """
        The sequence number of the oldest event still in the ring (that of
        the next event when the ring is empty).
        """
        return self._events[0][0] if self._events else self.last + 1

    def missed(self, since: int) -> int:
        """
        How many events after C{since} are no longer in the ring (a reader
        that fell behind by more than the ring holds).
        """
        return max(0, min(self.oldest, self.last + 1) - max(since, 0) - 1)

    def since(self, since: int = 0, key: Optional[bytes] = None,
              limit: int = 1000) -> Tuple[List[Event], int]:
        """
        Events with C{seq > since}, oldest first, at most C{limit} of
        them, only those of C{key} when it is given.

        @return: the events and the sequence number to pass as C{since}
            next time (every event up to it has been looked at).
        """
        events = self._events
        if not events or since >= self.last:
            return [], max(since, 0) if since <= self.last else self.last
        first = events[0][0]
        start = max(0, since - first + 1)
        found: List[Event] = []
        nxt = self.last
        for entry in islice(events, start, None):
            if key is not None and entry[3] != key:
                continue
            if len(found) >= limit:
                nxt = found[-1].seq
                break
            found.append(Event(*entry))
        return found, nxt
