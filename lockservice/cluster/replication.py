# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The replication stream, on the active's side: what it sends its standbys
(SYNC, SNAP, H, SNAPEND, G, D, S and ACK lines: see
L{lockservice.cluster.peerwire}), and the gate client answers wait at.
The standby's side is L{lockservice.cluster.following}.

The live stream is written to the standbys' sockets before any client
answer (L{Stream} is the lock service's answer gate, see
L{lockservice.server.turn}): every change of one reactor turn goes to each
standby in one write, and answers wait until every synchronised standby
has it -- with C{--replication sent}, until it has left this host's
socket buffers; with C{--replication ack} (the default), until the
standby acknowledged receiving it.  So a kill -9 of the active never loses
a change that a client was told about, and with C{ack} neither do packets
dropped on the way nor a crash of the active's whole host.

A snapshot is streamed in chunks by a pull producer: the transport asks
for the next chunk when it has sent the previous one, so heartbeats keep
flowing on both sides however many keys there are.  Each chunk reads the
keys' current state, and the live stream runs alongside, so the follower
ends with the leader's state whatever changed meanwhile.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

from twisted.internet.interfaces import IDelayedCall, IPullProducer
from twisted.logger import Logger
from zope.interface import implementer

from lockservice.cluster import peerwire
from lockservice.cluster.interfaces import IStreamOwner
from lockservice.cluster.links import Links
from lockservice.cluster.peer import PeerChannel
from lockservice.cluster.peerwire import (
    DROP_LINE,
    GRANT_LINE,
    HELD_LINE,
    NO_HOLDER,
    Change,
    micros,
)
from lockservice.cluster.released import Releases
from lockservice.core.election import ACTIVE, HANDING_OFF
from lockservice.core.groups import GroupObserver, GroupRecord
from lockservice.core.table import EXCLUSIVE
from lockservice.internals import flushToKernel, sendNow
from lockservice.server.service import LockService

SNAPSHOT_CHUNK = 4000


def writeNow(channel: PeerChannel, data: bytes) -> None:
    """
    Put C{data} into the kernel's socket buffer now when the link is plain
    TCP with nothing queued in Twisted; otherwise queue it behind what the
    transport already holds and push that to the kernel too (TLS: the
    encrypted bytes).  Either way a kill -9 right after cannot lose it.
    """
    transport: Any = channel.transport
    if not sendNow(channel.socket, transport, data):
        flushToKernel(transport)


@implementer(IPullProducer)
class SnapshotProducer:
    """
    Streams one snapshot to one follower, a chunk each time the transport
    asks for more.
    """

    def __init__(self, stream: "Stream", channel: PeerChannel, keys: List[bytes]) -> None:
        self.stream = stream
        self.channel = channel
        self.keys = keys
        # The groups and their members follow the keys (few: read at once).
        self.groups = list(stream.locks.groups.registry.records(stream.clock.seconds()))
        self.index = 0
        self.stopped = False
        self.startedAt = stream.clock.seconds()
        assert channel.remote is not None
        stream.links.longestSilence[channel.remote] = 0.0

    def resumeProducing(self) -> None:
        if self.stopped:
            return
        stream = self.stream
        # The keys were copied at the start; each one's grant is read now
        # (it may have ended or changed since).
        table = stream.locks.table
        plainGrantOf = table.plainGrantOf
        now = stream.clock.seconds()
        lines: List[bytes] = []
        end = self.index + SNAPSHOT_CHUNK
        for key in self.keys[self.index:end]:
            grant = plainGrantOf(key)
            if grant is not None:
                token, grantedAt, expiresAt, name = grant
                lines.append(HELD_LINE % (key, token, micros(expiresAt - now),
                                          micros(now - grantedAt), name or NO_HOLDER))
            elif key in table:  # shared, or a place kept by the lock-delay
                lines.append(b"\n".join(peerwire.sharedLines(
                    b"H", key, table.sharedGrantsOf(key), now)) + b"\n")
        self.index = end
        done = self.index >= len(self.keys)
        if done:
            lines.extend(peerwire.groupLine(record, now) for record in self.groups)
            lines.append(peerwire.SNAPEND + b"\n")
        if lines:
            self.channel.transport.write(b"".join(lines))
        if done:
            self.stopped = True
            self.channel.snapshot = None
            self.channel.transport.unregisterProducer()  # type: ignore[attr-defined]
            self.channel.synced = True
            self.stream.snapshotSent(self)

    def stopProducing(self) -> None:
        self.stopped = True


# How many of the latest acknowledgement waits /status and /metrics read.
WAITS_KEPT = 4096

# The replication modes (--replication).
ACK = "ack"
SENT = "sent"
MODES = (ACK, SENT)


