# -*- test-case-name: tests.test_limits -*-
"""
Who may connect, and who is closed for guessing tokens.

Connections: at most C{maxConnections} client connections at once; past
that a new connection is admitted "on probation" (it may be a peer, which
shares the client port) or refused.

STALE policing: a connection collecting more than L{STALE_LIMIT} STALE
answers (to R or N) within L{STALE_WINDOW} seconds is guessing tokens and
is closed; the same rule per source address across its connections.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from math import inf
from typing import Any, Deque, List, Optional

from twisted.logger import Logger

# Peers share the client port.  When --max-connections client connections
# are open, a new connection is admitted "on probation" (at most
# PEER_RESERVE of them at once): it stays only if its first line, sent
# within PEER_GRACE seconds, is a peer HELLO.  A full node thus still
# accepts its peers, and idle strangers cannot pile up.
PEER_RESERVE = 64
PEER_GRACE = 2.0

# A connection collecting more than STALE_LIMIT STALE answers (R or N)
# within STALE_WINDOW seconds is guessing tokens: it is closed.
STALE_LIMIT = 100
STALE_WINDOW = 1.0

# The same rule per source address, across all its connections (a guesser
# could otherwise open a new connection per 100 guesses): a token bucket of
# ADDRESS_STALE_RATE STALE answers a second (ADDRESS_STALE_BURST at most at
# once).  An address that runs it dry is penalized for ADDRESS_PENALTY
# seconds: every R or N it sends meanwhile closes its connection unanswered
# and unexecuted.  At most ADDRESS_TABLE_SIZE addresses are tracked (the
# least recently seen is forgotten first), so memory stays bounded.
ADDRESS_STALE_RATE = 100.0
ADDRESS_STALE_BURST = 100.0
ADDRESS_PENALTY = 10.0
ADDRESS_TABLE_SIZE = 65_536

ADMITTED, PROBATION, REFUSED = "admitted", "probation", "refused"

# Why a connection is closed for STALE answers.
CONNECTION_FLOOD, ADDRESS_FLOOD = "connection", "address"


class StaleWindow:
    """
    The times of one connection's last STALE answers.
    """

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: Deque[float] = deque(maxlen=STALE_LIMIT + 1)

    def flooded(self, now: float) -> bool:
        """
        Count a STALE answer at C{now}: True when that makes more than
        L{STALE_LIMIT} within L{STALE_WINDOW} seconds.
        """
        times = self.times
        times.append(now)
        return len(times) > STALE_LIMIT and now - times[0] < STALE_WINDOW


class Admission:
    """
    The limits on connections and on STALE answers of one node.

    @ivar probation: connections on probation now.
    """

    log = Logger()

    def __init__(self, maxConnections: int, acceptsPeers: bool) -> None:
        self.maxConnections = maxConnections
        self.acceptsPeers = acceptsPeers
        self.probation = 0
        self._staleLoggedAt = -inf
        # Per source address: [tokens left, last refill, penalized until].
        self._staleBudgets: "OrderedDict[str, List[float]]" = OrderedDict()

    # -- connections ---------------------------------------------------------

    def admit(self, open: int) -> str:
        """
        Decide on a new connection while C{open} client connections are
        open: admitted, on probation (the node is full, but it may be a
        peer), or refused.
        """
        if open < self.maxConnections:
            return ADMITTED
        if self.acceptsPeers and self.probation < PEER_RESERVE:
            self.probation += 1
            return PROBATION
        return REFUSED

    def full(self, open: int) -> bool:
        return open >= self.maxConnections

    # -- STALE answers -------------------------------------------------------

    def stale(self, window: StaleWindow, host: str, now: float) -> Optional[str]:
        """
        Count a STALE answer to a connection from C{host}.

        @return: None, or why the connection must be closed
            (L{CONNECTION_FLOOD}, L{ADDRESS_FLOOD}).
        """
        if window.flooded(now):
            return CONNECTION_FLOOD
        if not self.spendStale(host, now):
            return ADDRESS_FLOOD
        return None

    def spendStale(self, host: str, now: float) -> bool:
        """
        Take one STALE answer from C{host}'s budget.

        @return: False when the budget ran dry: C{host} is penalized now.
        """
        budgets = self._staleBudgets
        budget = budgets.get(host)
        if budget is None:
            budget = budgets[host] = [ADDRESS_STALE_BURST, now, -inf]
            if len(budgets) > ADDRESS_TABLE_SIZE:
                budgets.popitem(last=False)
        else:
            budgets.move_to_end(host)
            budget[0] = min(ADDRESS_STALE_BURST,
                            budget[0] + (now - budget[1]) * ADDRESS_STALE_RATE)
            budget[1] = now
        if budget[0] >= 1.0:
            budget[0] -= 1.0
            return True
        budget[2] = now + ADDRESS_PENALTY
        return False

    def penalized(self, host: str, now: float) -> bool:
        """
        Whether C{host} ran its STALE budget dry within the last
        C{ADDRESS_PENALTY} seconds.
        """
        budget = self._staleBudgets.get(host)
        return budget is not None and now < budget[2]

    def staleFlood(self, conn: Any, now: float, address: bool = False) -> None:
        # At most one log line a minute: the closing itself is counted.
        if now - self._staleLoggedAt < 60:
            return
        self._staleLoggedAt = now
        if address:
            self.log.warn("closed {peer}: its address {host} collected more than {rate:g} "
                          "STALE answers a second over its connections (guessing tokens?); "
                          "its R and N requests are refused for {penalty:g} s; further "
                          "closes are counted in "
                          "lockservice_rejected_total{{limit=\"stale_flood\"}}",
                          peer=conn.name, host=conn.host, rate=ADDRESS_STALE_RATE,
                          penalty=ADDRESS_PENALTY)
            return
        self.log.warn("closed {peer}: more than {limit} STALE answers within {window:g} s "
                      "(guessing tokens?); further closes are counted in "
                      "lockservice_rejected_total{{limit=\"stale_flood\"}}",
                      peer=conn.name, limit=STALE_LIMIT, window=STALE_WINDOW)
