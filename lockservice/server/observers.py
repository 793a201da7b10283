# -*- test-case-name: tests.server.test_monitor -*-
"""
The fan-out of the service's changes to whoever watches them: change
observers (replication, metrics: what the table now holds), activity
observers (the operator's view: who queued, waited, held and let go), and
mirror observers (told once per batch of changes learned from a peer:
replication on a standby, a heal's merge on the active).

An observer's bug must not leave the table half-updated or a client
unanswered: each call is guarded, and a failure is reported to the
service's internal-error counter.

Activity observers are attached with L{Observers.attach}.  The monitor is
told of grants and releases through its L{Lane}: the fan-out appends the
note to the monitor's log itself and calls it only when the change needs
more than a note (measured: 7.6% of a pair's instructions; see
L{Observers.granted}).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Protocol, Sequence

from lockservice.core.table import Change
from lockservice.server.changelog import DROPPED, FOLD_AT, GRANTED
from lockservice.server.monitor import ActivityObserver, Lane, Named


class ChangeObserver(Protocol):
    """
    Told of every change to the held keys (replication, metrics), before
    the client concerned is answered.
    """

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes]) -> None:
        """
        C{key} was granted to C{token} at C{grantedAt} until C{expiresAt}
        (monotonic seconds) after C{waited} seconds in the queue, under the
        holder name C{name}.
        """

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        """
        The grant C{token} of C{key} (granted at C{grantedAt}) now runs
        until C{expiresAt}.
        """

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        """
        The grant C{token} of C{key} ended after C{heldFor} seconds: released,
        or C{expired}.
        """

    def delayed(self, key: bytes, token: int, until: float) -> None:
        """
        The grant C{token} of C{key}, which expired (C{dropped} told so),
        keeps its place in the key until C{until} (the lock-delay).
        """

    def delayEnded(self, key: bytes, token: int) -> None:
        """
        The place the expired grant C{token} of C{key} kept has freed.
        """


class MirrorObserver(Protocol):
    """
    Told once per batch of changes the service mirrored from a peer (see
    L{lockservice.server.mirror.Mirroring.mirror}), after the table has them.
    """

    def mirrored(self, now: float,
                 changes: Sequence[Change]) -> None:
        """
        C{changes}: (key, token, grantedAt, expiresAt, share) of each grant
        installed, expiresAt None for each grant dropped, in order.  A
        standby's batch may hold thousands: an observer that has nothing
        to do with it returns at once.
        """


class Observers:
    """
    The two lists of observers, and one guarded call per observer and
    change.

    @ivar changes: the change observers, in the order they were added.
    @ivar activity: the activity observers.
    @ivar mirrors: the mirror observers.
    """

    def __init__(self, failed: Callable[[str], None]) -> None:
        """
        @param failed: called (inside the C{except}) with where an observer
            raised.
        """
        self.changes: List[ChangeObserver] = []
        self.activity: List[ActivityObserver] = []
        self.mirrors: List[MirrorObserver] = []
        self._failed = failed
        # The monitor's lane (it is told of grants and releases by a note,
        # not a call), and the other activity observers (called).
        self._lane: Optional[Lane] = None
        self._called: List[ActivityObserver] = []

    def attach(self, watcher: ActivityObserver) -> None:
        """
        Tell C{watcher} of the activity from now on: of grants and
        releases through its C{lane} if it has one (the L{Monitor}; one
        lane at most), by calls otherwise.
        """
        self.activity.append(watcher)
        lane = getattr(watcher, "lane", None)
        if isinstance(lane, Lane) and self._lane is None:
            self._lane = lane
        else:
            self._called.append(watcher)

    def _notify(self, method: Callable[..., object], *args: object) -> None:
        try:
            method(*args)
        except Exception:
            self._failed(f"observer {_where(method)}")

    def granted(self, now: float, key: bytes, token: int, expiresAt: float, waited: float,
                waiter: Any, conn: Named) -> None:
        name = getattr(conn, "ident", None)
        for observer in self.changes:
            self._notify(observer.granted, key, token, now, expiresAt, waited, name)
        if self.activity:
            owner = conn.name  # the connection the table keeps with the grant
            lane = self._lane
            if lane is not None:
                # The monitor's note, made here rather than by a call (its
                # lane, a copy of Monitor.granted's first line).  Calling
                # the monitor instead costs 9,589 more instructions per
                # acquire+release pair (callgrind, pairs through the real
                # protocol and service in one process): 7.6% of a node's
                # 126,525 per pair (`python -m lockservice.bench instructions`).
                try:
                    if lane.noteOnly:
                        log = lane.log  # the note, as Monitor.granted makes it
                        log.append((GRANTED, now, key, token, owner, waited, waiter is not None))
                        if (waiter is not None or key in lane.waitedFor
                                or key in lane.cycleKeys or len(log) >= FOLD_AT):
                            lane.grantNoted(key, token, owner, now, waiter, conn)
                    else:
                        lane.granted(now, key, token, owner, waiter, waited, conn)
                except Exception:
                    self._failed(f"observer {_where(lane.granted)}")
            for watcher in self._called:
                self._notify(watcher.granted, now, key, token, owner, waiter, waited, conn)

    def renewed(self, now: float, key: bytes, token: int, grantedAt: float, expiresAt: float,
                owner: Callable[[], Optional[str]]) -> None:
        for observer in self.changes:
            self._notify(observer.renewed, key, token, grantedAt, expiresAt)
        if self.activity:
            name = owner()
            for watcher in self.activity:
                self._notify(watcher.renewed, now, key, token, name, expiresAt)

    def dropped(self, now: float, key: bytes, token: int, heldFor: float, expired: bool,
                owner: Optional[str]) -> None:
        for observer in self.changes:
            self._notify(observer.dropped, key, token, heldFor, expired)
        lane = self._lane
        if lane is not None:  # (the lane: see granted)
            try:
                if lane.noteOnly:
                    log = lane.log  # the note, as Monitor.dropped makes it
                    log.append((DROPPED, now, key, token, owner, heldFor, expired, None))
                    if key in lane.cycleKeys or len(log) >= FOLD_AT:
                        lane.dropNoted(key)
                else:
                    lane.dropped(now, key, token, owner, heldFor, expired)
            except Exception:
                self._failed(f"observer {_where(lane.dropped)}")
        for watcher in self._called:
            self._notify(watcher.dropped, now, key, token, owner, heldFor, expired)

    def delayed(self, key: bytes, token: int, until: float) -> None:
        for observer in self.changes:
            self._notify(observer.delayed, key, token, until)

    def delayEnded(self, key: bytes, token: int) -> None:
        for observer in self.changes:
            self._notify(observer.delayEnded, key, token)

    def queued(self, now: float, waiter: Any) -> None:
        for watcher in self.activity:
            self._notify(watcher.queued, now, waiter)

    def waitEnded(self, now: float, waiter: Any, reason: str) -> None:
        for watcher in self.activity:
            self._notify(watcher.waitEnded, now, waiter, reason)

    def roleChanged(self, now: float, role: str,
                    holders: Callable[[], Iterable[Any]]) -> None:
        for watcher in self.activity:
            self._notify(watcher.roleChanged, now, role, holders())


    def mirrored(self, now: float,
                 changes: Sequence[Change]) -> None:
        for observer in self.mirrors:  # once per batch
            self._notify(observer.mirrored, now, changes)


def _where(method: Callable[..., object]) -> object:
    return getattr(method, "__qualname__", method)
