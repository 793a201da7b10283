# -*- test-case-name: tests.server.test_limits -*-
"""
Who may connect, and who is closed for guessing tokens.

Connections: at most C{maxConnections} client connections at once; past
that a new connection is admitted "on probation" (it may be a peer, which
shares the client port) or refused.

STALE policing (a token guesser must not be able to probe for long): a
connection collecting more than L{STALE_LIMIT} STALE answers (to R or N)
within L{STALE_WINDOW} seconds is guessing tokens and is closed.  That
limit is per connection: a neighbour's STALE answers never close, refuse
or delay a live connection (many honest clients share one address: a
host's processes, a NAT, a proxy).  Guessing
over reconnects is met at the door instead: an address whose connections
keep being closed for that limit has its *new* connections slowed (each is
read only after the one before it had its turn).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from math import inf
from typing import Any, Deque, List

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

# Per source address: how many of its connections were closed for the
# STALE limit, a count that decays by one every CLOSE_DECAY seconds.  While
# it is at SLOW_AFTER_CLOSES or more (an address whose connections keep
# being closed: guessing over reconnects), each new connection from it is
# read only SLOW_STEP seconds after the previous new one; live connections
# are never touched, and STALE answers alone (honest neighbours releasing
# expired locks, however many) never slow anyone.  At most
# ADDRESS_TABLE_SIZE addresses are tracked (the least recently seen is
# forgotten first), so memory stays bounded.
SLOW_AFTER_CLOSES = 3
CLOSE_DECAY = 10.0
SLOW_STEP = 1.0
ADDRESS_TABLE_SIZE = 65_536

ADMITTED, PROBATION, REFUSED = "admitted", "probation", "refused"



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
        self._slowLoggedAt = -inf
        # Per source address: [closes for the STALE limit (decaying), last
        # decay, next new connection's start].
        self._closes: "OrderedDict[str, List[float]]" = OrderedDict()

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

    def stale(self, window: StaleWindow, now: float) -> bool:
        """
        Count a STALE answer to a connection (its C{window}).

        @return: True when that connection must be closed (its own flood).
        """
        return window.flooded(now)

    def _decayed(self, host: str, now: float) -> List[float]:
        """
        C{host}'s [closes, last decay, next new connection's start], its
        closes decayed up to C{now}.
        """
        entry = self._closes[host]
        self._closes.move_to_end(host)
        entry[0] = max(0.0, entry[0] - (now - entry[1]) / CLOSE_DECAY)
        entry[1] = now
        return entry

    def readDelay(self, conn: Any, now: float) -> float:
        """
        How long to leave a new connection (C{conn}, from C{conn.host})
        unread: 0 unless connections of its address keep being closed for
        the STALE limit.
        """
        if conn.host not in self._closes:
            return 0.0
        entry = self._decayed(conn.host, now)
        # More than SLOW_AFTER_CLOSES - 1 left: the third close counts at
        # once, not only while not a moment of its decay has passed.
        if entry[0] <= SLOW_AFTER_CLOSES - 1:
            return 0.0
        start = max(now, entry[2])
        entry[2] = start + SLOW_STEP
        if now - self._slowLoggedAt >= 60:
            self._slowLoggedAt = now
            self.log.warn("new connections from {host} are read {step:g} s apart: {closes} "
                          "or more of its connections were closed for too many STALE answers "
                          "(guessing tokens over reconnects?); its live connections are "
                          "not concerned", host=conn.host, step=SLOW_STEP,
                          closes=SLOW_AFTER_CLOSES)
        return start - now

    def staleFlood(self, conn: Any, now: float) -> None:
        """
        C{conn} is closed for its own STALE flood: count it against its
        address (see L{readDelay}), and log (at most once a minute).
        """
        if conn.host in self._closes:
            self._decayed(conn.host, now)[0] += 1.0
        else:
            self._closes[conn.host] = [1.0, now, -inf]
            if len(self._closes) > ADDRESS_TABLE_SIZE:
                self._closes.popitem(last=False)
        # At most one log line a minute: the closing itself is counted.
        if now - self._staleLoggedAt < 60:
            return
        self._staleLoggedAt = now
        self.log.warn("closed {peer}: more than {limit} STALE answers within {window:g} s "
                      "(guessing tokens?); further closes are counted in "
                      "lockservice_rejected_total{{limit=\"stale_flood\"}}",
                      peer=conn.name, limit=STALE_LIMIT, window=STALE_WINDOW)
