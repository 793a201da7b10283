# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The answer turn: the answers a turn of requests or timers produces are
gathered per connection and sent together at its end, once replication
allows.

A turn's changes are handed on through one small interface, L{Gate}:
C{publish()} hands on what changed so far and says which position of the
stream of changes the gathered answers depend on; C{reached()} says up to
which position answers may go out now.  Today that is "handed to the
standbys' sockets" (L{HookGate}, over the cluster's C{beforeAnswerHooks});
acknowledged replication makes it "acknowledged up to that position"
without changing this module: answers wait, in order, until their position
is reached.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, List, Optional, Protocol, Tuple

from lockservice.internals import callAfterReady
from lockservice.server.waiters import AnswerSink

# While answers are held (a standby has not taken the changes yet), how
# often to look again.
HOLD_RETRY = 0.001


class Gate(Protocol):
    """
    What answers wait for: replication of the changes they report.

    @ivar hooks: what hands the changes on; answers wait for the gate only
        while there is any (none on a single node: they go out at once).
        An attribute, not a method: it is looked at twice per request.
    """

    hooks: List[Callable[[], Optional[bool]]]

    def publish(self) -> int:
        """
        Hand on every change made so far.

        @return: the stream position answers gathered so far wait for.
        """

    def reached(self) -> int:
        """
        The stream position up to which answers may go out now (it may try
        again to hand changes on first).
        """


class HookGate:
    """
    The gate over C{beforeAnswerHooks}: callables that hand the changes on
    (the cluster writes its replication stream to the standbys) and return
    False while a standby has not taken them yet.  A position is reached
    once every hook agreed after it was published.
    """

    def __init__(self) -> None:
        self.hooks: List[Callable[[], Optional[bool]]] = []
        self._published = 0
        self._reached = 0

    def _run(self) -> bool:
        ready = True
        for hook in self.hooks:
            if hook() is False:
                ready = False
        return ready

    def publish(self) -> int:
        self._published += 1
        if self._run():
            self._reached = self._published
        return self._published

    def reached(self) -> int:
        if self._reached < self._published and self._run():
            self._reached = self._published
        return self._reached


class AnswerTurn:
    """
    Gathers the answers of one turn and releases them when the gate allows.

    @ivar current: the connections whose answers are being gathered in
        this turn (in the order they first answered), or None between
        turns.
    @ivar onOpen: called when a turn begins (the cluster checks there that
        this process has not just been frozen).
    """

    def __init__(self, clock: Any, gate: Gate, failed: Callable[[str], None]) -> None:
        self.clock = clock
        self.gate = gate
        self._failed = failed
        self.current: Optional[List[AnswerSink]] = None
        self.onOpen: List[Callable[[], None]] = []
        # A close is due once the ready descriptors are handled.
        self._endOfTurn = False
        # Connections whose answers wait for a stream position, in order,
        # and the call that looks again.
        self._held: Deque[Tuple[int, AnswerSink]] = deque()
        self._retry: Any = None
        self._position = 0  # the last position published

    def open(self) -> bool:
        """
        Start gathering answers: until L{close}, what each connection is
        told is collected and sent in one write per connection.

        @return: True when this call opened the turn (and must close it).
        """
        if self.current is not None:
            return False
        for hook in self.onOpen:
            hook()
        self.current = []
        return True

    def closeSoon(self) -> None:
        """
        Close the turn once the reactor has handled every connection that
        was ready in this iteration (L{callAfterReady}: before the reactor
        waits again).

        Only when answers wait for the gate (replication to standbys): then
        one write per standby carries the changes of all those connections,
        instead of one per connection.  A single node answers at once.
        """
        if not self.gate.hooks:
            if not self._endOfTurn:
                # close() and _send(), copied here: a single node ends
                # every turn of requests here.  Calling close() instead
                # costs 2,364 more instructions per acquire+release pair
                # (callgrind, pairs through the real protocol and service
                # in one process): 1.9% of a node's 126,525 per pair
                # (`python -m lockservice.bench instructions`).
                turn, self.current = self.current, None
                if turn is None:
                    return
                # Last answered first: the connection whose input made the
                # turn answered first, so a hand-over's new holder is sent
                # its grant before the releaser hears "released" (the grant
                # is what the next request waits for).
                for conn in reversed(turn):
                    try:
                        conn.flushAnswers()
                    except Exception:
                        self._failed("sending answers")
                return
            self.close()
        elif not self._endOfTurn:
            self._endOfTurn = True
            callAfterReady(self.clock, self._endTurn)

    def _endTurn(self) -> None:
        if self._endOfTurn:  # (not closed already)
            self.close()

    def close(self) -> None:
        """
        Send every connection the answers gathered since L{open} (or hold
        them until the gate allows).
        """
        self._endOfTurn = False
        turn, self.current = self.current, None
        gate = self.gate
        if gate.hooks:
            # Also for a turn that made changes but answers nobody (an
            # expiry with no waiter): they must not wait for a later answer.
            position = self._position = gate.publish()
            if self._held or gate.reached() < position:
                for conn in turn or ():
                    self._held.append((position, conn))
                self._retrySoon()
                return
        if turn:
            self._send(reversed(turn))  # last answered first, as above

    def mayAnswerNow(self) -> bool:
        """
        Whether an answer given outside a turn may be sent at once: nothing
        is held and the gate agrees.
        """
        if self._held:
            return False
        gate = self.gate
        if not gate.hooks:
            return True
        self._position = gate.publish()
        return gate.reached() >= self._position

    def hold(self, conn: AnswerSink) -> None:
        """
        Keep C{conn}'s gathered answers until the gate allows (after every
        answer held before them).
        """
        self._held.append((self._position, conn))
        self._retrySoon()

    def reachedMoved(self) -> None:
        """
        The gate's reached position moved on (a standby acknowledged):
        send what may go now rather than at the next retry.  The retry
        stays armed (it finds what is still held, or nothing): a timer
        cancelled and made again at every acknowledgement would cost more
        than the look it saves.
        """
        if self._held and self._held[0][0] <= self.gate.reached():
            self._release()

    def _retrySoon(self) -> None:
        if self._retry is None:
            self._retry = self.clock.callLater(HOLD_RETRY, self._retried)

    def _retried(self) -> None:
        self._retry = None
        if self._held:
            self._release()

    def _release(self) -> None:
        held = self._held
        gate = self.gate
        if gate.hooks:
            # Changes made since (outside a turn) go out before these answers.
            self._position = gate.publish()
            upTo = gate.reached()
        else:
            upTo = self._position
        ready = []
        while held and held[0][0] <= upTo:
            ready.append(held.popleft()[1])
        if held:
            self._retrySoon()
        self._send(ready)

    def _send(self, conns: Any) -> None:
        for conn in conns:
            try:
                conn.flushAnswers()
            except Exception:
                self._failed("sending answers")

