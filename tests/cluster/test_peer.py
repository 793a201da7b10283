"""
The peer handshake through StringTransport: both sides prove the secret
over both nonces, both identities and the direction; a relayed, replayed
or reflected handshake gets a stranger nothing.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import Logger

from lockservice.cluster.peer import (
    MISMATCH,
    PACE_READS_BELOW,
    READ_PACE,
    HandshakeLimit,
    PeerChannel,
    acceptChannel,
)

PEERS = [b"10.0.0.1:7701", b"10.0.0.2:7702", b"10.0.0.3:7703"]


class Owner:
    log = Logger()

    def __init__(self, me: int, secret: bytes = b"s3cret",
                 accepted: Tuple[bytes, ...] = ()) -> None:
        self.clock = Clock()
        self.peers = PEERS
        self.me = me
        self.myEntry = PEERS[me]
        self.secret = secret
        self.acceptedSecrets = (secret, *accepted)
        self.up: List[PeerChannel] = []
        self.failed: List[Tuple[int, bool, str]] = []
        self.messages: List[List[bytes]] = []
        self.sources: List[str] = []
        self.lost: List[bool] = []
        self.refused: List[Tuple[str, str]] = []
        self.versions: List[Tuple[int, Optional[Tuple[int, int]]]] = []

    def indexOf(self, entry: bytes) -> Optional[int]:
        return PEERS.index(entry) if entry in PEERS else None

    def channelUp(self, channel: PeerChannel) -> None:
        self.up.append(channel)

    def channelLost(self, channel: PeerChannel, clean: bool) -> None:
        self.lost.append(clean)

    def peerLines(self, channel: PeerChannel, lines: List[bytes]) -> None:
        self.messages.extend(line.split(b" ") for line in lines)

    def handshakeFailed(self, remote: int, outbound: bool, why: str,
                        source: str = "") -> None:
        self.failed.append((remote, outbound, why))
        self.sources.append(source)

    def handshakeRefused(self, source: str, why: str) -> None:
        self.refused.append((source, why))

    def versionRefused(self, remote: int, theirs: Optional[Tuple[int, int]]) -> None:
        self.versions.append((remote, theirs))


def take(transport: StringTransport) -> List[bytes]:
    data = transport.value()
    transport.clear()
    return [line for line in data.split(b"\n") if line]


Dialled = Tuple[PeerChannel, Optional[PeerChannel], List[bytes]]


def dial(connector: Owner, acceptor: Owner) -> Dialled:
    """
    Run a handshake between two owners, relaying every line; return both
    channels and the transcript.
    """
    ct, at = StringTransport(), StringTransport()
    outbound = PeerChannel(connector, ct, outbound=True, remote=acceptor.me)  # type: ignore[arg-type]
    outbound.sendHello()
    transcript = take(ct)
    inbound = acceptChannel(acceptor, at, transcript[0])  # type: ignore[arg-type]
    for _ in range(4):
        back = take(at)
        transcript += back
        if back:
            outbound.dataReceived(b"\n".join(back) + b"\n")
        forth = take(ct)
        transcript += forth
        if forth:
            inbound.dataReceived(b"\n".join(forth) + b"\n")
    return outbound, inbound, transcript


def test_both_sides_authenticate_and_the_welcome_is_proven() -> None:
    a, b = Owner(0), Owner(1)
    outbound, inbound, transcript = dial(a, b)
    assert outbound.authenticated and inbound is not None and inbound.authenticated
    assert [line.split()[0] for line in transcript] == [b"HELLO", b"CHALLENGE", b"AUTH", b"WELCOME"]
    assert len(transcript[3].split()) == 2  # WELCOME carries a proof
    assert a.up == [outbound] and b.up == [inbound]


def test_a_different_secret_is_a_mismatch_reported_by_the_dialer() -> None:
    a, b = Owner(0, b"right"), Owner(1, b"wrong")
    outbound, inbound, transcript = dial(a, b)
    assert not outbound.authenticated and inbound is not None and not inbound.authenticated
    assert a.failed == [(1, True, MISMATCH)]
    assert transcript[-1] == b"E * * peer authentication failed"
    assert a.up == b.up == []


@pytest.mark.parametrize("first, second", [
    ((b"old-secret", (b"new-secret",)), (b"old-secret", ())),
    ((b"old-secret", (b"new-secret",)), (b"new-secret", (b"old-secret",))),
    ((b"new-secret", (b"old-secret",)), (b"new-secret", ())),
], ids=["new-accepted-beside-old", "half-rotated", "old-still-accepted"])
def test_a_secret_rotates_one_node_at_a_time(first, second) -> None:  # type: ignore[no-untyped-def]
    """
    Each step of a rotation (accept the new secret, prove with it, drop the
    old one) leaves every pair of nodes of adjacent steps linked, either
    way round.
    """
    for x, y in ((first, second), (second, first)):
        a, b = Owner(0, x[0], x[1]), Owner(1, y[0], y[1])
        outbound, inbound, _ = dial(a, b)
        assert outbound.authenticated and inbound is not None and inbound.authenticated


def test_a_secret_dropped_on_both_sides_no_longer_links() -> None:
    a, b = Owner(0, b"new-secret"), Owner(1, b"old-secret")
    outbound, inbound, _ = dial(a, b)
    assert not outbound.authenticated and a.failed == [(1, True, MISMATCH)]


def test_a_bare_welcome_is_refused() -> None:
    a = Owner(0)
    t = StringTransport()
    outbound = PeerChannel(a, t, outbound=True, remote=1)  # type: ignore[arg-type]
    outbound.sendHello()
    hello = take(t)[0].split()
    b = Owner(1)
    bt = StringTransport()
    acceptChannel(b, bt, b" ".join(hello))  # type: ignore[arg-type]
    challenge = take(bt)[0]
    outbound.dataReceived(challenge + b"\n")
    assert take(t)[0].startswith(b"AUTH ")
    outbound.dataReceived(b"WELCOME\n")
    assert not outbound.authenticated and a.up == []
    assert take(t) == [b"E * * not welcomed"]


def test_a_hello_relayed_to_another_node_is_refused() -> None:
    """
    Node 1 dials node 2's port, where a stranger listens and relays the
    HELLO to node 0: node 0 sees that it is not the node meant.
    """
    n1, n0 = Owner(1), Owner(0)
    t1 = StringTransport()
    dialer = PeerChannel(n1, t1, outbound=True, remote=2)  # type: ignore[arg-type]
    dialer.sendHello()
    hello = take(t1)[0]
    t0 = StringTransport()
    acceptChannel(n0, t0, hello)  # type: ignore[arg-type]
    assert take(t0) == [b"E * * this node is not " + PEERS[2]]
    # Re-addressed to node 0, its challenge proves the wrong identity to node 1.
    fields = hello.split(b" ")
    fields[3] = PEERS[0]
    t0 = StringTransport()
    victim = acceptChannel(n0, t0, b" ".join(fields))  # type: ignore[arg-type]
    challenge = take(t0)
    assert challenge[0].startswith(b"CHALLENGE ")
    dialer.dataReceived(challenge[0] + b"\n")
    assert take(t1) == [b"E * * peer authentication failed"]
    assert not dialer.authenticated and not victim.authenticated and n0.up == n1.up == []


def test_a_reflected_challenge_is_not_an_auth() -> None:
    """
    A stranger claiming to be node 1 sends node 0's own challenge proof
    back as its AUTH.
    """
    n0 = Owner(0)
    t = StringTransport()
    channel = acceptChannel(n0, t, b"HELLO 3 " + PEERS[1] + b" " + PEERS[0] + b" " + b"ab" * 16)  # type: ignore[arg-type]
    mac = take(t)[0].split()[3]
    channel.dataReceived(b"AUTH " + mac + b"\n")
    assert take(t) == [b"E * * peer authentication failed"] and n0.up == []


@pytest.mark.parametrize("offered, chosen", [
    (b"3-3", b"3"), (b"3-9", b"3"), (b"1-3", b"3"), (b"3", b"3")])
def test_the_acceptor_picks_the_newest_version_both_speak(offered: bytes, chosen: bytes) -> None:
    n0 = Owner(0)
    t = StringTransport()
    acceptChannel(n0, t, b"HELLO " + offered + b" " + PEERS[1] + b" " + PEERS[0] + b" "  # type: ignore[arg-type]
                  + b"ab" * 16)
    answer = take(t)[0].split()
    assert answer[:2] == [b"CHALLENGE", chosen] and n0.versions == []


@pytest.mark.parametrize("offered, said", [(b"2", (2, 2)), (b"4-7", (4, 7))])
def test_a_peer_with_no_common_version_is_refused_and_reported_once(
        offered: bytes, said: Tuple[int, int]) -> None:
    """
    A node of lockservice 0.1 (it says a bare 2), or of a release two
    versions ahead: refused with the reason, and reported to the owner
    (which logs it once and shows it on /status and /ready).
    """
    n0 = Owner(0)
    t = StringTransport()
    acceptChannel(n0, t, b"HELLO " + offered + b" " + PEERS[1] + b" " + PEERS[0] + b" "  # type: ignore[arg-type]
                  + b"ab" * 16)
    assert take(t) == [b"E * * peer protocol versions %d-%d not spoken here (this node "
                       b"speaks 3-3)" % said]
    assert n0.versions == [(1, said)] and n0.failed == []


def test_the_dialer_of_a_node_that_speaks_none_of_its_versions_reports_it() -> None:
    a = Owner(0)
    t = StringTransport()
    channel = PeerChannel(a, t, outbound=True, remote=1)  # type: ignore[arg-type]
    channel.sendHello()
    take(t)
    channel.dataReceived(b"E * * peer protocol versions 3-3 not spoken here (this node "
                         b"speaks 5-6)\n")
    assert a.versions == [(1, None)] and a.failed == []


def test_the_version_is_part_of_the_proof() -> None:
    """
    A challenge whose version was changed on the way fails the dialer's
    check of the acceptor's proof: nobody can talk a link down.
    """
    a, b = Owner(0), Owner(1)
    t0, t1 = StringTransport(), StringTransport()
    dialer = PeerChannel(a, t0, outbound=True, remote=1)  # type: ignore[arg-type]
    dialer.sendHello()
    hello = take(t0)[0]
    acceptChannel(b, t1, hello)  # type: ignore[arg-type]
    challenge = take(t1)[0].split()
    assert challenge[1] == b"3"
    import lockservice.cluster.peer as peer

    original = peer.PROTOCOL_VERSIONS
    peer.PROTOCOL_VERSIONS = (2, 3)  # the dialer would also speak 2
    try:
        dialer.dataReceived(b" ".join([challenge[0], b"2"] + challenge[2:]) + b"\n")
    finally:
        peer.PROTOCOL_VERSIONS = original
    assert take(t0) == [b"E * * peer authentication failed"] and not dialer.authenticated


def test_a_recorded_auth_does_not_replay() -> None:
    a, b = Owner(0), Owner(1)
    _, _, transcript = dial(a, b)
    hello, auth = transcript[0], transcript[2]
    t = StringTransport()
    replay = acceptChannel(b, t, hello)  # type: ignore[arg-type]
    assert take(t)[0].startswith(b"CHALLENGE ")  # a fresh nonce
    replay.dataReceived(auth + b"\n")
    assert not replay.authenticated
    assert take(t) == [b"E * * peer authentication failed"]


def test_malformed_hellos_are_refused() -> None:
    for hello, why in [
        (b"HELLO 1 " + PEERS[1] + b" abcd", b"bad peer hello"),
        (b"HELLO 3 " + PEERS[1] + b" " + PEERS[0] + b" short", b"bad peer hello"),
        (b"HELLO 3 10.9.9.9:1 " + PEERS[0] + b" " + b"ab" * 16, b"not a peer of this cluster"),
        (b"HELLO 3 " + PEERS[0] + b" " + PEERS[0] + b" " + b"ab" * 16,
         b"not a peer of this cluster"),
    ]:
        t = StringTransport()
        acceptChannel(Owner(0), t, hello)  # type: ignore[arg-type]
        assert take(t) == [b"E * * " + why], hello


def test_handshake_times_out() -> None:
    a = Owner(0)
    t = StringTransport()
    acceptChannel(a, t, b"HELLO 3 " + PEERS[1] + b" " + PEERS[0] + b" " + b"ab" * 16)  # type: ignore[arg-type]
    take(t)
    a.clock.advance(5)
    assert take(t) == [b"E * * handshake timed out"] and t.disconnecting


def test_a_flood_of_hellos_is_refused_before_any_proof() -> None:
    a = Owner(0)
    limit = HandshakeLimit(a.clock, rate=20, burst=20)
    hello = b"HELLO 3 " + PEERS[1] + b" " + PEERS[0] + b" " + b"ab" * 16
    answers = []
    for _ in range(300):
        t = StringTransport()
        acceptChannel(a, t, hello, limit)  # type: ignore[arg-type]
        answers.append(take(t)[0].split()[0])
    assert answers.count(b"CHALLENGE") == 20
    assert answers.count(b"E") == 280
    # Peers that redial a few times a second are never refused.
    a.clock.advance(1)
    for _ in range(20):
        t = StringTransport()
        acceptChannel(a, t, hello, limit)  # type: ignore[arg-type]
        assert take(t)[0].startswith(b"CHALLENGE ")


def test_an_inbound_mismatch_names_the_source_of_the_claim() -> None:
    from twisted.logger import LogLevel, globalLogPublisher

    from lockservice.cluster.links import Links

    seen: List[str] = []

    def observer(event: dict) -> None:  # type: ignore[type-arg]
        if event.get("log_level") == LogLevel.error:
            from twisted.logger import formatEvent
            seen.append(formatEvent(event))

    links = Links(Clock(), None, None, [1], 1.0, lambda j: None, PEERS)  # type: ignore[arg-type]
    globalLogPublisher.addObserver(observer)
    try:
        links.handshakeFailed(1, outbound=False, why=MISMATCH, source="10.9.9.9:40312")
        links.handshakeFailed(1, outbound=False, why=MISMATCH, source="10.9.9.9:40313")
    finally:
        globalLogPublisher.removeObserver(observer)
    assert seen == ["a connection from 10.9.9.9:40312 claiming to be peer 10.0.0.2:7702 "
                    "failed the handshake (secret mismatch)"]
    # A claim is not evidence: the peer is not marked as mismatched.
    assert not links.secretMismatch(1)


def test_an_inbound_mismatch_reports_the_connection_source() -> None:
    a, b = Owner(0, b"right"), Owner(1, b"wrong")
    ct, at = StringTransport(), StringTransport()
    outbound = PeerChannel(a, ct, outbound=True, remote=1)  # type: ignore[arg-type]
    outbound.sendHello()
    inbound = acceptChannel(b, at, take(ct)[0])  # type: ignore[arg-type]
    challenge = take(at)
    # A connector that answers anything at all with a wrong proof.
    inbound.dataReceived(b"AUTH " + b"0" * 64 + b"\n")
    assert b.failed == [(0, False, MISMATCH)]
    assert b.sources == ["192.168.1.1:54321"], challenge


# -- read pacing on a dialled link (the standby's side of replication) --------


def pacedLink() -> "tuple[Owner, PeerChannel, StringTransport]":
    """
    A standby's dialled link to its leader, a second after it came up.
    """
    a, b = Owner(0), Owner(1)
    outbound, _, _ = dial(a, b)
    transport = outbound.transport
    assert isinstance(transport, StringTransport)
    a.clock.advance(1)
    return a, outbound, transport


def test_a_stream_of_small_reads_pauses_the_dialled_link_briefly() -> None:
    """
    Writes arriving back to back (a busy active's replication stream) are
    read together: after a second small read within READ_PACE the link
    stops reading for READ_PACE, then reads again; nothing is lost.
    """
    a, outbound, transport = pacedLink()
    outbound.dataReceived(b"G k1 1 2 3 1 -\n")
    assert transport.producerState == "producing"  # a lone read never pauses
    a.clock.advance(READ_PACE / 2)
    outbound.dataReceived(b"G k2 1 2 3 1 -\n")
    assert transport.producerState == "paused"
    a.clock.advance(READ_PACE)
    assert transport.producerState == "producing"
    assert [m[1] for m in a.messages[-2:]] == [b"k1", b"k2"]


def test_heartbeats_and_big_reads_never_pause() -> None:
    a, b = Owner(0), Owner(1)
    outbound, inbound, _ = dial(a, b)
    transport = outbound.transport
    assert isinstance(transport, StringTransport)
    for _ in range(20):  # heartbeats: one read every 100 ms
        a.clock.advance(0.1)
        outbound.dataReceived(b"HB 1 active 1 5 0\n")
        assert transport.producerState == "producing"
    big = b"H k 1 2 3 1 -\n" * (PACE_READS_BELOW // 10 + 1)
    for _ in range(3):  # a snapshot or a backlog: read as fast as it comes
        outbound.dataReceived(big)
        assert transport.producerState == "producing"
    # The accepting side is never paced (its reading belongs to the
    # client-port protocol's backpressure).
    assert inbound is not None
    inbound.dataReceived(b"HB 1 active 1 5 0\n")
    inbound.dataReceived(b"HB 1 active 1 5 0\n")
    assert isinstance(inbound.transport, StringTransport)
    assert inbound.transport.producerState == "producing"


def test_catching_up_ends_a_pause_at_once() -> None:
    """
    A standby leaving its leader reads that link up first: a pending pause
    ends now, and reads during the catch-up do not start a new one.
    """
    a, outbound, transport = pacedLink()
    outbound.dataReceived(b"G k1 1 2 3 1 -\n")
    outbound.dataReceived(b"G k2 1 2 3 1 -\n")
    assert transport.producerState == "paused"
    outbound.catchUp()
    assert transport.producerState == "producing"
    assert not [c for c in a.clock.getDelayedCalls() if c.active()]
    outbound._catchingUp = True  # as while readWaiting delivers
    outbound.dataReceived(b"G k3 1 2 3 1 -\n")
    assert transport.producerState == "producing"


def test_a_link_lost_while_paused_does_not_resume() -> None:
    a, b = Owner(0), Owner(1)
    outbound, _, _ = dial(a, b)
    a.clock.advance(1)
    outbound.dataReceived(b"G k1 1 2 3 1 -\n")
    outbound.dataReceived(b"G k2 1 2 3 1 -\n")
    assert a.clock.getDelayedCalls()
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure
    outbound.connectionLost(Failure(ConnectionDone()))
    assert not [c for c in a.clock.getDelayedCalls() if c.active()]


def test_a_reset_after_the_peers_fin_is_a_close() -> None:
    """
    How the socket ended decides between "the peer closed" (a FIN: its
    process exited) and "network trouble" (a reset).  A reset that comes
    after the peer's FIN (we wrote before reading the FIN, and the dead
    peer's kernel answered with a reset) leaves EPIPE, not ECONNRESET: the
    FIN came first, so it is a close.
    """
    from errno import ECONNRESET, EPIPE

    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    for error, clean in ((0, True), (EPIPE, True), (ECONNRESET, False)):
        a, b = Owner(0), Owner(1)
        outbound, _, _ = dial(a, b)
        outbound._socketError(error, Failure(ConnectionDone()))
        outbound.connectionLost(Failure(ConnectionDone()))
        assert a.lost == [clean], error
