# -*- test-case-name: tests.server.test_observe -*-
"""
Observers of keys: the C{O} requests that wait for a key's newest live
grant to change.

An observer sends the token it last saw (its key's newest live grant, C{0}
when nothing held it).  It is answered at once when the key's newest live
grant is another one, else it waits here until a change makes it so (a
grant, a release, an expiry, a hand-over, a force-release, a heal's
merge) or until its wait runs out.  A change that leaves the newest grant
as it was (a renewal, the release of an older reader) answers nobody.

Observers of a key wait in groups by the token they sent, so a change
costs one look at the key's groups, not one per observer.  Waking them is
background work of the service (L{lockservice.server.chores}): a bounded
number of answers per reactor turn however many observers a change wakes,
each given the key's state as it is when its answer is written.

Observers never hold, queue for or delay a key: they count neither as
waiters nor as keys, only against their own limit per key (observers that
wait; one answered at once takes no place).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Protocol, Tuple

from lockservice.core import wire

# Default of --max-observers: observers waiting on one key at once.
DEFAULT_MAX_OBSERVERS = 10_000


class ObserverSink(Protocol):
    """
    Where an observer's answer goes (a client connection).
    """

    gone: bool

    def finishObserve(self, observation: "Observation", answer: bytes) -> None:
        """
        Answer C{observation} (sent by this connection) with C{answer}.
        """


class Observation:
    """
    One C{O} request.

    @ivar token: the token it sent (None for C{?}).
    @ivar deadline: (monotonic) time its wait runs out, 0 for none (or
        no longer waiting: see L{lockservice.server.deadlines}).
    @ivar answer: its answer once decided (the connection may hold it back
        behind an earlier C{O} of the same key).
    @ivar waiting: True while it waits here.
    """

    __slots__ = ("key", "token", "conn", "deadline", "answer", "waiting")

    def __init__(self, key: bytes, token: Optional[int], conn: ObserverSink) -> None:
        self.key = key
        self.token = token
        self.conn = conn
        self.deadline = 0.0
        self.answer: Optional[bytes] = None
        self.waiting = False


# A key's observers: the token they sent -> those observers, oldest first.
Groups = Dict[int, Dict[Observation, None]]


class KeyObservers:
    """
    Every waiting observer of one node, and the wake-up of those a change
    concerns.

    @ivar byKey: key -> its observers' groups; a key is here only while
        somebody observes it (the service looks here first at every
        change).
    """

    def __init__(self, newest: Callable[[bytes], Tuple[int, Optional[bytes]]],
                 runInChunks: Callable[[Iterator[object]], None],
                 later: Callable[[Callable[[], None]], object],
                 maxObservers: int = DEFAULT_MAX_OBSERVERS) -> None:
        """
        @param newest: C{(token, holder name)} of a key's newest live grant
            (L{lockservice.core.table.LockTable.newest}).
        @param runInChunks: runs background work a bounded chunk per
            reactor turn.
        @param later: calls its argument on the next reactor turn: the
            wake-up starts once the turn that changed the key is over, so
            several changes in one turn wake an observer once, with their
            outcome.
        """
        self.newest = newest
        self.runInChunks = runInChunks
        self.later = later
        self.maxObservers = maxObservers
        self.byKey: Dict[bytes, Groups] = {}
        self._counts: Dict[bytes, int] = {}
        self.count = 0
        # Keys changed since their observers were last looked at.
        self._changed: Dict[bytes, None] = {}
        self._waking = False
        # Bumped at every change: a waking key's newest grant is read again
        # only when something changed since it was last read.
        self._version = 0

    def __len__(self) -> int:
        return self.count

    def answerNow(self, observation: Observation) -> Optional[bytes]:
        """
        The answer to a new C{O} when it is answered at once (its token
        is C{?} or not the key's newest live grant), else None.
        """
        newest, holder = self.newest(observation.key)
        if observation.token is None or observation.token != newest:
            return wire.observed(observation.key, newest, holder)
        return None

    def full(self, key: bytes) -> bool:
        return self._counts.get(key, 0) >= self.maxObservers

    def add(self, observation: Observation) -> None:
        """
        C{observation} waits for a change of its key.
        """
        assert observation.token is not None
        key = observation.key
        groups = self.byKey.get(key)
        if groups is None:
            groups = self.byKey[key] = {}
        group = groups.get(observation.token)
        if group is None:
            group = groups[observation.token] = {}
        group[observation] = None
        observation.waiting = True
        self._counts[key] = self._counts.get(key, 0) + 1
        self.count += 1

    def remove(self, observation: Observation) -> bool:
        """
        C{observation} stops waiting (its connection went, its wait ran
        out, or it is answered): O(1).

        @return: False when it was not waiting.
        """
        if not observation.waiting:
            return False
        observation.waiting = False
        key = observation.key
        groups = self.byKey[key]
        token = observation.token
        assert token is not None
        group = groups[token]
        del group[observation]
        if not group:
            del groups[token]
            if not groups:
                del self.byKey[key]
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]
        self.count -= 1
        return True

    def state(self, key: bytes) -> bytes:
        """
        The answer that reports C{key}'s state now.
        """
        newest, holder = self.newest(key)
        return wire.observed(key, newest, holder)

    # -- changes -------------------------------------------------------------

    def changed(self, key: bytes) -> None:
        """
        C{key}'s grants changed: its observers whose token is no longer its
        newest live grant are answered, a bounded number per reactor turn.
        (The service calls this only for keys in L{byKey}.)
        """
        self._version += 1
        self._changed[key] = None
        if not self._waking:
            self._waking = True
            self.later(lambda: self.runInChunks(self._wake()))

    def _wake(self) -> Iterator[None]:
        try:
            changed = self._changed
            while changed:
                key = next(iter(changed))
                del changed[key]
                yield from self._wakeKey(key)
        finally:
            self._waking = False

    def _wakeKey(self, key: bytes) -> Iterator[None]:
        seen = -1
        newest, holder = 0, None
        while True:
            groups = self.byKey.get(key)
            if not groups:
                return
            if seen != self._version:
                seen = self._version
                newest, holder = self.newest(key)
            woken = next((token for token in groups if token != newest), None)
            if woken is None:
                return  # every observer left sees the newest grant
            observation = next(iter(groups[woken]))
            self.remove(observation)
            observation.conn.finishObserve(observation, wire.observed(key, newest, holder))
            yield None

    # -- the node stops serving ------------------------------------------------

    def takeAll(self) -> List[Observation]:
        """
        Stop every observer waiting here (this node no longer serves).

        @return: them, in no particular order.
        """
        taken = [o for groups in self.byKey.values() for group in groups.values()
                 for o in group]
        for observation in taken:
            observation.waiting = False
        self.byKey.clear()
        self._counts.clear()
        self._changed.clear()
        self.count = 0
        return taken
