# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The following side of the replication stream: how a standby (or a node
still syncing) keeps its copy of its leader's grants.

It asks for state on its own outbound link (C{SYNC}, see
L{lockservice.cluster.node.Cluster.follow}); the leader streams back on
that connection, so the snapshot, the live changes and a C{HANDOFF}
arrive in order.  Each read's changes go to the lock service's mirror in
one batch (L{lockservice.server.mirror.Mirroring.mirror}); with
C{--replication ack} the read is acknowledged on receipt, before it is
applied.  Before it leaves its leader for another, a standby reads up
what that leader's link holds (L{Following.catchUp}).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from twisted.logger import Logger

from lockservice.cluster import peerwire, terms
from lockservice.cluster.healing import Healing
from lockservice.cluster.interfaces import IFollowerOwner
from lockservice.cluster.links import Links
from lockservice.cluster.peer import PeerChannel
from lockservice.cluster.replication import writeNow
from lockservice.server.service import LockService


class Following:
    """
    This node's copy of its leader's stream.
    """

    log = Logger()

    def __init__(self, owner: IFollowerOwner, locks: LockService, links: Links,
                 healing: Healing, wallMicros: Callable[[], int]) -> None:
        self.owner = owner
        self.healing = healing
        self.locks = locks
        self.clock = locks.clock
        self.links = links
        self.wallMicros = wallMicros
        # The leader whose link we read up before leaving it (see catchUp).
        self._leavingLeader: Optional[int] = None
        self.syncStartedAt = self.clock.seconds()
        # How far our copy of our leader's stream goes: the last position
        # it marked (S) that we received.  Heartbeats tell it: a standby
        # whose stream was cut (a silent link, one way) is behind the
        # others, and does not promote over them (see core/election.py).
        self.position = 0

    def followed(self, previous: Optional[int], j: int) -> None:
        """
        The node now follows peer C{j} (it followed C{previous}): ask it
        for its state.
        """
        if previous != j:
            self.log.info("following {peer}", peer=self.owner.name(j), event="following")
            self.position = 0
        self._leavingLeader = None  # read it up again before leaving it
        channel = self.links.outbound.get(j)
        if channel is not None:
            self.sync(channel)

    def sync(self, channel: PeerChannel) -> None:
        """
        Ask our leader for its state; first offer it our held keys when we
        come from a heal (they arrive before the SYNC, so its snapshot
        already holds them).
        """
        self.healing.sendOffer(channel)
        if self.owner.clockSuspect is None:
            # (A node that distrusts its clock would refuse the snapshot.)
            channel.send(peerwire.SYNC)

    def catchUp(self, leader: Optional[int]) -> bool:
        """
        Before leaving our leader for another, apply what its link already
        holds: the new leader's heartbeat may have overtaken the old one's
        last changes (a paced read, or another socket read first), and a
        copy that misses a release would offer the new leader that lock
        back (see L{lockservice.cluster.healing}).

        @return: whether we read it now (once per leader change).
        """
        channel = self.links.outbound.get(leader) if leader is not None else None
        if channel is None or self._leavingLeader == leader:
            return False
        self._leavingLeader = leader
        channel.catchUp()
        return True

    # -- what the leader sends -------------------------------------------------

    def snapshotBegins(self, j: int, channel: PeerChannel, fields: Sequence[bytes]) -> None:
        if not self.owner.fromLeader(j, channel):
            return
        term, token = peerwire.parseSnapshotBegins(fields)
        owner = self.owner
        if owner.plausible(j, token, "token") and owner.plausible(j, term, "term"):
            self.locks.clearHolders()
            self.position = 0
            self.syncStartedAt = self.clock.seconds()
            self.links.longestSilence[j] = 0.0
            self.locks.observeToken(token)
            owner.snapshotBegins(j, term)

    def snapshotEnded(self, j: int, channel: PeerChannel) -> None:
        if not self.owner.fromLeader(j, channel):
            return
        if self.owner.synchronised(j):
            self.log.info(
                "synchronised from {peer} ({keys} held keys) in {seconds:.3f} s "
                "(longest silence from it meanwhile: {silence:.0f} ms)",
                peer=self.owner.name(j), keys=self.locks.heldCount(),
                seconds=self.clock.seconds() - self.syncStartedAt,
                silence=self.links.longestSilence.get(j, 0.0) * 1000, event="synchronised")
        channel.send(peerwire.SYNCED)

    def applyChanges(self, j: int, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        A run of C{H}/C{G} (held keys), C{D} (dropped) and C{S} (position)
        lines from peer C{j}: parsed in one loop and mirrored in one batch;
        then our copy goes as far as the last position.
        """
        owner = self.owner
        if not owner.fromLeader(j, channel):
            return
        parsed = peerwire.parseChanges(lines, self.clock.seconds(),
                                       terms.limit(self.wallMicros()))
        for fields in parsed.malformed:
            self.log.warn("malformed peer message {fields!r}", fields=fields)
        for token in parsed.implausible:
            owner.plausible(j, token, "token")  # logs it
        if parsed.changes:
            self.locks.mirror(parsed.changes)
        if parsed.position is not None:
            self.position = parsed.position

    def groupChanged(self, j: int, channel: PeerChannel, fields: Sequence[bytes]) -> bool:
        """
        A group or member line from peer C{j}: applied when it is our
        leader's stream.

        @return: whether it was (else it may be a heal's offer).
        """
        if not self.owner.fromLeader(j, channel):
            return False
        present, record = peerwire.parseGroupLine(fields, self.clock.seconds())
        if present:
            self.locks.groups.install([record])
        else:
            self.locks.groups.remove(record.group, record.member)
        return True

    def acknowledge(self, channel: PeerChannel, lines: Sequence[bytes]) -> None:
        """
        On receipt of our leader's stream (the caller checked that it is),
        before applying it: acknowledge the last stream position in this
        read (one C{ACK} per read, however many positions it holds), so
        the active's wait overlaps our work.  Every write of the stream
        ends with its position, so that is mostly the last line.
        """
        last = lines[-1]
        position = last[2:].rstrip(b"\r") if last[:2] == b"S " else peerwire.lastPosition(lines)
        if position is not None:
            writeNow(channel, peerwire.ackLine(position))

    def reached(self, j: int, channel: PeerChannel, fields: Sequence[bytes]) -> None:
        """
        An C{S} line: our copy of our leader's stream goes this far.
        """
        if self.owner.fromLeader(j, channel):
            self.position = peerwire.parsePosition(fields)
