# -*- test-case-name: tests.server.test_http -*-
"""
What happened on the node: C{GET /events} (the event ring, read from a
sequence number on) and C{GET /locks/stats} (the busiest keys'
statistics), both from the operator's view (L{Monitor}).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from twisted.web.server import Request

from lockservice.server.monitor import Monitor
from lockservice.server.webjson import Items, NodeResource, jsonPieces, queryArg, queryInt, queryKey

STATS_LIMIT = 100       # keys on /locks/stats (default)
STATS_MAX = 1000
EVENTS_LIMIT = 1000     # events per /events answer (default and most)


def keyStats(monitor: Monitor, limit: int = STATS_LIMIT) -> Dict[str, Any]:
    """
    The busiest keys' statistics, most active first.
    """
    return {
        "tracked": len(monitor.keys),
        "capacity": monitor.keys.capacity,
        "keys": [dict(key=k.decode("utf-8", "replace"), **record.asDict())
                 for k, record in monitor.keys.top(limit)],
    }


def recentEvents(monitor: Monitor, since: int = 0, key: Optional[bytes] = None,
                 limit: int = EVENTS_LIMIT) -> Dict[str, Any]:
    """
    The events after C{since}; C{gap} (with C{missed}, how many) says that
    some of them are gone from the ring: the reader fell behind by more
    than the ring holds.  C{oldest} is the oldest sequence number kept.
    """
    ring = monitor.events
    missed = ring.missed(since)
    found, nxt = ring.since(since, key, limit)
    return {"events": [event.asDict() for event in found], "next": nxt,
            "oldest": ring.oldest, "gap": missed > 0, "missed": missed}


def statsParts(monitor: Monitor, limit: int = STATS_LIMIT) -> List[Tuple[str, Any]]:
    """
    L{keyStats} as L{jsonPieces} parts, the keys turned into JSON a step at
    a time.
    """
    return [("tracked", len(monitor.keys)), ("capacity", monitor.keys.capacity),
            ("keys", Items((dict(key=k.decode("utf-8", "replace"), **record.asDict()), 1)
                           for k, record in monitor.keys.top(limit)))]


def eventsParts(monitor: Monitor, since: int = 0, key: Optional[bytes] = None,
                limit: int = EVENTS_LIMIT) -> Iterator[Tuple[str, Any]]:
    """
    L{recentEvents} as L{jsonPieces} parts, the events turned into JSON a
    step at a time.  Nothing is read before the first step: a burst of
    requests costs the reactor turn that receives them nothing but their
    parsing.
    """
    ring = monitor.events
    missed = ring.missed(since)
    found, nxt = ring.since(since, key, limit)
    yield "events", Items((event.asDict(), 1) for event in found)
    yield "next", nxt
    yield "oldest", ring.oldest
    yield "gap", missed > 0
    yield "missed", missed


class EventsResource(NodeResource):
    def render_GET(self, request: Request) -> Any:
        assert self.monitor is not None
        return self.stream(request, jsonPieces(eventsParts(
            self.monitor,
            since=queryInt(request, b"since", 0, 0, 2**63),
            key=queryKey(queryArg(request, b"key")),
            limit=queryInt(request, b"limit", EVENTS_LIMIT, 1, EVENTS_LIMIT),
        )))
