# -*- test-case-name: tests.client.test_client -*-
"""
A Deferred-returning client for Twisted applications.

    client = connect(reactor, ["10.0.0.1:7700", "10.0.0.2:7700"], name="billing")
    lock = yield client.acquire("orders/42", lease=30, wait=5, keepAlive=True)
    lock.lost.addCallback(stopWorking)
    ...
    yield client.release(lock)

It keeps one persistent connection per address (two when given a single
address; see L{lockservice.client.pool}), pipelines requests over them
round-robin, follows C{M} redirects to the active node, retries releases
and renewals, renews held locks in the background when asked, tells the
holder when it can no longer be sure it holds a lock, and never leaks a lock
whose acquire was cancelled.  Given several clusters, it sends each key to
one of them (L{lockservice.client.sharding}).
"""

from __future__ import annotations

import os
from typing import (
    Any,
    Callable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from lockservice.client import sharding
from lockservice.client.acquiring import Acquire, secondsField
from lockservice.client.addresses import Addresses, parseClusters
from lockservice.client.arguments import (
    INSTANCE_HEX,
    MAX_SLOTS,
    checkShare,
    checkSlots,
    encodeKey,
    shareField,
    wireName,
)
from lockservice.client.context import HeldLock
from lockservice.client.election import (
    DEFAULT_LEADER_LEASE,
    Leader,
    Leadership,
    campaignName,
)
from lockservice.client.endpoints import Address, EndpointFactory, endpointFactory, splitAddress
from lockservice.client.errors import (
    ConnectionDropped,
    LockError,
    LockLost,
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
)
from lockservice.client.groups import Groups
from lockservice.client.holding import Holdings
from lockservice.client.lock import Lock, Share
from lockservice.client.observing import Observe, Observed, Watch
from lockservice.client.pool import RECONNECT_INTERVAL, RETIRE_TIMEOUT, Pool, Slot
from lockservice.client.protocol import Fields
from lockservice.client.retrying import (
    EPSILON,
    RELEASE_RETRY_EVERY,
    RELEASE_RETRY_FOR,
    RENEW_RETRY_EVERY,
    Abandoned,
    GaveUp,
    Retried,
)
from lockservice.client.timers import Timers
from lockservice.core import wire
from lockservice.tls import ClientTLS

T = TypeVar("T")

__all__ = [
    "connect", "LockClient", "Lock", "LockError", "LockTimeout", "LockRejected",
    "NoConnection", "ReleaseFailed", "LockLost", "ClientTLS", "RECONNECT_INTERVAL",
    "Addresses", "parseClusters", "Share", "MAX_SLOTS", "checkShare",
]


class LockClient:
    """
    The client object returned by L{connect}.

    @ivar pools: one L{Pool} of connections per cluster.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        clusters: Sequence[Sequence[Address]],
        endpointFor: EndpointFactory,
        name: Optional[bytes] = None,
        clusterIds: Optional[Sequence[bytes]] = None,
    ) -> None:
        if not clusters or not all(clusters):
            raise ValueError("at least one address is needed (per cluster)")
        self.clock = clock
        self.endpointFor = endpointFor
        self.name = name
        # Random per client: the node joins this client's connections (all
        # named `I <name>#<instance>`) into one client for deadlock checks.
        self.instance = os.urandom(INSTANCE_HEX // 2).hex()
        self.wireName = wireName(name, self.instance)
        self.pools = [Pool(clock, homes, endpointFor, self.wireName) for homes in clusters]
        self.clusterIds = list(clusterIds) if clusterIds else [
            str(homes[0]).encode("utf-8") for homes in clusters]
        if len(set(self.clusterIds)) != len(self.clusterIds):
            raise ValueError("two clusters have the same first address (or name)")
        self.closed = False
        self.timers = Timers(clock)
        self.holdings = Holdings(self.timers, self.renew, self.log)
        self._nextPool = 0
        # The result Deferreds of acquires not answered yet: close() fails them.
        self._acquiring: Set["Deferred[Lock]"] = set()
        # The group extension (what the tooz driver uses).
        self.groups = Groups(self)

    def start(self) -> None:
        for pool in self.pools:
            pool.start()

    # -- connections ---------------------------------------------------------

    @property
    def slots(self) -> List[Slot]:
        """
        Every connection slot of every cluster.
        """
        return [slot for pool in self.pools for slot in pool.slots]

    def poolFor(self, rawKey: bytes) -> Pool:
        """
        The cluster that serves C{rawKey}.
        """
        if len(self.pools) == 1:
            return self.pools[0]
        return self.pools[sharding.choose(self.clusterIds, rawKey)]

    def whenConnected(self, timeout: float = 10.0, failFast: bool = False) -> "Deferred[None]":
        """
        Fires once every cluster has a connection up; fails with
        L{NoConnection} (naming the last connection error) after C{timeout},
        or with C{failFast} as soon as every connection of a cluster has
        failed an attempt (a command-line tool need not wait for retries).
        """
        deadline = self.clock.seconds() + timeout

        async def all_up() -> None:
            for pool in self.pools:
                await pool.whenConnected(max(deadline - self.clock.seconds(), 0), failFast)

        return Deferred.fromCoroutine(all_up())

    # -- acquire -------------------------------------------------------------

    def acquire(self, key: Union[str, bytes], lease: float, wait: float = 0,
                keepAlive: bool = False, share: Share = None) -> "Deferred[Lock]":
        """
        Acquire C{key} for C{lease} seconds, waiting at most C{wait} seconds
        (0: no limit).

        @param keepAlive: renew the lock automatically (see L{Lock.keepAlive}).
        @param share: None or 1 (exclusive), C{"r"} (a read lock: any number
            of readers at once, no writer meanwhile), or an int C{n} of
            2..65535 (one of C{n} semaphore slots).
        @return: a Deferred firing with a L{Lock}, or failing with
            L{LockTimeout}, L{LockRejected} or L{NoConnection}.  Cancelling it
            withdraws the request from the node's queue (C{C}) and never
            leaks a lock: a grant that crossed the withdrawal is released.
        """
        rawKey = encodeKey(key)
        return self._acquireOn(self.poolFor(rawKey), rawKey, lease, wait, keepAlive, share)

    def _acquireOn(self, pool: Pool, rawKey: bytes, lease: float, wait: float,
                   keepAlive: bool, share: Share) -> "Deferred[Lock]":
        share = checkShare(share)
        if lease <= 0:
            raise ValueError("lease must be > 0 seconds")
        return Acquire(self, pool, rawKey, lease, wait, share, shareField(share),
                       keepAlive).start()

    def readLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                 keepAlive: bool = False) -> "Deferred[Lock]":
        """
        A read lock on C{key}: held beside other readers, never beside a
        writer (L{writeLock}).  C{acquire(..., share="r")}.
        """
        return self.acquire(key, lease, wait, keepAlive, share="r")

    def writeLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                  keepAlive: bool = False) -> "Deferred[Lock]":
        """
        The writer of a read-write key: the exclusive lock, C{acquire(...)}.
        """
        return self.acquire(key, lease, wait, keepAlive)

    def semaphore(self, key: Union[str, bytes], slots: int, lease: float, wait: float = 0,
                  keepAlive: bool = False) -> "Deferred[Lock]":
        """
        One of C{slots} (2..65535) slots of the semaphore C{key}; every
        acquirer of that key must give the same C{slots}.
        """
        return self.acquire(key, lease, wait, keepAlive, share=checkSlots(slots))

    # -- retried requests (release, renew) -----------------------------------

    def _deliver(
        self, pool: Pool, op: bytes, key: bytes, line: bytes, every: float,
        giveUpAt: float, wanted: Callable[[], bool] = lambda: True,
    ) -> "Deferred[Tuple[Fields, float]]":
        """
        Send an idempotent request (C{R}, C{N}) until it is answered; see
        L{Retried<lockservice.client.retrying.Retried>}.

        @return: the answer's fields and when the answered copy was sent.
        """
        return Retried(self.timers, pool, op, key, line, every, giveUpAt, wanted).start()

    # -- release -------------------------------------------------------------

    def release(self, lock: Lock) -> "Deferred[bool]":
        """
        Release C{lock}: sent at once, then again every 200 ms (on another
        connection, across drops and redirects) until answered, for 5 s at
        most.  Keep-alive stops first: no renewal is sent after this call.

        @return: a Deferred firing True (C{OK}) or False (C{STALE}: the lock
            had already expired or been released), or failing with
            L{ReleaseFailed} -- within 5 s, whatever the network does.
        """
        rawKey = encodeKey(lock.key)
        self.holdings.released(lock)
        line = b"R " + rawKey + b" " + str(lock.token).encode() + b"\n"
        if self.closed:
            return Deferred.fromCoroutine(self._failedRelease(lock, "client closed"))
        d = self._deliver(self.poolFor(rawKey), b"R", rawKey, line, RELEASE_RETRY_EVERY,
                          self.clock.seconds() + RELEASE_RETRY_FOR)

        def done(answer: Tuple[Fields, float]) -> bool:
            return answer[0][2] == b"OK"

        def failed(failure: Any) -> bool:
            raise ReleaseFailed(
                f"release of {lock!r} not confirmed within {RELEASE_RETRY_FOR:g} s: "
                f"{failure.getErrorMessage()}")

        return d.addCallbacks(done, failed)

    async def _failedRelease(self, lock: Lock, why: str) -> bool:
        raise ReleaseFailed(f"release of {lock!r} not sent: {why}")

    def keepAlive(self, lock: Lock) -> None:
        """
        See L{Lock.keepAlive}.
        """
        self.holdings.startKeepAlive(lock)

    # -- renew ---------------------------------------------------------------

    def renew(self, lock: Lock, lease: Optional[float] = None) -> "Deferred[bool]":
        """
        See L{Lock.renew}.
        """
        lease = lock.lease if lease is None else lease
        if lease is None:
            raise ValueError("renew() of a hand-built Lock needs a lease")
        if lease <= 0:
            raise ValueError("lease must be > 0 seconds")
        rawKey = encodeKey(lock.key)
        line = (b"N " + rawKey + b" " + str(lock.token).encode() + b" "
                + secondsField(lease, "lease") + b"\n")
        if lock.released or self.closed:
            return Deferred.fromCoroutine(self._renewRefused(lock, "released"))
        now = self.clock.seconds()
        # Worth retrying while we still hold the grant on our own clock.
        giveUpAt = lock.expires if lock.expires is not None else now + RELEASE_RETRY_FOR
        giveUpAt = max(giveUpAt, now + RENEW_RETRY_EVERY)
        d = self._deliver(self.poolFor(rawKey), b"N", rawKey, line, RENEW_RETRY_EVERY,
                          giveUpAt, wanted=lambda: not lock.released and not self.closed)

        def answered(answer: Tuple[Fields, float]) -> bool:
            fields, sentAt = answer
            if lock.released:
                return fields[2] == b"OK"
            if fields[2] == b"OK":
                lock._lastRenewError = None
                self.holdings.confirmed(lock, sentAt, lease)
                self.holdings.scheduleRenewal(lock)
                return True
            self.holdings.lose(lock, f"renewal refused: token {lock.token} no longer holds the key "
                             "(STALE: it expired, was released or was force-released)")
            return False

        def failed(failure: Any) -> bool:
            if failure.check(Abandoned):
                raise LockError(f"{lock!r} was released; renewal not sent")
            if failure.check(LockRejected):
                lock._lastRenewError = f"rejected: {failure.value.message}"
                lock.stopKeepAlive()
                if lock.expires is None:
                    self.holdings.lose(lock, f"renewal {lock._lastRenewError}")
                raise failure.value
            lock._lastRenewError = failure.getErrorMessage()
            if lock.expires is None or lock.expires <= self.clock.seconds() + EPSILON:
                self.holdings.lose(lock, f"the lease ran out on the client's clock while renewals "
                                         f"failed ({lock._lastRenewError})")
            raise NoConnection(f"renewal of {lock!r} not confirmed: {lock._lastRenewError}")

        return d.addCallbacks(answered, failed)

    async def _renewRefused(self, lock: Lock, why: str) -> bool:
        raise LockError(f"cannot renew {lock!r}: {why}")

    # -- helpers -------------------------------------------------------------

    def locked(
        self, key: Union[str, bytes], lease: float, wait: float,
        f: Callable[..., Any], *args: Any, **kwargs: Any,
    ) -> "Deferred[Any]":
        """
        Run C{f(lock, *args, **kwargs)} while holding C{key}; the lock is
        released whatever C{f} (or its Deferred) does.
        """
        async def run() -> Any:
            async with self.lock(key, lease, wait) as lock:
                return await maybeDeferred(f, lock, *args, **kwargs)

        return Deferred.fromCoroutine(run())

    # -- observing, elections -------------------------------------------------

    def observe(self, key: Union[str, bytes], token: Optional[int] = None,
                wait: float = 0) -> "Deferred[Observed]":
        """
        The state of C{key} (L{Observed}: its newest live grant's token and
        holder) once it is not C{token}: at once when C{token} is None or
        already differs, else at the next change, or, unchanged, when
        C{wait} seconds (0: no limit) run out.
        """
        rawKey = encodeKey(key)
        wire.checkSeconds(wait, "wait", positive=False)
        if token is not None and not 0 <= token <= wire.MAX_TOKEN:
            raise ValueError(f"invalid token {token!r}")
        return Observe(self, self.poolFor(rawKey), rawKey, token, wait).start()

    def watch(self, key: Union[str, bytes], callback: Callable[[Observed], object]) -> Watch:
        """
        Call C{callback(Observed)} with the state of C{key} now, then at
        each change, until the returned L{Watch} is stopped; it follows
        failovers and reconnects on its own.
        """
        rawKey = encodeKey(key)
        return Watch(lambda token, wait: self.observe(rawKey, token, wait), callback,
                     self.clock).start()

    def campaign(self, election: Union[str, bytes], value: str,
                 lease: float = DEFAULT_LEADER_LEASE, wait: float = 0) -> "Deferred[Leadership]":
        """
        Campaign in C{election} with C{value}: fires with a L{Leadership}
        once this client leads (kept alive; its C{lost} fires when the
        leadership can no longer be trusted).  Cancelling it withdraws the
        campaign.  C{wait} bounds it (0: for ever): then it fails with
        L{LockTimeout}.

        @raise ValueError: C{value} cannot be a connection name's value
            (empty, a space or control character, too long): nothing sent.
        """
        rawElection = encodeKey(election, "election")
        name = campaignName(value, self.instance)
        if lease <= 0:
            raise ValueError("lease must be > 0 seconds")
        home = self.poolFor(rawElection)
        # Its own connection, named by the value: the node records the
        # holder name when it grants.  Closed once the campaign ends.
        pool = Pool(self.clock, home.homes, self.endpointFor, name, spare=False)
        pool.start()
        electionText = rawElection.decode("utf-8")
        acquire = Acquire(self, pool, rawElection, lease, wait, None, b"", True)
        d = acquire.start()

        def ended(result: object) -> object:
            # A cancelled campaign keeps its connection until the node has
            # answered the withdrawal: a grant that crossed it is read on
            # that connection, and released.
            acquire.whenSettled(RETIRE_TIMEOUT).addCallback(lambda _: pool.retireAll())
            return result

        d.addBoth(ended)
        return d.addCallback(lambda lock: Leadership(electionText, value, lock))

    def leader(self, election: Union[str, bytes]) -> "Deferred[Optional[Leader]]":
        """
        Who leads C{election} now (L{Leader}), or None.
        """
        def who(state: Observed) -> Optional[Leader]:
            if not state.token:
                return None
            return Leader(state.value, state.token, state.holder)

        return self.observe(election).addCallback(who)

    def resign(self, leadership: Leadership) -> "Deferred[bool]":
        """
        Same as C{leadership.resign()}.
        """
        return leadership.resign()

    def lock(self, key: Union[str, bytes], lease: float, wait: float = 0,
             keepAlive: bool = False) -> HeldLock:
        """
        C{async with client.lock(key, lease, wait, keepAlive=True) as lock: ...}
        """
        return HeldLock(self, key, lease, wait, keepAlive)

    def ping(self, word: str = "ping") -> "Deferred[bool]":
        """
        Send C{P word} on the next connection; True when it is echoed.
        """
        raw = encodeKey(word, "word")
        pool = self.pools[self._nextPool % len(self.pools)]
        self._nextPool += 1

        async def attempt() -> bool:
            slot = pool.pick()
            if slot is None or slot.protocol is None:
                raise NoConnection(f"no connection: {pool.lastError()}")
            try:
                fields = await slot.protocol.request(b"P", raw, b"P " + raw + b"\n")
            except ConnectionDropped as e:
                raise NoConnection(f"connection dropped: {e}") from None
            return fields == [b"P", raw]

        return Deferred.fromCoroutine(attempt())

    def close(self) -> "Deferred[None]":
        """
        Stop reconnecting, stop every keep-alive, cancel every timer and
        close every connection.
        """
        self.closed = True
        self.holdings.close()
        self.timers.close(GaveUp("client closed"))
        # Every acquire still waiting ends now, with the error its caller
        # documents; the work behind it (a connection wait, a request in
        # flight) then ends quietly: nothing is left to fail later, unseen.
        acquiring, self._acquiring = self._acquiring, set()
        for d in acquiring:
            if not d.called:
                d.errback(NoConnection("client closed"))
        lost = [d for pool in self.pools for d in pool.close()]
        return gatherResults(lost, consumeErrors=True).addCallback(lambda _: None)


def connect(
    reactor: Any,
    addresses: Addresses,
    endpointFor: Optional[EndpointFactory] = None,
    *,
    name: Optional[str] = None,
    tls: Optional[ClientTLS] = None,
) -> LockClient:
    """
    Start a client for the nodes at C{addresses} (see L{parseClusters}:
    C{host:port} strings, endpoints, or several clusters).  Connections come
    up in the background; C{client.whenConnected()} fires when they are.

    @param name: sent as C{I <name>} on every (re)connection, so the node
        shows this client's holds and waits by name (key grammar).
    @param tls: connect with TLS (L{ClientTLS}: the CA that signed the
        nodes' certificates, and optionally this client's certificate).
    @param endpointFor: build the endpoint of an address yourself (tests).
    """
    clusters, ids = parseClusters(addresses)
    for homes in clusters:
        for address in homes:
            if isinstance(address, str):
                # At once: a typo would otherwise surface only as a failed
                # connection, after a whole wait.
                splitAddress(address)
    rawName = encodeKey(name, "name") if name is not None else None
    if rawName is not None and len(rawName) > wire.MAX_KEY - 1 - INSTANCE_HEX:
        raise ValueError(f"invalid name {name!r}: at most "
                         f"{wire.MAX_KEY - 1 - INSTANCE_HEX} bytes (the client adds "
                         f"#<{INSTANCE_HEX} hex> to it)")
    client = LockClient(reactor, clusters, endpointFor or endpointFactory(reactor, tls),
                        rawName, ids)
    client.start()
    return client

