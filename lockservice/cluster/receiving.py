# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
Receiving from peers: every line an authenticated peer sends goes to the
collaborator whose concept it is (see L{lockservice.cluster.peerwire} for
the lines), and so does every event of the links (one up, one lost, a
peer surely gone).  Runs of changes (a snapshot, a busy stream) and of a
heal's offer are handed on whole, to be applied in bulk.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from twisted.logger import Logger

from lockservice.cluster import peerwire
from lockservice.cluster.following import Following
from lockservice.cluster.handoff import Handoffs
from lockservice.cluster.healing import Healing
from lockservice.cluster.heartbeats import Heartbeats
from lockservice.cluster.interfaces import IReceiverOwner
from lockservice.cluster.links import Links
from lockservice.cluster.peer import HandshakeLimit, PeerChannel, acceptChannel
from lockservice.cluster.peerwire import CHANGES, OFFERED
from lockservice.cluster.released import Releases
from lockservice.cluster.replication import Stream
from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.server.service import LockService


class Receiver:
    """
    Hands each peer line and link event to its collaborator: the owner of
    every peer channel (L{lockservice.cluster.peer.ChannelOwner}) and the
    links' listener (L{lockservice.cluster.links.LinkEvents}).
    """

    log = Logger()

    def __init__(self, owner: IReceiverOwner, locks: LockService, peers: List[bytes], me: int,
                 secret: bytes, alsoAccepted: Sequence[bytes] = ()) -> None:
        self.owner = owner
        self.locks = locks
        self.clock = locks.clock
        # The handshake's configuration (ChannelOwner).
        self.peers = peers
        self.me = me
        self.myEntry = peers[me]
        self.secret = secret
        self.acceptedSecrets = (secret, *alsoAccepted)
        self.handshakes = HandshakeLimit(self.clock)

    def wire(self, links: Links, releases: Releases, heartbeats: Heartbeats, stream: Stream,
             following: Following, healing: Healing, handoffs: Handoffs) -> None:
        """
        The collaborators, made after the links (which report to us).
        """
        self.links = links
        self.releases = releases
        self.heartbeats = heartbeats
        self.stream = stream
        self.following = following
        self.healing = healing
        self.handoffs = handoffs

    # -- channels (ChannelOwner) --------------------------------------------------

    def indexOf(self, entry: bytes) -> Optional[int]:
        try:
            return self.peers.index(entry)
        except ValueError:
            return None

    def acceptPeer(self, transport: object, hello: bytes) -> PeerChannel:
        """
        A client connection opened with HELLO: it becomes a peer channel.
        """
        return acceptChannel(self, transport, hello, self.handshakes)

    def handshakeFailed(self, remote: int, outbound: bool, why: str,
                        source: str = "") -> None:
        self.links.handshakeFailed(remote, outbound, why, source)
        self.heartbeats.views[remote].secretMismatch = self.links.secretMismatch(remote)

    def handshakeRefused(self, source: str, why: str) -> None:
        self.links.handshakeRefused(source, why)

    def versionRefused(self, remote: int, theirs: Optional[Tuple[int, int]]) -> None:
        self.links.versionRefused(remote, theirs)

    def channelUp(self, channel: PeerChannel) -> None:
        self.links.channelUp(channel)

    # -- the links' events -----------------------------------------------------

    def linkUp(self, channel: PeerChannel) -> None:
        # Acknowledged replication: a paced read would delay the ACK.
        channel.paced = not self.stream.acknowledged
        channel.send(self.heartbeats.line())
        if channel.outbound and self.owner.fromLeader(channel.remote or 0, channel):
            self.owner.sync(channel)

    def channelLost(self, channel: PeerChannel, clean: bool) -> None:
        j = channel.remote
        assert j is not None
        if channel.replicating and self.owner.role in (ACTIVE, HANDING_OFF):
            # A follower that may have missed our last changes, and keeps
            # its copy of the grants (also when we closed the link for its
            # silence): note what we release from now on (see released).
            self.releases.startNoting(self.locks.lastToken(), self.links.lastHeard.get(j, 0.0)
                                      - self.links.peerTimeout)
        if not self.links.channelLost(channel, clean):
            return
        if channel.replicating and not channel.lagging:
            # (A follower we cut off for not reading is not waited for.)
            self.owner.gate()
        current = self.handoffs.current
        if not channel.outbound and current is not None and current.successor == j:
            self.handoffs.lost(j)

    def peerGone(self, j: int) -> None:
        """
        The links are sure peer C{j}'s process is gone (FIN, then refused).
        """
        self.heartbeats.refreshViews()
        self.owner.evaluate()

    # -- lines -----------------------------------------------------------------

    def peerLines(self, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        Lines from an authenticated peer.
        """
        j = channel.remote
        assert j is not None
        self.links.heard(j)
        transport: Any = channel.transport
        if channel.outbound:
            if self.stream.acknowledged and self.owner.fromLeader(j, channel):
                self.following.acknowledge(channel, lines)
        elif len(lines) == 1 and lines[0][:4] == b"ACK " and not channel.closing:
            # A follower's acknowledgement, alone in its read: nearly every
            # read an active under load makes on a peer link.
            try:
                position = int(lines[0][4:])
            except ValueError:
                self.log.warn("malformed peer message {fields!r}", fields=lines[0][:60])
                return
            self.stream.acknowledge(channel, position)
            return
        i, count = 0, len(lines)
        while i < count:
            if channel.closing or transport.disconnecting:
                return
            if lines[i][:2] in CHANGES:
                end = i + 1
                while end < count and lines[end][:2] in CHANGES:
                    end += 1
                self.following.applyChanges(j, channel, lines[i:end])
                i = end
                continue
            if lines[i][:6] in OFFERED:
                end = i + 1
                while end < count and lines[end][:6] in OFFERED:
                    end += 1
                self.healing.merge(j, channel, lines[i:end])
                i = end
                continue
            self.peerMessage(channel, lines[i].rstrip(b"\r").split(b" "))
            i += 1

    def peerMessage(self, channel: PeerChannel, fields: List[bytes]) -> None:
        j = channel.remote
        assert j is not None
        kind = fields[0]
        inbound = not channel.outbound
        try:
            if kind == peerwire.HB:
                self.heartbeats.heard(j, fields)
            elif kind == peerwire.HANDOFF:
                self.handoffs.takeOver(j, channel, peerwire.parseTerm(fields))
            elif kind == peerwire.TAKEN:
                self.handoffs.taken(j, peerwire.parseTerm(fields))
            elif kind == peerwire.REFUSED:
                self.handoffs.refused(j, peerwire.parseTerm(fields))
            elif kind == peerwire.SYNC:
                if inbound:
                    self.healing.offerEnded(j, channel)
                    self.stream.startSnapshot(channel)
            elif kind == peerwire.OFFER:
                self.healing.offered(j, channel, fields)
            elif kind in (peerwire.MERGE, peerwire.RELEASED):
                self.healing.merge(j, channel, [b" ".join(fields)])
            elif kind in (peerwire.HELD, peerwire.GRANT, peerwire.DROP):
                self.following.applyChanges(j, channel, [b" ".join(fields)])
            elif kind == peerwire.SNAP:
                self.following.snapshotBegins(j, channel, fields)
            elif kind == peerwire.SNAPEND:
                self.following.snapshotEnded(j, channel)
            elif kind in peerwire.GROUP_LINES:
                if not self.following.groupChanged(j, channel, fields):
                    self.healing.mergeGroup(j, channel, fields)
            elif kind == peerwire.POSITION:
                # (Acknowledged on receipt: see peerLines.)
                self.following.reached(j, channel, fields)
            elif kind == peerwire.ACK:
                if inbound:
                    self.stream.acknowledge(channel, peerwire.parsePosition(fields))
            elif kind == peerwire.SYNCED:
                if inbound:
                    # Its old copy of the grants is gone (see released.py).
                    channel.applied = True
            else:
                raise peerwire.Malformed(kind)
        except (IndexError, ValueError):
            self.log.warn("malformed peer message {fields!r}", fields=fields[:6])
