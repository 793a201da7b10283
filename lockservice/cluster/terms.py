# -*- test-case-name: tests.cluster.test_terms -*-
"""
Terms and eras: the numbers that order the cluster's claims, and whose
stream a node's keys mirror.

Terms, like tokens, follow the microsecond clock: a new term is
C{max(highest term seen + 1, now in microseconds)}.  So a node refuses a
token or a term more than L{PLAUSIBLE_AHEAD} ahead of its own clock,
whoever sends it: one forged or broken peer cannot push the cluster to
the end of the token space (see L{lockservice.cluster.clocktrust} for
what a node does when it sees one).

An era is a (leader, term, position) triple: the stream of that leader,
up to that position (a node's stream positions rise for as long as it
runs, and start above its earlier runs': see
L{lockservice.cluster.replication.Stream}; the term is the one the
leader had, for the logs).  A node offers its keys at a heal with the
era they mirror.  A leader that took that stream over up to that
position or further (by handoff, or promoted as the standby whose copy
went furthest) ignores the offer; one that took it over less far (its
own copy was cut short) learns from the offer what ended in the part it
missed (see L{Eras}).

Pure: the caller passes the time.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from lockservice.cluster.clocktrust import PLAUSIBLE_AHEAD

# A refused value is logged at most this often per peer (seconds).
REFUSALS_LOGGED_EVERY = 10.0

Era = Tuple[int, int, int]

# The position of a node's own keys (it offers them when it steps down,
# or restarts with them): nobody else's copy goes further.
WHOLE = 2**63


def plausible(value: int, nowMicros: int) -> bool:
    """
    Whether a token or term of a peer is at most L{PLAUSIBLE_AHEAD} ahead
    of our clock (C{nowMicros}).
    """
    return value <= nowMicros + PLAUSIBLE_AHEAD


def limit(nowMicros: int) -> int:
    """
    The highest token or term that L{plausible} accepts now.
    """
    return nowMicros + PLAUSIBLE_AHEAD


class Terms:
    """
    The highest term this node has seen, and new terms above it.

    @ivar highest: the highest term seen (ours or a peer's, or restored).
    """

    def __init__(self) -> None:
        self.highest = 0
        self._refusalLogged: Dict[int, float] = {}

    def learn(self, term: int) -> None:
        if term > self.highest:
            self.highest = term

    def new(self, nowMicros: int) -> int:
        """
        A term above every term seen, following the microsecond clock.
        """
        term = max(self.highest + 1, nowMicros)
        self.learn(term)
        return term

    def logRefusal(self, peer: int, now: float) -> bool:
        """
        Whether to log a refused value of C{peer} at C{now} (seconds): at
        most every L{REFUSALS_LOGGED_EVERY} per peer.
        """
        if now - self._refusalLogged.get(peer, -1e18) < REFUSALS_LOGGED_EVERY:
            return False
        self._refusalLogged[peer] = now
        return True


class Eras:
    """
    Whose stream this node's keys mirror, for the offer at its next sync,
    and the era it took over whole.

    @ivar offerFrom: the era to offer our keys with at the next sync, or
        None: no offer.
    @ivar inheritedFrom: the era this node took over (by handoff, or
        by promotion), up to the position its copy had; or None.
    @ivar inheritedTokens: the highest token of that era's grants: what
        this node held then with a token no higher came from that stream.
    """

    def __init__(self) -> None:
        self.offerFrom: Optional[Era] = None
        self.inheritedFrom: Optional[Era] = None
        self.inheritedTokens = 0

    def restored(self, me: int, term: int) -> None:
        """
        This node starts with held locks saved at a graceful stop in its
        term C{term}: if another node becomes active, they are offered to
        it at the first sync (and merged by the heal rules).
        """
        self.offerFrom = (me, term, WHOLE)

    def steppingDown(self, me: int, term: int) -> None:
        """
        An active steps down: its own keys of its term are offered.
        """
        self.offerFrom = (me, term, WHOLE)

    def leaving(self, me: int, leader: Optional[int], term: int, position: int) -> None:
        """
        A node leaves its leader (or, with C{leader} None, its own active
        role) to merge into another: unless an offer is due already, its
        keys mirror that leader's stream of C{term} up to C{position} (or
        are its own).
        """
        if self.offerFrom is None:
            self.offerFrom = ((me, term, WHOLE) if leader is None
                              else (leader, term, position))

    def takeOffer(self) -> Optional[Era]:
        """
        The era to offer with now, once: the winner keeps the keys from then on.
        """
        era, self.offerFrom = self.offerFrom, None
        return era

    def tookOver(self, era: Era, tokens: int) -> None:
        """
        We took over C{era} by handoff: everything of that stream reached
        us before its HANDOFF; C{tokens} is the highest token we held.
        """
        self.inheritedFrom = era
        self.inheritedTokens = tokens

    def promoted(self, followed: Optional[Era], tokens: int) -> None:
        """
        This standby promoted with its copy of C{followed} (its leader's
        stream up to a position), or from no leader's stream (None);
        C{tokens} is the highest token it held.
        """
        self.inheritedFrom = followed
        self.inheritedTokens = tokens

    def inherited(self, era: Era) -> bool:
        """
        Whether an offer of C{era} brings nothing we lack: we took that
        stream over up to its position or further, so a key in it that we
        do not hold was released or expired.
        """
        had = self.inheritedFrom
        return had is not None and era[0] == had[0] and era[2] <= had[2]

    def further(self, era: Era) -> bool:
        """
        Whether an offer of C{era} comes from further in the stream we
        took over than our copy went: then a grant of that stream we hold
        and it does not offer ended in the part we missed (a release
        answered by its leader, acknowledged by the offering standby).
        """
        had = self.inheritedFrom
        return had is not None and era[0] == had[0] and era[2] > had[2]
