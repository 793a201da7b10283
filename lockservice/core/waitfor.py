# -*- test-case-name: tests.test_waitfor -*-
"""
The wait-for graph: which client waits for a key that which client holds,
and the deadlocks (cycles) that follow.

Clients are identified by a string (a connection's name, or its peer
address when it has none).  The graph is bipartite, client -> key (waits
for) and key -> client (held by), so a hand-over changes one edge whatever
the queue length.  A cycle is searched for only through the edge just
added, and each cycle is reported once, when it forms; it is forgotten as
soon as one of its edges goes (a waiter withdrawn or timed out, a key
released), so a cycle that forms again later is reported again.

Detect, never break: nothing here changes who holds what.

A client waiting for a key it holds itself is not reported (a process
whose tasks share one connection name does that routinely; the lease ends
it).  Pure: no clock, the caller gives the time.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

Step = Tuple[str, bytes]  # (client, the key it waits for)


class Cycle:
    """
    A deadlock: C{steps[i]} = (client i, key it waits for), and that key is
    held by client i+1 (the last key by client 0).
    """

    __slots__ = ("steps", "since")

    def __init__(self, steps: Tuple[Step, ...], since: float) -> None:
        self.steps = steps
        self.since = since

    @property
    def clients(self) -> List[str]:
        return [who for who, _ in self.steps]

    @property
    def keys(self) -> List[bytes]:
        return [key for _, key in self.steps]

    def describe(self) -> str:
        """
        C{a waits for k1 (held by b) -> b waits for k2 (held by a)}.
        """
        parts = []
        for i, (who, key) in enumerate(self.steps):
            holder = self.steps[(i + 1) % len(self.steps)][0]
            parts.append(f"{who} waits for {key.decode('utf-8', 'replace')} (held by {holder})")
        return " -> ".join(parts)

    def asDict(self) -> Dict[str, object]:
        return {
            "length": len(self.steps),
            "clients": self.clients,
            "keys": [k.decode("utf-8", "replace") for k in self.keys],
            "since": self.since,
            "description": self.describe(),
        }


def _canonical(steps: List[Step]) -> Tuple[Step, ...]:
    # The same cycle found from another edge must compare equal.
    start = min(range(len(steps)), key=lambda i: steps[i])
    return tuple(steps[start:] + steps[:start])


def _discard(index: Dict[Any, Set[Tuple[Step, ...]]], at: Any,
             cid: Tuple[Step, ...]) -> None:
    ids = index.get(at)
    if ids is not None:
        ids.discard(cid)
        if not ids:
            del index[at]


class WaitForGraph:
    """
    @ivar cycles: the deadlocks present now, by canonical steps.
    @ivar detected: how many cycles have formed since start.
    """

    def __init__(self, maxSearch: int = 10000) -> None:
        self.maxSearch = maxSearch
        self._holder: Dict[bytes, str] = {}
        self._waits: Dict[str, Dict[bytes, int]] = {}
        self._waitedFor: Dict[bytes, int] = {}  # waits per key, all clients
        self.cycles: Dict[Tuple[Step, ...], Cycle] = {}
        self._byStep: Dict[Step, Set[Tuple[Step, ...]]] = {}
        self._byKey: Dict[bytes, Set[Tuple[Step, ...]]] = {}
        self.detected = 0

    # -- changes -------------------------------------------------------------

    def hold(self, key: bytes, who: Optional[str], now: float) -> List[Cycle]:
        """
        C{key} is now held by C{who} (None: by a client unknown here, e.g.
        a grant learned by replication).

        @return: the cycles this grant closes.
        """
        if self._holder.get(key) == who:
            return []
        self.unhold(key)
        if who is None:
            return []
        self._holder[key] = who
        if not self._waitedFor.get(key) or who not in self._waits:
            return []  # nobody waits for key, or who waits for nothing: no cycle
        path = self._search(who, lambda w: key in self._waits.get(w, ()))
        if path is None:
            return []
        return self._found([(w, k) for w, k, _ in path] + [(path[-1][2], key)], now)

    def unhold(self, key: bytes) -> None:
        """
        C{key} is free (or changes hands).
        """
        if self._holder.pop(key, None) is not None:
            for cid in list(self._byKey.get(key, ())):
                self._forget(cid)

    def wait(self, key: bytes, who: str, now: float) -> List[Cycle]:
        """
        C{who} queued for C{key}.

        @return: the cycles this wait closes.
        """
        keys = self._waits.setdefault(who, {})
        keys[key] = keys.get(key, 0) + 1
        self._waitedFor[key] = self._waitedFor.get(key, 0) + 1
        holder = self._holder.get(key)
        if keys[key] > 1 or holder is None or holder == who:
            return []
        path = self._search(holder, lambda w: w == who)
        if path is None:
            return []
        return self._found([(who, key)] + [(w, k) for w, k, _ in path], now)

    def unwait(self, key: bytes, who: str) -> None:
        """
        One of C{who}'s waits for C{key} ended (granted, timed out, withdrawn).
        """
        keys = self._waits.get(who)
        if keys is None or key not in keys:
            return
        keys[key] -= 1
        if self._waitedFor[key] == 1:
            del self._waitedFor[key]
        else:
            self._waitedFor[key] -= 1
        if keys[key] > 0:
            return
        del keys[key]
        if not keys:
            del self._waits[who]
        for cid in list(self._byStep.get((who, key), ())):
            self._forget(cid)

    def clear(self) -> None:
        """
        Forget everything (this node stopped serving).
        """
        self._holder.clear()
        self._waits.clear()
        self._waitedFor.clear()
        self.cycles.clear()
        self._byStep.clear()
        self._byKey.clear()

    # -- search --------------------------------------------------------------

    def _search(self, start: str,
                isEnd: Callable[[str], bool]) -> Optional[List[Tuple[str, bytes, str]]]:
        """
        Depth-first from client C{start} along waits-for -> held-by edges
        to another client C{w} with C{isEnd(w)}, visiting at most
        C{maxSearch} edges (a search never stalls the server).

        @return: the edges followed, as (client, key it waits for, holder
            of that key), or None.
        """
        visited: Set[str] = {start}
        path: List[Tuple[str, bytes, str]] = []
        stack: List[Iterator[bytes]] = [iter(list(self._waits.get(start, ())))]
        current = [start]
        budget = self.maxSearch
        while stack:
            for key in stack[-1]:
                budget -= 1
                if budget <= 0:
                    return None
                nxt = self._holder.get(key)
                if nxt is None or nxt in visited:
                    continue
                path.append((current[-1], key, nxt))
                if isEnd(nxt):
                    return path
                visited.add(nxt)
                current.append(nxt)
                stack.append(iter(list(self._waits.get(nxt, ()))))
                break
            else:
                stack.pop()
                current.pop()
                if path:
                    path.pop()
        return None

    def _found(self, steps: List[Step], now: float) -> List[Cycle]:
        cid = _canonical(steps)
        if cid in self.cycles:
            return []
        cycle = self.cycles[cid] = Cycle(cid, now)
        self.detected += 1
        for step in cid:
            self._byStep.setdefault(step, set()).add(cid)
            self._byKey.setdefault(step[1], set()).add(cid)
        return [cycle]

    def _forget(self, cid: Tuple[Step, ...]) -> None:
        cycle = self.cycles.pop(cid, None)
        if cycle is None:
            return
        for step in cid:
            _discard(self._byStep, step, cid)
            _discard(self._byKey, step[1], cid)

    # -- reading -------------------------------------------------------------

    def holderOf(self, key: bytes) -> Optional[str]:
        return self._holder.get(key)
