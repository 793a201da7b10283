# -*- test-case-name: tests.core.test_events -*-
"""
A bounded ring of recent events (grants, releases, expiries, ... peer
changes), numbered by a sequence that never repeats within a process, so
a reader can ask for "everything after N" and follow the stream.

Pure: the caller gives each event's time.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

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


# What the ring keeps per event: (time, type, key, token, who, detail,
# seconds) as add() records it, or an entry of its owner's own form
# (extend), which its decoder turns into that.  The key is always at
# index 2 (a reader may ask for one key's events).
_Entry = Tuple[Any, ...]
_Fields = Tuple[float, str, Optional[bytes], Optional[int], Optional[str], Optional[str],
                Optional[float]]


def _asIs(entry: _Entry) -> _Fields:
    return entry  # type: ignore[return-value]


class EventRing:
    """
    The last C{capacity} events.  Sequence numbers start at 1 and rise by
    one per event, so the event after C{since} is found in O(1): an
    event's number is not stored, it follows from its place in the ring.

    @ivar decoder: made once per read, gives the function that turns an
        entry added by L{extend} into the event's fields (the owner's
        entries are stored as they come, so adding costs no tuple per
        event).
    """

    def __init__(self, capacity: int = 10000,
                 decoder: Optional[Callable[[], Callable[[_Entry], _Fields]]] = None) -> None:
        self.capacity = capacity
        self._events: Deque[_Entry] = deque(maxlen=capacity)
        self.last = 0  # the sequence number of the newest event (0: none yet)
        self.decoder = decoder or (lambda: _asIs)

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
        self._events.append((time, type, key, token, who, detail, seconds))

    def extend(self, entries: List[_Entry]) -> None:
        """
        Record C{entries} as events, in order, as they are: the ring's
        L{decoder} reads them.
        """
        self._events.extend(entries)
        self.last += len(entries)

    @property
    def oldest(self) -> int:
        """
        The sequence number of the oldest event still in the ring (that of
        the next event when the ring is empty).
        """
        return self.last - len(self._events) + 1

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
        first = self.oldest
        start = max(0, since - first + 1)
        decode = self.decoder()
        found: List[Event] = []
        nxt = self.last
        for seq, entry in enumerate(islice(events, start, None), first + start):
            if key is not None and entry[2] != key:
                continue
            if len(found) >= limit:
                nxt = found[-1].seq
                break
            found.append(Event(seq, *decode(entry)))
        return found, nxt
