"""
Who a waiter of a shared key (a read lock, a semaphore) waits for, and
which clients are deadlocked through such waits.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, FrozenSet, Iterable, List, Sequence, Set, Tuple

from lockservice.core.clients import Client

# -- shared keys: who a waiter waits for ------------------------------------
#
# With read locks and semaphores a waiter may wait for several clients at
# once, in one of two ways:
#
# - ALL: it is granted only once every one of them is gone: a writer waits
#   for every holder and every waiter ahead of it (FIFO: they go first); a
#   reader waits for the writers ahead of it, holding or queued (readers
#   ahead of it are granted with it, never before it is due).
# - ANY: it is granted as soon as one of them goes: a semaphore waiter
#   needs one of the n slots, so it is blocked by a deadlock only when
#   every one of the n holders is in it.  (A waiter further back needs more
#   slots; counting it as ANY can only miss a deadlock, never report a
#   false one.)
#
# A set of clients is deadlocked when none of them can be granted whatever
# the others outside it do; found as the complement of the clients that can
# finish (a least fixed point, O(clients + blockers)).

READ = "r"
WRITE = "w"   # an exclusive acquire (share None or 1)
ALL = "all"
ANY = "any"


class Wait:
    """
    One queued acquire's wait: for C{ALL} or C{ANY} of C{blockers}.

    @ivar own: the waiter is one of the key's holders itself (a semaphore
        waiter holding a slot: it waits for every other slot).
    """

    __slots__ = ("how", "blockers", "key", "own")

    def __init__(self, how: str, blockers: FrozenSet[Client], key: bytes = b"",
                 own: bool = False) -> None:
        self.how = how
        self.blockers = blockers
        self.key = key
        self.own = own

    def __repr__(self) -> str:
        return f"Wait({self.how}, {set(self.blockers)!r}, {self.key!r})"


def keyWaits(key: bytes, holders: Sequence[Tuple[Client, str]],
             queue: Sequence[Tuple[Client, str]], slots: int = 1
             ) -> List[Tuple[Client, Wait]]:
    """
    The waits of C{key}'s queue (FIFO order), from its C{holders} and
    C{queue} as (client, mode) pairs: mode L{READ} or L{WRITE} (exclusive;
    for a semaphore, C{slots} > 1, every grant is a slot).  A client does
    not wait for itself (a lease ends that, it is no deadlock).

    O(holders + queue), whatever the mix: an ALL wait may leave out a
    blocker that another of its blockers waits for anyway (a reader waits
    for the last writer ahead of it, which waits for everything ahead of
    itself; a writer for the last writer ahead and the readers after it),
    and leaving out a blocker of an ALL wait can only miss a deadlock.
    A semaphore waiter that a free slot will take (the first M{free}
    waiters, M{free} = slots - holders) waits for nobody; the others for
    ANY of the holders and of those first waiters (who all go before it).
    """
    out: List[Tuple[Client, Wait]] = []
    if slots > 1:
        free = max(0, slots - len(holders))
        everyone = frozenset([who for who, _ in holders] + [who for who, _ in queue[:free]])
        nobody: FrozenSet[Client] = frozenset()
        for i, (who, _) in enumerate(queue):
            if i < free:
                out.append((who, Wait(ANY, nobody, key)))
            elif who in everyone:
                out.append((who, Wait(ANY, everyone - {who}, key, own=True)))
            else:
                out.append((who, Wait(ANY, everyone, key)))
        return out
    # run: the last writer ahead (first) and everyone after it, or all
    # ahead while no writer is; lastWriter, the writer before it too
    # (for a writer's own later acquire, which may not wait for itself).
    run: List[Client] = []
    writers: List[Client] = []  # the last two distinct writers ahead
    for who, mode in holders:
        if mode != READ:
            run = [who]
            writers = ([who] + [w for w in writers if w is not who])[:2]
        else:
            run.append(who)
    for who, mode in queue:
        if mode == READ:
            nearest = next((w for w in writers if w is not who), None)
            blockers = frozenset((nearest,)) if nearest is not None else frozenset()
            out.append((who, Wait(ALL, blockers, key)))
            run.append(who)
        else:
            out.append((who, Wait(ALL, frozenset(run) - {who}, key)))
            run = [who]
            writers = ([who] + [w for w in writers if w is not who])[:2]
    return out


def deadlockedClients(waits: Iterable[Tuple[Client, Wait]]) -> Set[Client]:
    """
    The clients that can never be granted all they wait for: each wait
    of a client that can finish is met (ALL: every blocker can finish;
    ANY: one can, or it has none); a client that waits for nothing
    finishes (its leases end).  Everything else is deadlocked.
    """
    waitsOf: Dict[Client, List[Wait]] = {}
    for who, wait in waits:
        waitsOf.setdefault(who, []).append(wait)
    # Per wait: how many blockers must still finish before it is met.
    missing: Dict[int, int] = {}
    unmet: Dict[Client, int] = {}
    watchers: Dict[Client, List[Tuple[Client, Wait]]] = {}
    finished: Deque[Client] = deque()
    done: Set[Client] = set()
    for who, ws in waitsOf.items():
        count = 0
        for wait in ws:
            live = [b for b in wait.blockers if b is not who]
            need = len(live) if wait.how == ALL else min(1, len(live))
            missing[id(wait)] = need
            if need:
                count += 1
                for b in live:
                    watchers.setdefault(b, []).append((who, wait))
        unmet[who] = count
        if count == 0:
            finished.append(who)
            done.add(who)
    # Blockers that wait for nothing finish.
    for b in list(watchers):
        if b not in waitsOf:
            finished.append(b)
            done.add(b)
    while finished:
        b = finished.popleft()
        for who, wait in watchers.get(b, ()):
            if who in done or missing[id(wait)] == 0:
                continue
            missing[id(wait)] -= 1
            if missing[id(wait)] == 0:
                unmet[who] -= 1
                if unmet[who] == 0:
                    done.add(who)
                    finished.append(who)
    return {who for who in waitsOf if who not in done}