class Stream(GroupObserver):
    """
    The sending side of the replication stream (a LockService change
    observer and mirror observer), and the gate client answers wait at
    (L{lockservice.server.turn.Gate}): a position is one flush of the
    stream.

    @ivar position: the last position flushed.
    """

    log = Logger()

    def __init__(self, owner: IStreamOwner, locks: LockService, links: Links,
                 releases: Releases, peerTimeout: float, mode: str = ACK,
                 firstPosition: int = 0) -> None:
        """
        @param firstPosition: where this process's stream positions start:
            the wall clock in microseconds when it starts, so a restarted
            node's positions lie above those of its earlier run (a copy at
            a higher position of one node's stream is a later one).
        """
        self.owner = owner
        self.locks = locks
        self.clock = locks.clock
        self.links = links
        # Releases a lost follower may not know of (see released.py).
        self.releases = releases
        self.peerTimeout = peerTimeout
        self.acknowledged = mode == ACK
        # The gate's hooks (lockservice.server.turn.Gate): never empty, so a
        # cluster node's answers always wait for this stream.
        self.hooks: List[Callable[[], Optional[bool]]] = [self.flush]
        self.position = firstPosition
        self._reached = firstPosition
        self.pending: List[bytes] = []
        # Read at every change (bound once: never replaced).
        self._inbound = links.inbound
        self._table = locks.table
        self._answers = locks.answers
        self._flushLater: Optional[IDelayedCall] = None
        # Whether a follower's link still holds unsent bytes (a seam for tests).
        self.leftUnsent: Callable[[PeerChannel], bool] = lambda channel: channel.leftUnsent()
        # The acknowledgement wait (--replication ack): when each position
        # still waited for was written, and how long the last WAITS_KEPT
        # positions waited (seconds, a ring), for /status and /metrics.
        self._writtenAt: Deque[Tuple[int, float]] = deque()
        self._waits = array("d", bytes(8 * WAITS_KEPT))
        self._waitsSeen = 0

    # -- the sending side (a LockService observer) -------------------------

    def _queue(self, line: bytes) -> None:
        for channel in self._inbound.values():
            if channel.replicating:
                break
        else:
            return  # nobody to send it to
        self.pending.append(line)
        if self._flushLater is None and self._answers.current is None:
            # Outside the lock service's turns (which flush us when they
            # close, answers or not), changes still leave within this
            # reactor iteration.
            self._flushLater = self.clock.callLater(0, self.flush)

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float, name: Optional[bytes]) -> None:
        """
        A grant made now (the lock service tells at once: C{grantedAt} is
        now, its age 0).  Every grant: L{_queue}'s work is inline, and a
        table with no shared key needs no look-up of the grant's share.
        """
        for channel in self._inbound.values():
            if channel.replicating:
                break
        else:
            return
        if self._table.sharedGrants:
            share = self._table.shareOf(key, token)
            if share != EXCLUSIVE:
                self.pending.append(peerwire.grantLine(
                    key, token, int((expiresAt - grantedAt) * 1e6), 0, share, name))
                if self._flushLater is None and self._answers.current is None:
                    self._flushLater = self.clock.callLater(0, self.flush)
                return
        self.pending.append(GRANT_LINE % (key, token, int((expiresAt - grantedAt) * 1e6), 0,
                                          name or NO_HOLDER))
        if self._flushLater is None and self._answers.current is None:
            self._flushLater = self.clock.callLater(0, self.flush)

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        now = self.clock.seconds()
        table = self.locks.table
        self._queue(peerwire.grantLine(key, token, micros(expiresAt - now),
                                       micros(now - grantedAt), table.shareOf(key, token),
                                       table.nameOfGrant(key, token)))

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        for channel in self._inbound.values():  # _queue, inline: every release
            if channel.replicating:
                self.pending.append(DROP_LINE % (key, token))
                if self._flushLater is None and self._answers.current is None:
                    self._flushLater = self.clock.callLater(0, self.flush)
                break
        if not expired:
            self.releases.released(key, token, self.clock.seconds())

    def groupSet(self, record: GroupRecord) -> None:
        """
        A group created, or a member joined, renewed or changed (the
        registry's observer).
        """
        self._queue(peerwire.groupLine(record, self.clock.seconds()))

    def groupUnset(self, group: bytes, member: Optional[bytes]) -> None:
        self._queue(peerwire.groupGoneLine(group, member))

    def delayed(self, key: bytes, token: int, until: float) -> None:
        table = self.locks.table
        place = table.placeOf(key, token)
        if place is None:
            return
        now = self.clock.seconds()
        self._queue(peerwire.grantLine(key, token, micros(until - now), micros(now - place[0]),
                                       table.shareOf(key, token),
                                       table.nameOfGrant(key, token), delayed=True))

    def delayEnded(self, key: bytes, token: int) -> None:
        self._queue(DROP_LINE % (key, token))

    def mirrored(self, now: float, changes: Sequence[Change]) -> None:
        """
        A batch the lock service mirrored: on the active, what a heal
        merged goes on to our standbys (a grant pushed out is dropped, as
        an expiry: no release note).  A standby's own batches go nowhere.
        """
        if self.locks.role not in (ACTIVE, HANDING_OFF):
            return
        for key, token, grantedAt, expiresAt, share, name, delayed in changes:
            if expiresAt is None:
                self._queue(DROP_LINE % (key, token))
            else:
                self._queue(peerwire.grantLine(key, token, micros(expiresAt - now),
                                               micros(now - grantedAt), share, name, delayed))

    def flush(self) -> bool:
        """
        Write every pending change to every follower, one write each.

        @return: whether clients may hear about the changes now: every
            synchronised follower has taken everything written to it (see
            L{caughtUp}).
        """
        if self._flushLater is not None:
            if self._flushLater.active():
                self._flushLater.cancel()
            self._flushLater = None
        if self.pending:
            self.position += 1
            # Acknowledged with --replication ack; either way the followers
            # know how far their copy goes, and say so in their heartbeats.
            self.pending.append(peerwire.positionLine(self.position))
            data = b"".join(self.pending)
            self.pending = []
            waited = False
            for channel in self._inbound.values():
                if channel.replicating:
                    writeNow(channel, data)
                    if channel.synced and not channel.lagging:
                        waited = True
            if not waited:
                # Nobody to wait for (no standby, or only ones still syncing).
                self._reach(self.position)
            elif self.acknowledged:
                now = self.clock.seconds()
                self._writtenAt.append((self.position, now))
                # Answers now wait for acknowledgements (see acknowledge).
                return now - self._writtenAt[0][1] >= self.peerTimeout and self._cutOff(now)
        if self.acknowledged:
            return self._reached >= self.position or self._cutOff(self.clock.seconds())
        return self.caughtUp()

    # -- the answer gate (lockservice.server.turn.Gate) ---------------------

    def publish(self) -> int:
        if self.flush():
            self._reach(self.position)
        return self.position

    def reached(self) -> int:
        # With --replication ack, acknowledgements move it (acknowledge),
        # and so does the look at a follower gone or silent (_cutOff, at
        # every flush while answers wait).
        if self._reached < self.position and not self.acknowledged and self.caughtUp():
            self._reach(self.position)
        return self._reached

    def _acknowledgedUpTo(self) -> int:
        """
        The highest position every follower answers wait for has
        acknowledged (a follower still receiving its snapshot, or cut off,
        is not waited for).
        """
        upTo = self.position
        for channel in self._inbound.values():
            if channel.synced and not channel.lagging and channel.acked < upTo:
                upTo = channel.acked
        return upTo

    def _reach(self, position: int) -> None:
        """
        Answers that wait for C{position} or less may go now; the
        positions written since they were waited for tell the wait.
        """
        if position <= self._reached:
            return
        self._reached = position
        written = self._writtenAt
        if written and written[0][0] <= position:
            now = self.clock.seconds()
            waits, seen = self._waits, self._waitsSeen
            while written and written[0][0] <= position:
                waits[seen % WAITS_KEPT] = now - written.popleft()[1]
                seen += 1
            self._waitsSeen = seen

    def acknowledge(self, channel: PeerChannel, position: int) -> None:
        """
        Follower C{channel} has received the stream up to C{position}:
        answers waiting for it go out now, in this turn, once every
        follower they wait for has acknowledged them (the first of two
        standbys to acknowledge a write releases nothing).
        """
        if position > channel.acked:
            channel.acked = min(position, self.position)
            if channel.acked > self._reached:
                upTo = self._acknowledgedUpTo()
                if upTo > self._reached:
                    self._reach(upTo)
                    self._answers.reachedMoved()

    def _cutOff(self, now: float) -> bool:
        """
        With C{--replication ack}: cut off every follower that has not
        acknowledged the oldest write still waited for, made
        --peer-timeout ago or more (it syncs again when it comes back),
        rather than stop the service.

        @return: whether nothing is waited for any more.
        """
        self._reach(self._acknowledgedUpTo())  # (a follower gone since)
        written = self._writtenAt
        if self._reached >= self.position or not written:
            return self._reached >= self.position
        oldest, writtenAt = written[0]
        if now - writtenAt < self.peerTimeout:
            return False
        for channel in list(self._inbound.values()):
            if channel.synced and not channel.lagging and channel.acked < oldest:
                self._cut(channel, now - writtenAt)
        self._reach(self._acknowledgedUpTo())
        return self._reached >= self.position

    def _cut(self, channel: PeerChannel, seconds: float) -> None:
        self.log.warn(
            "{peer} {what} no replication for {seconds:.1f} s: link closed, "
            "it syncs again when it reads",
            peer=self.owner.name(channel.remote) if channel.remote is not None else "?",
            what="acknowledged" if self.acknowledged else "took",
            seconds=seconds, event="follower_cut_off")
        channel.lagging = True
        channel.close(abort=True)

    def caughtUp(self) -> bool:
        """
        With C{--replication sent}: whether every synchronised follower
        has taken all we wrote to it.

        A kernel socket takes a write at once while the standby reads; when
        it does not (stopped, overloaded), the stream stays in this host's
        send queue, and a kill -9 of this process would lose it (a process
        killed with unread input resets its connections, which drops that
        queue).  So the lock service holds client answers until the stream
        has left; a follower that takes nothing for --peer-timeout is cut
        off (it syncs again when it comes back) rather than stop the
        service.  A follower still receiving its snapshot is not waited
        for: it is not a replica yet.
        """
        ready = True
        now = -1.0
        for channel in self._inbound.values():
            if not channel.synced or channel.lagging:
                continue
            if not self.leftUnsent(channel):
                channel.behindSince = None
                continue
            if now < 0:
                now = self.clock.seconds()
            if channel.behindSince is None:
                channel.behindSince = now
            elif now - channel.behindSince >= self.peerTimeout:
                self._cut(channel, now - channel.behindSince)
                continue
            ready = False
        return ready

    # -- what /status and /metrics read --------------------------------------

    def inSync(self) -> int:
        """
        How many standbys answers wait for now: synchronised, not cut off.
        """
        return sum(1 for c in self._inbound.values()
                   if c.replicating and c.synced and not c.lagging)

    def ackWaits(self) -> Tuple[Optional[float], Optional[float]]:
        """
        The median and 99th percentile, in seconds, of how long the last
        (up to) L{WAITS_KEPT} positions written waited for every standby's
        acknowledgement, or None for each when none did (C{sent}, a lone
        active).
        """
        count = min(self._waitsSeen, WAITS_KEPT)
        if not count:
            return None, None
        waits = sorted(self._waits[:count])
        return waits[count // 2], waits[min(count - 1, (count * 99) // 100)]

    def leadNoMore(self) -> None:
        """
        This node stopped leading (it handed off, or stepped down): its
        followers now follow another, and ask again (C{SYNC}: a fresh
        snapshot) when they follow this node again.  Until then nobody is
        streamed to nor waited for.  A follower left marked synchronised
        would hold every answer of this node's next term until it
        acknowledged a stream it no longer reads (after a handoff back,
        until its next heartbeat: about 100 ms).
        """
        self.flush()  # what this node's term changed goes out first
        self._writtenAt.clear()  # (waits never acknowledged tell no wait)
        for channel in self._inbound.values():
            producer = channel.snapshot
            if producer is not None:
                producer.stopProducing()
                channel.snapshot = None
                channel.transport.unregisterProducer()  # type: ignore[attr-defined]
            channel.replicating = False
            channel.synced = False

    # -- snapshots -----------------------------------------------------------

    def startSnapshot(self, channel: PeerChannel) -> None:
        """
        A follower asked for our state (C{SYNC}): stream a snapshot, and
        the live changes from now on.
        """
        self.flush()
        old = channel.snapshot
        if old is not None:
            old.stopProducing()
            channel.transport.unregisterProducer()  # type: ignore[attr-defined]
        locks = self.locks
        channel.synced = False
        channel.applied = False
        channel.acked = self.position  # what came before is in the snapshot
        channel.send(peerwire.snapshotBegins(self.owner.term, locks.lastToken()))
        channel.replicating = True
        producer = SnapshotProducer(self, channel, locks.table.keys())
        channel.snapshot = producer
        channel.transport.registerProducer(producer, False)  # type: ignore[attr-defined]
        self.owner.subscribed()  # a new active may be waiting for this subscriber

    def snapshotSent(self, producer: SnapshotProducer) -> None:
        j = producer.channel.remote
        assert j is not None
        self.log.info(
            "snapshot of {keys} held keys sent to {peer} in {seconds:.3f} s "
            "(longest silence from it meanwhile: {silence:.0f} ms)",
            keys=len(producer.keys), peer=self.owner.name(j),
            seconds=self.clock.seconds() - producer.startedAt,
            silence=self.links.longestSilence.get(j, 0.0) * 1000, event="snapshot_sent",
        )
