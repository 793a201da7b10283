# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
A heal, on both sides: the side that steps down (or changes leader)
offers its held keys and release notes before its C{SYNC}
(L{Healing.sendOffer}), and the active merges an offer by the rules of
L{lockservice.cluster.merge} (L{Healing.merge}), through the lock
service's mirror: the merged grants are filed, counted and replicated as
one batch.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Mapping, Sequence, Set, Tuple

from twisted.logger import Logger

from lockservice.cluster import merge as merging
from lockservice.cluster import peerwire, terms
from lockservice.cluster.interfaces import IHealOwner
from lockservice.cluster.peer import PeerChannel
from lockservice.cluster.peerwire import Change, micros
from lockservice.cluster.released import Releases
from lockservice.cluster.replication import Stream
from lockservice.cluster.terms import Eras
from lockservice.core.election import ACTIVE, PeerView
from lockservice.core.table import EXCLUSIVE, LockTable, fitTogether
from lockservice.server.service import LockService


def mergeShared(table: LockTable, now: float, key: bytes, offered: peerwire.Offered
                ) -> Tuple[bool, List[int]]:
    """
    On a heal, the winner's rule for an offered grant of a key that either
    side holds in shared form: the grants of both sides that fit together
    are kept, highest tokens first (L{fitTogether}).

    @return: whether the offered grant is kept, and the tokens of our own
        grants that it pushes out.
    """
    token = offered.token
    ours = table.sharedGrantsOf(key)
    for held, _, expiresAt, *_ in ours:
        if held == token:
            # The same grant on both sides: the later deadline wins (a
            # renewal answered there), as for an exclusive grant.
            return now + offered.remaining > expiresAt + merging.RENEWAL_SLACK, []
    kept = set(fitTogether([(held, s) for held, _, _, s, *_ in ours] + [(token, offered.share)]))
    if token not in kept:
        return False, []
    return True, [held for held, *_ in ours if held not in kept]


