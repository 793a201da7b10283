"""
The service's plain counters: cheap on the hot path, exported as metrics
on demand (L{lockservice.server.metrics}).
"""

from __future__ import annotations


class Stats:
    """
    Plain counters, cheap on the hot path; exported as metrics on demand.
    """

    def __init__(self) -> None:
        self.grants = 0
        self.releasesOk = 0
        self.releasesStale = 0
        self.renewalsOk = 0
        self.renewalsStale = 0
        self.expirations = 0
        self.timeouts = 0
        # Queued acquires withdrawn by their client (C), and those dropped
        # because their connection went away.
        self.withdrawals = 0
        self.waitersDropped = 0
        self.redirects = 0
        self.errors = 0
        self.connections = 0
        self.internalErrors = 0
        # Refused by a limit: an acquire (keys, waiters), a connection, or
        # a connection closed for collecting STALE answers.
        self.rejectedKeys = 0
        self.rejectedWaiters = 0
        self.rejectedObservers = 0
        self.rejectedConnections = 0
        self.staleFloods = 0
        # Grants an active node took from a peer's offer on a heal.
        self.merged = 0
