# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
What the cluster's collaborators tell the node that owns them
(L{lockservice.cluster.node.Cluster}), and the little they read of it.

Only the node changes its role, its term or its leader: a collaborator
reports what happened (a snapshot began, a successor took over) and the
node decides.  So every collaborator module imports this one, never
node.py.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IPeers(Interface):
    """
    Who the peers are, and this node's judgement of their values.
    """

    def name(j: int) -> str:
        """
        Peer C{j}'s --peers entry.
        """

    def plausible(j: int, value: int, what: str) -> bool:
        """
        False (and logged, now and then) for a token or term of peer C{j}
        more than an hour ahead of our clock.
        """


class IRole(Interface):
    role = Attribute("this node's role (lockservice.core.election)")
    term = Attribute("this node's term")
    leader = Attribute("the peer this node follows, or None")
    stopping = Attribute("whether this node is stopping (it takes no active role)")
    clockSuspect = Attribute("why this node distrusts its own clock, or None")

    def fromLeader(j: int, channel: object) -> bool:
        """
        Whether C{channel} is our own link to peer C{j}, the leader we follow.
        """


class IStreamOwner(IPeers, IRole):
    """
    What the replication stream tells its node.
    """

    def subscribed() -> None:
        """
        A follower asked for our stream: a new active may serve now.
        """


class IHandoffOwner(IPeers, IRole):
    """
    What a handoff, on either side, tells its node.
    """

    def newTerm() -> int:
        """
        A term above every term seen (each attempt claims its own).
        """

    def handingOff() -> None:
        """
        We start handing the active role over: freeze, flush the stream.
        """

    def handoffFailed() -> None:
        """
        The successor did not take over: serve again.
        """

    def handedOff(j: int, term: int, stopping: bool) -> None:
        """
        Peer C{j} took over at C{term}; we leave (C{stopping}) or follow it.
        """

    def tookOver(j: int, term: int) -> None:
        """
        Our leader C{j} handed us the active role at C{term}.
        """

    def justResumed() -> bool:
        """
        Whether this process has just run again after not running for a
        while (stopped, frozen) and has not read its peers since: what it
        reads now may be old news.
        """

    def broadcastHeartbeat() -> None:
        """
        Tell every peer our role now.
        """


class IFollowerOwner(IPeers, IRole):
    """
    What the following side (a standby's copy of its leader) tells its node.
    """

    def snapshotBegins(j: int, term: int) -> None:
        """
        Our leader C{j}, of C{term}, starts sending its state afresh.
        """

    def synchronised(j: int) -> bool:
        """
        The snapshot from C{j} is complete: this node holds the cluster's
        state (True when it was syncing until now).
        """


class IReceiverOwner(IPeers, IRole):
    """
    What the links' events tell the node.
    """

    def sync(channel: object) -> None:
        """
        Our link to our leader is up: ask it for its state.
        """

    def gate() -> None:
        """
        A follower's link is gone: serve only if the serving gate says so.
        """

    def evaluate() -> None:
        """
        A peer is surely gone: judge.
        """


class IHealOwner(IPeers, IRole):
    """
    What a heal's merge reads of its node.
    """


class IHeartbeatOwner(IPeers, IRole):
    """
    What the heartbeats tell their node.
    """

    eventSink = Attribute("the operator's event feed: called as (type, who, detail)")

    def position() -> int:
        """
        How far this node's copy of its leader's stream goes (an active:
        its own stream's position), for its heartbeats.
        """

    def peerTerm(j: int, term: int, token: int) -> None:
        """
        Peer C{j}'s heartbeat carried C{term} and token C{token}, both plausible.
        """

    def resumedLate(idle: float) -> None:
        """
        This process did not run for C{idle} seconds: do not serve until
        the peers are read.
        """

    def ticked() -> None:
        """
        A heartbeat period passed and the peers' liveness is current: judge.
        """

    def evaluate() -> None:
        """
        Something changed (a heartbeat, a peer's liveness): judge.
        """
