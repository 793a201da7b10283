# -*- test-case-name: tests.test_replication -*-
"""
The replication stream: what an active node sends its standbys, and how a
standby (or, on a heal, the winner) applies it.

Lines on a peer channel:

    SYNC                                    follower -> leader: send state, then stream
    OFFER, RELEASED, MERGE lines            follower -> leader, before SYNC, on a heal:
                                            what the follower holds and released
                                            (see L{lockservice.cluster.merge})
    SNAP <term> <last_token>                leader -> follower: a snapshot begins
    H <key> <token> <remaining_us> <age_us> one held key of the snapshot
    SNAPEND                                 the snapshot is complete
    SYNCED                                  follower -> leader: it applied the snapshot
    G <key> <token> <remaining_us> <age_us> a grant or a renewal (live stream)
    D <key> <token>                         a release or an expiry (live stream)
    S <position>                            --replication ack: the stream up to here
                                            is <position> (one line per flush)
    ACK <position>                          follower -> leader, on receipt, once per
                                            read: it has received up to <position>

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

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from twisted.internet.interfaces import IDelayedCall, IPullProducer
from zope.interface import implementer

from lockservice.cluster import merge as merging
from lockservice.cluster.clocktrust import PLAUSIBLE_AHEAD
from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE
from lockservice.core.table import EXCLUSIVE, LockTable, fitTogether
from lockservice.core.wire import formatShare, parseShare
from lockservice.internals import flushToKernel, sendNow

if TYPE_CHECKING:
    from lockservice.cluster.node import Cluster

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


def _us(seconds: float) -> int:
    return int(seconds * 1e6)


# -- shared keys (SPEC section 2, "Shared keys") --------------------------------
# A grant of a shared key is a G/H/MERGE line with a sixth field, its share as
# on the client wire (r, or the semaphore's slots); an exclusive grant's line
# has none, as ever.  A shared key's grants go highest token first, so that a
# heal that reads them one by one keeps what fitTogether keeps of them all.


def sharedLines(kind: bytes, key: bytes, table: LockTable, now: float) -> List[bytes]:
    """
    The C{kind} (H, MERGE) lines of every grant of a shared C{key}.
    """
    return [b"%s %s %d %d %d %s" % (kind, key, token, _us(expiresAt - now), _us(now - grantedAt),
                                    formatShare(share))
            for token, grantedAt, expiresAt, share in table.sharedGrantsOf(key)]


def shareField(fields: List[bytes]) -> int:
    """
    The share of a G/H/MERGE line (EXCLUSIVE without a sixth field).

    @raise ValueError: a malformed share.
    """
    if len(fields) < 6:
        return EXCLUSIVE
    share = parseShare(fields[5])
    if share is None:
        raise ValueError(fields[5])
    return share


def mergeShared(locks: Any, key: bytes, token: int, share: int, remaining: float,
                age: float) -> Tuple[bool, List[int]]:
    """
    On a heal, the winner's rule for an offered grant of a key that either
    side holds in shared form: the grants of both sides that fit together
    are kept, highest tokens first (L{fitTogether}).

    @return: whether the offered grant is kept (and installed), and the
        tokens of our own grants that it pushed out (dropped here; the
        caller tells the standbys).
    """
    table: LockTable = locks.table
    ours = table.sharedGrantsOf(key)
    for held, _, expiresAt, _ in ours:
        if held == token:
            # The same grant on both sides: the later deadline wins (a
            # renewal answered there), as for an exclusive grant.
            if locks.clock.seconds() + remaining <= expiresAt + merging.RENEWAL_SLACK:
                return False, []
            locks.installHolder(key, token, remaining, age, share)
            return True, []
    kept = set(fitTogether([(held, s) for held, _, _, s in ours] + [(token, share)]))
    if token not in kept:
        return False, []
    pushedOut = [held for held, _, _, _ in ours if held not in kept]
    for held in pushedOut:
        locks.dropHolder(key, held)
    locks.installHolder(key, token, remaining, age, share)
    return True, pushedOut


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
        self.index = 0
        self.stopped = False
        self.startedAt = stream.cluster.clock.seconds()
        assert channel.remote is not None
        stream.cluster.links.longestSilence[channel.remote] = 0.0

    def resumeProducing(self) -> None:
        if self.stopped:
            return
        cluster = self.stream.cluster
        # The keys were copied at the start; each one's grant is read now
        # (it may have ended or changed since).
        table = cluster.locks.table
        grantOf = table.grantOf
        now = cluster.clock.seconds()
        lines: List[bytes] = []
        end = self.index + SNAPSHOT_CHUNK
        for key in self.keys[self.index:end]:
            if table.isShared(key):
                lines.extend(sharedLines(b"H", key, table, now))
                continue
            grant = grantOf(key)
            if grant is not None:
                token, grantedAt, expiresAt = grant
                lines.append(b"H %s %d %d %d" % (key, token, _us(expiresAt - now),
                                                 _us(now - grantedAt)))
        self.index = end
        done = self.index >= len(self.keys)
        if done:
            lines.append(b"SNAPEND")
        if lines:
            self.channel.transport.write(b"\n".join(lines) + b"\n")
        if done:
            self.stopped = True
            self.channel.snapshot = None
            self.channel.transport.unregisterProducer()  # type: ignore[attr-defined]
            self.channel.synced = True
            self.stream.snapshotSent(self)

    def stopProducing(self) -> None:
        self.stopped = True


# The replication modes (--replication).
ACK = "ack"
SENT = "sent"
MODES = (ACK, SENT)


class Stream:
    """
    Both ends of the replication stream, for one node, and the gate client
    answers wait at (L{lockservice.server.turn.Gate}): a position is one
    flush of the stream.

    @ivar position: the last position flushed.
    """

    def __init__(self, cluster: "Cluster", mode: str = ACK) -> None:
        self.cluster = cluster
        self.acknowledged = mode == ACK
        # The gate's hooks (lockservice.server.turn.Gate): never empty, so a
        # cluster node's answers always wait for this stream.
        self.hooks: List[Callable[[], Optional[bool]]] = [self.flush]
        self.position = 0
        self._reached = 0
        self.pending: List[bytes] = []
        self._flushLater: Optional[IDelayedCall] = None
        # Whether a follower's link still holds unsent bytes (a seam for tests).
        self.leftUnsent: Callable[[PeerChannel], bool] = lambda channel: channel.leftUnsent()

    # -- the sending side (a LockService observer) -------------------------

    def _followers(self) -> List[PeerChannel]:
        return [c for c in self.cluster.links.inbound.values() if c.replicating]

    def _queue(self, line: bytes) -> None:
        if not any(c.replicating for c in self.cluster.links.inbound.values()):
            return
        self.pending.append(line)
        if self._flushLater is None and self.cluster.locks.turn is None:
            # Outside the lock service's turns (which flush us when they
            # close, answers or not), changes still leave within this
            # reactor iteration.
            self._flushLater = self.cluster.clock.callLater(0, self.flush)

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float) -> None:
        now = self.cluster.clock.seconds()
        share = self.cluster.locks.table.shareOf(key, token)
        if share != EXCLUSIVE:
            self._queue(b"G %s %d %d %d %s\n" % (key, token, _us(expiresAt - now),
                                                 _us(now - grantedAt), formatShare(share)))
            return
        self._queue(b"G %s %d %d %d\n" % (key, token, _us(expiresAt - now), _us(now - grantedAt)))

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        now = self.cluster.clock.seconds()
        age = now - grantedAt
        share = self.cluster.locks.table.shareOf(key, token)
        tail = b"" if share == EXCLUSIVE else b" " + formatShare(share)
        self._queue(b"G %s %d %d %d%s\n" % (key, token, _us(expiresAt - now), _us(age), tail))

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        self._queue(b"D %s %d\n" % (key, token))
        if not expired:
            self.cluster.releases.released(key, token, self.cluster.clock.seconds())

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
        followers = self._followers()
        if self.pending:
            self.position += 1
            if self.acknowledged:
                self.pending.append(b"S %d\n" % self.position)
            data = b"".join(self.pending)
            self.pending = []
            for channel in followers:
                writeNow(channel, data)
        return self.caughtUp(followers)

    # -- the answer gate (lockservice.server.turn.Gate) ---------------------

    def publish(self) -> int:
        if self.flush():
            self._reached = self.position
        return self.position

    def reached(self) -> int:
        if self._reached < self.position:
            followers = self._followers()
            if self.caughtUp(followers):
                self._reached = self.position
            elif self.acknowledged:
                self._reached = max(self._reached, min(
                    (c.acked for c in followers if c.synced and not c.lagging),
                    default=self.position))
        return self._reached

    def acknowledge(self, channel: PeerChannel, position: int) -> None:
        """
        Follower C{channel} has received the stream up to C{position}.
        """
        if position > channel.acked:
            channel.acked = min(position, self.position)
            self.cluster.locks.answers.reachedMoved()

    def caughtUp(self, followers: List[PeerChannel]) -> bool:
        """
        Whether every synchronised follower has taken all we wrote to it.

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
        acknowledged, position = self.acknowledged, self.position
        for channel in followers:
            if not channel.synced or channel.lagging:
                continue
            if not (channel.acked < position if acknowledged else self.leftUnsent(channel)):
                channel.behindSince = None
                continue
            if now < 0:
                now = self.cluster.clock.seconds()
            if channel.behindSince is None:
                channel.behindSince = now
            elif now - channel.behindSince >= self.cluster.peerTimeout:
                self.cluster.log.warn(
                    "{peer} {what} no replication for {seconds:.1f} s: link closed, "
                    "it syncs again when it reads",
                    peer=self.cluster.name(channel.remote) if channel.remote is not None else "?",
                    what="acknowledged" if acknowledged else "took",
                    seconds=now - channel.behindSince)
                channel.lagging = True
                channel.close(abort=True)
                continue
            ready = False
        return ready

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
        locks = self.cluster.locks
        channel.synced = False
        channel.applied = False
        channel.acked = self.position  # what came before is in the snapshot
        channel.send(b"SNAP %d %d" % (self.cluster.term, locks.lastToken()))
        channel.replicating = True
        producer = SnapshotProducer(self, channel, locks.table.keys())
        channel.snapshot = producer
        channel.transport.registerProducer(producer, False)  # type: ignore[attr-defined]
        self.cluster.gate()  # a new active may be waiting for this subscriber

    def snapshotSent(self, producer: SnapshotProducer) -> None:
        cluster = self.cluster
        j = producer.channel.remote
        assert j is not None
        cluster.log.info(
            "snapshot of {keys} held keys sent to {peer} in {seconds:.3f} s "
            "(longest silence from it meanwhile: {silence:.0f} ms)",
            keys=len(producer.keys), peer=cluster.name(j),
            seconds=cluster.clock.seconds() - producer.startedAt,
            silence=cluster.links.longestSilence.get(j, 0.0) * 1000,
        )

    def sendMerge(self, channel: PeerChannel, origin: Tuple[int, int]) -> Tuple[int, int]:
        """
        Offer the leader we now follow (a heal) every grant we hold and
        every release we noted since we diverged (see merge.py), so that
        it keeps the one and does not undo the other.

        @param origin: the (leader, term) whose stream our keys mirror.
        @return: how many grants and release notes were offered.
        """
        now = self.cluster.clock.seconds()
        grants = [(key, token, _us(expiresAt - now), _us(now - grantedAt),
                   None if share == EXCLUSIVE else formatShare(share))
                  for key, token, grantedAt, expiresAt, share
                  in self.cluster.locks.table.everyGrant()]
        notes = list(self.cluster.releases.notes())
        data = merging.offerLines(origin, notes, grants)
        if data:
            channel.transport.write(data)
        return len(grants), len(notes)

    # -- the receiving side -------------------------------------------------

    def apply(self, j: int, channel: PeerChannel, fields: List[bytes]) -> None:
        """
        One replication line from peer C{j}.

        @raise ValueError: on a malformed line.
        """
        cluster = self.cluster
        kind = fields[0]
        if kind in (b"G", b"H", b"D"):
            self.applyChanges(j, channel, [b" ".join(fields)])
        elif kind == b"SYNC":
            if not channel.outbound:
                self.startSnapshot(channel)
        elif kind == b"OFFER":
            self.offered(j, channel, int(fields[1]), int(fields[2]))
        elif kind in (merging.MERGE, merging.RELEASED):
            self.merge(j, channel, [b" ".join(fields)])
        elif kind == b"SNAP":
            if cluster.fromLeader(j, channel):
                term, token = int(fields[1]), int(fields[2])
                if cluster.plausible(j, token, "token") and cluster.plausible(j, term, "term"):
                    cluster.locks.clearHolders()
                    cluster.syncStartedAt = cluster.clock.seconds()
                    cluster.links.longestSilence[j] = 0.0
                    cluster.locks.observeToken(token)
                    cluster.learnTerm(term)
                    cluster.term = term
        elif kind == b"SNAPEND":
            if cluster.fromLeader(j, channel):
                cluster.synchronised(j)
                channel.send(b"SYNCED")
        elif kind == b"S":
            pass  # acknowledged on receipt (see Cluster.peerLines)
        elif kind == b"ACK":
            if not channel.outbound:
                self.acknowledge(channel, int(fields[1]))
        elif kind == b"SYNCED":
            if not channel.outbound:
                # Its old copy of the grants is gone (see released.py).
                channel.applied = True
        else:
            raise ValueError(kind)

    def applyChanges(self, j: int, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        A run of C{H}/C{G} (held keys) and C{D} (dropped) lines from peer
        C{j}, applied with no per-line dispatch: a busy stream is mostly
        this, and so is a snapshot of a million keys.
        """
        cluster = self.cluster
        if not cluster.fromLeader(j, channel):
            return
        now = cluster.clock.seconds()
        limit = cluster.wallMicros() + PLAUSIBLE_AHEAD
        install, drop = cluster.locks.table.install, cluster.locks.dropHolder
        for line in lines:
            fields = line.rstrip(b"\r").split(b" ")
            try:
                key, token = fields[1], int(fields[2])
                if fields[0] == b"D":
                    drop(key, token)
                    continue
                expiresAt = now + int(fields[3]) / 1e6
                grantedAt = now - int(fields[4]) / 1e6
                share = shareField(fields)
            except (IndexError, ValueError):
                cluster.log.warn("malformed peer message {fields!r}", fields=fields[:6])
                continue
            if token > limit:
                cluster.plausible(j, token, "token")
                continue
            install(key, token, grantedAt, expiresAt, share)

    def offered(self, j: int, channel: PeerChannel, leader: int, term: int) -> None:
        """
        Peer C{j} is about to offer us keys that mirror C{leader}'s stream
        of C{term}.  When that is the stream we took over whole by handoff
        (its C{HANDOFF} came after all of it), the offer brings nothing we
        lack: a key in it that we do not hold was released or expired --
        possibly after the peer read its copy (it switches leaders on our
        heartbeat, which can overtake the old leader's last changes).
        Merging it would bring back a lock whose release was answered
        C{OK}, so the offer is ignored.
        """
        cluster = self.cluster
        channel.staleOffer = (leader, term) == cluster.inheritedFrom
        if channel.staleOffer:
            cluster.log.info(
                "ignoring the keys {peer} offers: they mirror {leader}'s term {term}, "
                "which this node took over whole", peer=cluster.name(j),
                leader=cluster.name(leader), term=term)

    def merge(self, j: int, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        A run of C{MERGE} and C{RELEASED} lines from peer C{j} (its offer,
        on a heal), kept by an active node in one loop: a standby's offer
        after a failover repeats every held key, most of which we hold
        already.  A release note counts even in an offer that is otherwise
        ignored (see L{offered}): a release answered by anyone is a fact.
        """
        cluster = self.cluster
        if channel.outbound or cluster.role != ACTIVE:
            return
        stale = channel.staleOffer
        now = cluster.clock.seconds()
        limit = cluster.wallMicros() + PLAUSIBLE_AHEAD
        table, install = cluster.locks.table, cluster.locks.installHolder
        grantOf = table.grantOf
        releasedHere = cluster.releases.releasedHere
        decide = merging.decide
        for line in lines:
            fields = line.rstrip(b"\r").split(b" ")
            try:
                key, token = fields[1], int(fields[2])
                grant = grantOf(key)
                if fields[0] == merging.RELEASED:
                    if table.isShared(key):
                        releasedThere = table.holdingOf(key, token) is not None
                    else:
                        releasedThere = merging.releasedThere(
                            None if grant is None else grant[0], token)
                    if releasedThere:
                        cluster.releaseMerged(key, token)
                    continue
                share = shareField(fields)
                shared = share != EXCLUSIVE or table.isShared(key)
                if stale or (not shared and grant is not None and grant[0] > token):
                    continue  # the higher token wins
                remaining, age = int(fields[3]) / 1e6, int(fields[4]) / 1e6
            except (IndexError, ValueError):
                cluster.log.warn("malformed peer message {fields!r}", fields=fields[:6])
                continue
            if token > limit:
                cluster.plausible(j, token, "token")  # logs it
                continue
            if shared:
                # Several grants per key: the fit rule (see mergeShared).
                if not releasedHere(key, token):
                    kept, pushedOut = mergeShared(cluster.locks, key, token, share,
                                                  remaining, age)
                    for out in pushedOut:
                        self.dropped(key, out, 0.0, expired=True)
                    if kept:
                        cluster.merged += 1
                        self.granted(key, token, now - age, now + remaining, 0.0)
                continue
            verdict = decide(None if grant is None else (grant[0], grant[2]), token,
                             now + remaining, releasedHere(key, token))
            if verdict == merging.KEEP:
                continue
            install(key, token, remaining, age, share)
            cluster.merged += 1
            self.granted(key, token, now - age, now + remaining, 0.0)
