# -*- test-case-name: tests.server.test_protocol -*-
"""
A client connection's answers in send order, and the withdrawal of its
waits once the client is gone.

Answers to queued acquires (and waiting observers) are written in send
order per key, as the protocol requires for equal (op, key) pairs: a
later request's timeout is held back until the earlier request on the
same key is answered.

An end of input (a FIN: the client closed its socket, died, or only shut
down its sending side as C{printf ... | nc} does) withdraws every acquire
of the connection that is still queued: the server cannot tell these
cases apart, and a dead waiter must never be handed a lock.  The
connection is marked C{gone} at once (a hand-over passes its waiters by),
and its waiters are unlinked a bounded chunk per reactor turn, so closing
100,000 of them stalls nobody.  Answers already decided are written
before the server closes.
"""

from __future__ import annotations

from typing import Deque, Dict, Iterator, Optional

from lockservice.server.observing import Observation
from lockservice.server.reading import (
    PacedReceiver,
)
from lockservice.server.service import LockService
from lockservice.server.waiters import PendingAcquire

# The answer of an observer held back behind an earlier one: the key's
# state, read when it is written.
_STATE_WHEN_WRITTEN = b""


class SendOrder(PacedReceiver):
    """
    The base of L{lockservice.server.protocol.LockProtocol}: its queued
    acquires and waiting observers per key, answered in send order, and
    withdrawn when the client is gone.  The subclass writes (L{write})
    and closes (L{_close}).
    """

    service: LockService
    name: str
    ident: Optional[bytes]

    def __init__(self) -> None:
        # (Its gone connection's queued acquires are withdrawn a chunk per
        # reactor turn, and a hand-over skips them meanwhile.)
        super().__init__()
        self._pending: Dict[bytes, Deque[PendingAcquire]] = {}
        # The same for O: its observers per key, answered in send order.
        self._observing: Dict[bytes, Deque[Observation]] = {}

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def flushAnswers(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def finishObserve(self, observation: Observation, answer: bytes) -> None:
        """
        Answer an observer, keeping send order among this connection's
        C{O}s of one key.
        """
        if self.gone:
            return
        queue = self._observing[observation.key]
        if queue[0] is not observation and answer[:2] == b"O ":
            # Held back behind an earlier O of the key: it reports the
            # key's state as it is when it is written.
            answer = _STATE_WHEN_WRITTEN
        observation.answer = answer
        self._heldBytes += len(answer)
        while queue and queue[0].answer is not None:
            answer = queue.popleft().answer  # type: ignore[assignment]
            self._queued -= 1
            self._heldBytes -= len(answer)
            if answer is _STATE_WHEN_WRITTEN:
                answer = self.service.observing.state(observation.key)
            self.write(answer)
        if not queue:
            del self._observing[observation.key]
        if self._readPaused != self._writePaused or self._overloaded():
            self._updateReading()

    def _answerInTurn(self, key: bytes, answer: bytes) -> None:
        """
        Answer an acquire of C{key} refused before it reached the service
        (malformed) behind this connection's earlier acquires of C{key}:
        equal (op, key) are answered in send order (clients pair answers so).
        """
        refused = PendingAcquire(key, 0.0, self)
        self._pending[key].append(refused)
        self._queued += 1
        self.finish(refused, answer)

    def finish(self, waiter: PendingAcquire, answer: bytes) -> None:
        """
        Answer a queued acquire, keeping send order among equal keys.  An
        answer held back behind an earlier acquire counts toward the
        connection's backpressure bound until it is written.
        """
        if self.gone:
            return  # its acquires are being withdrawn; nobody reads
        waiter.answer = answer
        self._heldBytes += len(answer)
        queue = self._pending[waiter.key]
        while queue and queue[0].answer is not None:
            answer = queue.popleft().answer  # type: ignore[assignment]
            self._queued -= 1
            self._heldBytes -= len(answer)
            self.write(answer)
        if not queue:
            del self._pending[waiter.key]
        if self._readPaused != self._writePaused or self._overloaded():
            self._updateReading()

    def _withdrawing(self, pending: Dict[bytes, Deque[PendingAcquire]],
                     observing: Dict[bytes, Deque[Observation]],
                     writeDecided: bool) -> Iterator[None]:
        """
        Withdraw every queued acquire and waiting observer of this gone
        connection, one per step (the service runs a bounded chunk of
        steps per reactor turn, so a connection with 100,000 waiters cannot
        stall the node); after an end of input also write the answers
        already decided, in order, and close at the end.
        """
        service = self.service
        for queue in pending.values():
            for waiter in queue:
                if waiter.answer is None:
                    service.withdraw(waiter)
                elif writeDecided and not self._lost:
                    self.write(waiter.answer)
                yield None
        for observers in observing.values():
            for observation in observers:
                if observation.answer is None:
                    service.unobserve(observation)
                elif writeDecided and not self._lost:
                    self.write(observation.answer)
                yield None
        if writeDecided and not self._lost:
            self._close()

    def _leave(self, writeDecided: bool) -> None:
        """
        The client is gone: from now on a hand-over passes its waiters by,
        and they are withdrawn over the next reactor turns.
        """
        self.gone = True
        pending, self._pending = self._pending, {}
        observing, self._observing = self._observing, {}
        self._queued = self._heldBytes = 0
        if pending or observing:
            self.service.runInChunks(self._withdrawing(pending, observing, writeDecided))
        elif writeDecided:
            self._close()
