# -*- test-case-name: tests.server.test_limits -*-
"""
Background work of the lock service (withdrawing a closed connection's
waiters), a bounded number of steps per reactor turn.

Run by its own L{twisted.internet.task.Cooperator}: nothing else shares
its queue (a page producer of the HTTP side has its own), so a slow page
never delays the withdrawal of dead waiters, nor the other way round.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from twisted.internet.task import Cooperator

# Steps of background work per reactor turn, for all jobs together.
CHUNK_BUDGET = 1000


class Chores:
    """
    Runs jobs (iterators: one step per item) at most L{CHUNK_BUDGET} steps
    per reactor turn for all of them together.  Within that budget a job
    starts at once (a small one is then done before L{run} returns); the
    rest goes on over the next turns, the jobs taking turns.

    @ivar pending: how many jobs are not done yet.
    """

    def __init__(self, clock: Any, inTurn: Callable[[Callable[[], None]], None],
                 failed: Callable[[str], None], budget: int = CHUNK_BUDGET) -> None:
        """
        @param inTurn: runs its argument inside an answer turn (so the
            answers the steps produce go out together).
        @param failed: told (inside the C{except}) when a job raised; the
            job is dropped.
        """
        self.clock = clock
        self.budget = budget
        self.pending = 0
        self._inTurn = inTurn
        self._failed = failed
        self._spent = 0
        self._running = False
        self._reset: Any = None
        self._cooperator = Cooperator(terminationPredicateFactory=self._newTurn,
                                      scheduler=self._schedule)

    # -- the cooperator's policy: a step budget per reactor turn ----------

    def _schedule(self, tick: Callable[[], None]) -> Any:
        def inTurn() -> None:
            self._running = True
            try:
                self._inTurn(tick)
            finally:
                self._running = False
        return self.clock.callLater(0, inTurn)

    def _newTurn(self) -> Callable[[], bool]:
        self._spent = 0

        def spent() -> bool:
            self._spent += 1
            return self._spent >= self.budget
        return spent

    # -- jobs -----------------------------------------------------------

    def _guarded(self, work: Iterator[object]) -> Iterator[None]:
        try:
            for _ in work:
                yield None
        except Exception:
            self._failed("background work")
        finally:
            self.pending -= 1

    def run(self, work: Iterator[object]) -> None:
        """
        Run C{work} one step per item, within the budget of this turn.
        """
        self.pending += 1
        job = self._guarded(work)
        if self._spent < self.budget and not self._running:
            done = False

            def steps() -> None:
                nonlocal done
                budget = self.budget
                for _ in job:
                    self._spent += 1
                    if self._spent >= budget:
                        return
                done = True

            self._running = True
            try:
                self._inTurn(steps)
            finally:
                self._running = False
            if self._reset is None:
                # The next reactor turn starts a new budget.
                self._reset = self.clock.callLater(0, self._resetBudget)
            if done:
                return
        self._cooperator.cooperate(job)

    def _resetBudget(self) -> None:
        self._reset = None
        self._spent = 0

    def stop(self) -> None:
        self._cooperator.stop()
        if self._reset is not None and self._reset.active():
            self._reset.cancel()
        self._reset = None
