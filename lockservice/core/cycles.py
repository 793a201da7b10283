"""
The deadlocks a wait-for graph reports: cycles of clients, and the
bookkeeping of those reported (see L{lockservice.core.waitfor}).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from lockservice.core.clients import Client
from lockservice.core.sharedwaits import ANY

Step = Tuple[Client, bytes]  # (client, the key it waits for)
CycleId = FrozenSet[Client]


class Cycle:
    """
    A deadlock: C{steps[i]} = (client i, key it waits for), and that key is
    held by client i+1 (the last key by client 0).  Rotated so that the
    smallest key comes first (a stable order to show).
    """

    __slots__ = ("steps", "since", "via", "support")

    def __init__(self, steps: Tuple[Step, ...], since: float,
                 via: Optional[Dict[Step, Tuple[str, Tuple[Client, ...]]]] = None,
                 support: FrozenSet[Step] = frozenset()) -> None:
        self.steps = steps
        self.since = since
        # Through shared keys (L{WaitForGraph.sharedOf}): per step whose
        # key is shared, how it waits (ALL or ANY) and for whom of the
        # deadlock; and every wait the deadlock rests on (a change to any
        # of them checks it again).  Empty for a cycle of exclusive keys.
        self.via = via or {}
        self.support = support

    @property
    def shared(self) -> bool:
        """
        Whether the deadlock runs through a shared key (read lock or
        semaphore).
        """
        return bool(self.via)

    @property
    def clients(self) -> List[Client]:
        return [who for who, _ in self.steps]

    @property
    def keys(self) -> List[bytes]:
        return [key for _, key in self.steps]

    def describe(self, nameOf: Callable[[Client], str] = str) -> str:
        """
        C{a waits for k1 (held by b) -> b waits for k2 (held by a)}.

        A step through a shared key says so: C{(every slot held by a, b)}
        for a semaphore (its waiter needs one of them to go, and none can;
        C{every other slot} when the waiter holds one itself),
        C{(blocked by b)} for a read-write key (b holds it or is a writer
        queued ahead).
        """
        parts = []
        for i, (who, key) in enumerate(self.steps):
            holder = self.steps[(i + 1) % len(self.steps)][0]
            shown = key.decode('utf-8', 'replace')
            via = self.via.get((who, key))
            if via is None:
                why = f"held by {nameOf(holder)}"
            elif via[0] == ANY:
                others = [b for b in via[1] if b is not who]
                why = ("every other slot held by " if len(others) < len(via[1])
                       else "every slot held by ") + ", ".join(nameOf(b) for b in others)
            else:
                why = f"blocked by {nameOf(holder)}"
            parts.append(f"{nameOf(who)} waits for {shown} ({why})")
        return " -> ".join(parts)

    def asDict(self, nameOf: Callable[[Client], str] = str) -> Dict[str, object]:
        out: Dict[str, object] = {
            "length": len(self.steps),
            "clients": [nameOf(c) for c in self.clients],
            "keys": [k.decode("utf-8", "replace") for k in self.keys],
            "since": self.since,
            "description": self.describe(nameOf),
            "shared": self.shared,
        }
        if self.shared:
            # Everyone the deadlock holds (a semaphore's holders beside the
            # cycle), by name, in a stable order.
            out["deadlocked"] = sorted(nameOf(c) for c in _clientsOf(self))
        return out


def _clientsOf(cycle: "Cycle") -> Set[Client]:
    clients = set(cycle.clients)
    for _, blockers in cycle.via.values():
        clients.update(blockers)
    return clients


def _rotated(steps: List[Step]) -> Tuple[Step, ...]:
    # Keys in a cycle are distinct (each is held by a different client).
    start = min(range(len(steps)), key=lambda i: steps[i][1])
    return tuple(steps[start:] + steps[:start])


def _cidOf(cycle: Cycle) -> CycleId:
    return frozenset(_clientsOf(cycle))


def _order(who: Client) -> Tuple[str, int]:
    # A stable order to pick among blockers: by name, then identity.
    return (str(getattr(who, "name", who)), id(who))


def _discard(index: Dict[Any, Set[CycleId]], at: Any, cid: CycleId) -> None:
    ids = index.get(at)
    if ids is not None:
        ids.discard(cid)
        if not ids:
            del index[at]


class ReportedCycles:
    """
    The cycles a L{lockservice.core.waitfor.WaitForGraph} reported.
    """

    maxCycles: int
    cycles: Dict[CycleId, Cycle]
    _byStep: Dict[Step, Set[CycleId]]
    _byKey: Dict[bytes, Set[CycleId]]
    _pairs: Dict[Tuple[Client, Client], int]
    detected: int
    unlisted: int

    def _foundShared(self, cycle: Cycle, now: float, found: List[Cycle]) -> None:
        cid = _cidOf(cycle)
        if cid in self.cycles:
            return
        if len(self.cycles) >= self.maxCycles:
            self.unlisted += 1
            return
        cycle.since = now
        self._add(cid, cycle)
        self.detected += 1
        found.append(cycle)

    def _found(self, steps: List[Step], now: float, found: List[Cycle]) -> None:
        cid: CycleId = frozenset(who for who, _ in steps)
        if cid in self.cycles:
            return  # these clients are already reported as deadlocked
        if len(self.cycles) >= self.maxCycles:
            self.unlisted += 1
            return
        cycle = Cycle(_rotated(steps), now)
        self._add(cid, cycle)
        self.detected += 1
        found.append(cycle)

    def _add(self, cid: CycleId, cycle: Cycle) -> None:
        self.cycles[cid] = cycle
        if cycle.shared:
            for step in cycle.support:
                self._byStep.setdefault(step, set()).add(cid)
                self._byKey.setdefault(step[1], set()).add(cid)
            return
        steps = cycle.steps
        for i, step in enumerate(steps):
            self._byStep.setdefault(step, set()).add(cid)
            self._byKey.setdefault(step[1], set()).add(cid)
            pair = (step[0], steps[(i + 1) % len(steps)][0])
            self._pairs[pair] = self._pairs.get(pair, 0) + 1

    def _forget(self, cid: CycleId) -> None:
        cycle = self.cycles.pop(cid, None)
        if cycle is None:
            return
        if cycle.shared:
            for step in cycle.support:
                _discard(self._byStep, step, cid)
                _discard(self._byKey, step[1], cid)
            return
        steps = cycle.steps
        for i, step in enumerate(steps):
            _discard(self._byStep, step, cid)
            _discard(self._byKey, step[1], cid)
            pair = (step[0], steps[(i + 1) % len(steps)][0])
            if self._pairs[pair] == 1:
                del self._pairs[pair]
            else:
                self._pairs[pair] -= 1
