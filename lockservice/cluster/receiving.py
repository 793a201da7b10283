# -*- test-case-name: tests.test_cluster_unit -*-
"""
Receiving peer lines: every line an authenticated peer sends goes to the
collaborator whose concept it is (see L{lockservice.cluster.peerwire} for
the lines).  Runs of changes (a snapshot, a busy stream) and of a heal's
offer are handed on whole, to be applied in bulk.
"""

from __future__ import annotations

from typing import Any, List

from twisted.logger import Logger

from lockservice.cluster import peerwire
from lockservice.cluster.following import Following
from lockservice.cluster.handoff import Handoffs
from lockservice.cluster.healing import Healing
from lockservice.cluster.heartbeats import Heartbeats
from lockservice.cluster.links import Links
from lockservice.cluster.peer import PeerChannel
from lockservice.cluster.peerwire import CHANGES, OFFERED
from lockservice.cluster.replication import Stream


class Receiver:
    """
    Hands each peer line to its collaborator.
    """

    log = Logger()

    def __init__(self, links: Links, heartbeats: Heartbeats, stream: Stream,
                 following: Following, healing: Healing, handoffs: Handoffs) -> None:
        self.links = links
        self.heartbeats = heartbeats
        self.stream = stream
        self.following = following
        self.healing = healing
        self.handoffs = handoffs

    def peerLines(self, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        Lines from an authenticated peer.
        """
        j = channel.remote
        assert j is not None
        self.links.heard(j)
        transport: Any = channel.transport
        if self.stream.acknowledged and channel.outbound:
            self.following.acknowledge(channel, lines)
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
            elif kind == peerwire.POSITION:
                pass  # acknowledged on receipt (see peerLines)
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
