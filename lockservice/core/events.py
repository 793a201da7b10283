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
LONG_HOLD = "long-hold"
DEADLOCK = "deadlock"

TYPES = (GRANT, RELEASE, EXPIRY, RENEWAL, WITHDRAWAL, TIMEOUT, FORCE_RELEASE,
         PROMOTION, HANDOFF, PEER_UP, PEER_DOWN, LONG_HOLD, DEADLOCK)


class Event:
    """
    One event; C{key}, C{token}, C{who} and C{detail} are None where they
    do not apply (a peer event has no key).
    """

    __slots__ = ("seq", "time", "type", "key", "token", "who", "detail")

    def __init__(self, seq: int, time: float, type: str, key: Optional[bytes],
                 token: Optional[int], who: Optional[str], detail: Optional[str]) -> None:
        self.seq = seq
        self.time = time
        self.type = type
        self.key = key
        self.token = token
        self.who = who
        self.detail = detail

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


class EventRing:
    """
    The last C{capacity} events.  Sequence numbers start at 1 and rise by
    one per event, so the event after C{since} is found in O(1).
    """

    def __init__(self, capacity: int = 10000) -> None:
        self.capacity = capacity
        self._events: Deque[Event] = deque(maxlen=capacity)
        self.last = 0  # the sequence number of the newest event (0: none yet)

    def __len__(self) -> int:
        return len(self._events)

    def add(self, time: float, type: str, key: Optional[bytes] = None,
            token: Optional[int] = None, who: Optional[str] = None,
            detail: Optional[str] = None) -> Event:
        self.last += 1
        event = Event(self.last, time, type, key, token, who, detail)
        self._events.append(event)
        return event

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
        first = events[0].seq
        start = max(0, since - first + 1)
        found: List[Event] = []
        nxt = self.last
        for event in islice(events, start, None):
            if key is not None and event.key != key:
                continue
            if len(found) >= limit:
                nxt = found[-1].seq
                break
            found.append(event)
        return found, nxt