class Healing:
    """
    This node's part in heals: its offer when it merges into another
    active, and the merge of offers when it is the active.
    """

    log = Logger()

    def __init__(self, owner: IHealOwner, locks: LockService, stream: Stream,
                 releases: Releases, eras: Eras, wallMicros: Callable[[], int]) -> None:
        self.owner = owner
        self.locks = locks
        self.clock = locks.clock
        self.stream = stream
        self.releases = releases
        self.eras = eras
        self.wallMicros = wallMicros
        # Grants a heal's loser released that we could not release yet
        # (see releaseMerged).
        self._releaseWhenServing: List[Tuple[bytes, int]] = []

    # -- the side that merges into another -----------------------------------

    def sendOffer(self, channel: PeerChannel) -> None:
        """
        Offer the leader we now follow (a heal) every grant we hold and
        every release we noted since we diverged, so that it keeps the one
        and does not undo the other; once (see L{Eras.takeOffer}).
        """
        origin = self.eras.takeOffer()
        if origin is None:
            return
        now = self.clock.seconds()
        grants = [(key, token, micros(expiresAt - now), micros(now - grantedAt), share, name,
                   delayed)
                  for key, token, grantedAt, expiresAt, share, name, delayed
                  in self.locks.table.everyGrant() if expiresAt is not None]
        notes = list(self.releases.notes())
        data = peerwire.offerLines(origin, notes, grants)
        groups = [peerwire.groupLine(record, now)
                  for record in self.locks.groups.registry.records(now)]
        channel.transport.write(data + b"".join(groups))
        # Handed over: the winner keeps them from now on.
        self.releases.forget()
        if grants or notes:
            self.log.info("offered {keys} held keys and {notes} release notes to {peer}",
                          keys=len(grants), notes=len(notes),
                          peer=self.owner.name(channel.remote or 0))

    # -- the active ------------------------------------------------------------

    def forgetNotes(self, me: int, views: Dict[int, PeerView],
                    inbound: Mapping[int, Any]) -> None:
        """
        Forget our release notes once every peer follows us again and has
        replaced its old copy of the grants with our snapshot (see released.py).
        """
        if self.releases.watermark is not None and all(
                v.alive and j in inbound and inbound[j].applied and v.leader == me
                for j, v in views.items()):
            self.releases.forget()

    def offered(self, j: int, channel: PeerChannel, fields: Sequence[bytes]) -> None:
        """
        Peer C{j} is about to offer us keys that mirror an era (a leader's
        stream of a term).  When that is the stream we took over whole by
        handoff (its C{HANDOFF} came after all of it), the offer brings
        nothing we lack: a key in it that we do not hold was released or
        expired -- possibly after the peer read its copy (it switches
        leaders on our heartbeat, which can overtake the old leader's last
        changes).  Merging it would bring back a lock whose release was
        answered C{OK}, so the offer is ignored.
        """
        leader, term, position = peerwire.parseOffer(fields)
        channel.staleOffer = self.eras.inherited((leader, term, position))
        channel.furtherOffer = set() if self.eras.further((leader, term, position)) else None
        if channel.staleOffer:
            self.log.info(
                "ignoring the keys {peer} offers: they mirror {leader}'s term {term}, "
                "which this node took over whole", peer=self.owner.name(j),
                leader=self.owner.name(leader), term=term)

    def merge(self, j: int, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        A run of C{MERGE} and C{RELEASED} lines from peer C{j} (its offer,
        on a heal), kept by an active node in one loop and mirrored in
        batches: a standby's offer after a failover repeats every held
        key, most of which we hold already.  A release note counts even in
        an offer that is otherwise ignored (see L{offered}): a release
        answered by anyone is a fact.
        """
        if channel.outbound or self.owner.role != ACTIVE:
            return
        stale = channel.staleOffer
        locks = self.locks
        table = locks.table
        now = self.clock.seconds()
        limit = terms.limit(self.wallMicros())
        grantOf = table.grantOf
        releasedHere = self.releases.releasedHere
        decide = merging.decide
        batch: List[Change] = []
        # A batch decides each grant on the table as it was before the
        # batch: a key met again (a shared key's next grant) or released
        # first has the batch applied before.
        keys: Set[bytes] = set()
        for line in lines:
            try:
                offered = peerwire.parseOffered(line)
            except peerwire.Malformed as e:
                self.log.warn("malformed peer message {fields!r}", fields=e.args[0])
                continue
            key, token = offered.key, offered.token
            if channel.furtherOffer is not None and not offered.released:
                channel.furtherOffer.add((key, token))
            if key in keys:
                locks.mirror(batch)
                batch, keys = [], set()
            grant = grantOf(key)
            if offered.released:
                if table.isShared(key):
                    releasedThere = table.placeOf(key, token) is not None
                else:
                    releasedThere = merging.releasedThere(
                        None if grant is None else grant[0], token)
                if releasedThere:
                    if batch:
                        locks.mirror(batch)
                        batch, keys = [], set()
                    self.releaseMerged(key, token)
                continue
            # A place kept by the lock-delay (offered, or held here) takes
            # part as one of several grants would.
            shared = (offered.share != EXCLUSIVE or offered.delayed or table.isShared(key)
                      or table.delayedUntil(key) is not None)
            if stale or (not shared and grant is not None and grant[0] > token):
                continue  # the higher token wins
            if token > limit:
                self.owner.plausible(j, token, "token")  # logs it
                continue
            remaining, age = offered.remaining, offered.age
            if shared:
                # Several grants per key: the fit rule (see mergeShared).
                if releasedHere(key, token):
                    continue
                kept, pushedOut = mergeShared(table, now, key, offered)
                batch.extend((key, out, 0.0, None, EXCLUSIVE, None, False) for out in pushedOut)
                if not kept:
                    continue
            elif decide(None if grant is None else (grant[0], grant[2]), token,
                        now + remaining, releasedHere(key, token)) == merging.KEEP:
                continue
            keys.add(key)
            batch.append((key, token, now - age, now + remaining, offered.share, offered.name,
                          offered.delayed))
        if batch:
            locks.mirror(batch)

    def mergeGroup(self, j: int, channel: PeerChannel, fields: Sequence[bytes]) -> None:
        """
        A group or member of peer C{j}'s offer (a heal): an active node
        keeps both sides' groups, and of a member both sides have, the
        later lease; what it takes goes on to its standbys.
        """
        if channel.outbound or self.owner.role != ACTIVE:
            return
        present, record = peerwire.parseGroupLine(fields, self.clock.seconds())
        if not present:
            return
        registry = self.locks.groups.registry
        registry.install(record, self.clock.seconds())
        kept = registry.record(record.group, record.member)
        if kept is not None:
            self.stream.groupSet(kept)

    def offerEnded(self, j: int, channel: PeerChannel) -> None:
        """
        The offer of peer C{j} is complete (its C{SYNC} came).  When it was
        of the stream we took over, from further in it than our copy went
        (our link to its leader was cut while the leader went on with the
        others' acknowledgements), every grant of that stream we still
        hold and it does not offer ended in the part we missed: a release
        answered there, or an expiry.  They end here too, a chunk per
        reactor turn: no answered release is undone by our short copy.
        """
        offered, channel.furtherOffer = channel.furtherOffer, None
        if offered is None or self.owner.role != ACTIVE:
            return
        watermark = self.eras.inheritedTokens
        table = self.locks.table
        keys = table.keys()

        def ending() -> Iterator[None]:
            ended = 0
            for key in keys:
                for token, *_ in table.sharedGrantsOf(key):
                    if token <= watermark and (key, token) not in offered:
                        self.releaseMerged(key, token)
                        ended += 1
                yield None
            if ended:
                self.log.warn(
                    "ended {n} grants that {peer}'s copy of the stream we took over shows "
                    "ended (our copy of it was cut short)", n=ended, peer=self.owner.name(j))

        self.locks.runInChunks(ending())

    def releaseMerged(self, key: bytes, token: int) -> None:
        """
        A heal's loser released grant C{token} of C{key}, which we still
        hold: release it here too (its next waiter gets the key, our
        standbys hear of it).  While we do not serve yet, it is only
        dropped, and a key with waiters is released when we serve.
        """
        if self.locks.role == ACTIVE:
            self.locks.endGrant(key, token)
            return
        self.locks.dropHolder(key, token)
        if self.locks.table.tokenOf(key) == token:
            self._releaseWhenServing.append((key, token))
        else:
            self.stream.dropped(key, token, 0.0, expired=False)

    def serving(self) -> None:
        """
        The node serves (again): release what waited for it.
        """
        pending, self._releaseWhenServing = self._releaseWhenServing, []
        for key, token in pending:
            self.releaseMerged(key, token)
