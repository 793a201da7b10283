# -*- test-case-name: tests.server.test_internals -*-
"""
Every use of a private Twisted internal, in one place.

Each one buys something the public API does not offer; each is guarded so
that a Twisted release that renames the internal degrades to the public
behaviour instead of breaking, and tests/server/test_internals.py checks each on
the oldest and the newest Twisted of the tox matrix.
"""

from __future__ import annotations

import fcntl
import select
import struct
import termios
from typing import Any, Callable, List, Optional, cast

from twisted.application.internet import ClientService, StreamServerEndpointService
from twisted.logger import ILogObserver, Logger


def plainSocket(transport: Any) -> Any:
    """
    The socket under C{transport} when answers may be sent straight to it:
    a plain TCP connection only.  Never for TLS (a TLS transport forwards
    unknown attributes to the TCP transport below it, so duck typing would
    find the raw socket and send answers in the clear), never for a test
    transport.

    @return: the socket, or None to use C{transport.write}.
    """
    from twisted.internet.tcp import Connection

    if type(transport).__module__ != "twisted.internet.tcp" or not isinstance(
        transport, Connection
    ):
        return None
    if getattr(transport, "TLS", True):
        return None  # startTLS on this connection, or an unknown layout
    if not all(hasattr(transport, a) for a in ("_tempDataLen", "dataBuffer", "offset")):
        return None
    return transport.socket


def nothingBuffered(transport: Any) -> bool:
    """
    True when C{transport} (one for which L{plainSocket} gave a socket) has
    no unsent bytes of its own, so a direct C{send} keeps the byte order.

    Twisted's C{transport.write()} buffers until the reactor's next
    write-readiness round (two epoll_ctl calls and one more loop iteration
    per answer); sending at once saves that on the hot path.
    """
    return (
        not transport._tempDataLen
        and transport.offset == len(transport.dataBuffer)
        and not transport.disconnecting
    )


def sendNow(sock: Any, transport: Any, data: bytes) -> bool:
    """
    Send C{data} straight to C{sock} (L{plainSocket} of C{transport}, or
    None) when nothing is buffered (L{nothingBuffered}); what the kernel
    does not take, and everything when something is buffered, goes through
    C{transport.write()}, in order.  Both writers use it: the client
    protocol's answers and the replication stream.

    @return: True when the kernel took all of C{data}.
    """
    # nothingBuffered(transport), inline: this is every answer.
    if (sock is not None and not transport._tempDataLen
            and transport.offset == len(transport.dataBuffer) and not transport.disconnecting):
        try:
            sent = sock.send(data)
        except OSError:
            sent = 0  # BlockingIOError, or an error the transport finds itself
        if sent == len(data):
            return True
        data = data[sent:]
    transport.write(data)
    return False


def dispatchWithoutLogContext(reactor: Any) -> bool:
    """
    Make the epoll reactor hand each ready descriptor to its handler
    directly, without wrapping the call in the legacy logging context
    (C{log.callWithLogger}: the selectable's C{logPrefix()} and a context
    push and pop, four Python frames per ready socket; about a tenth of a
    busy node's CPU in C{py-spy}).  Only legacy C{twisted.python.log}
    messages logged inside such a call lose their C{system} prefix; the
    node logs through C{twisted.logger}, which never read it.  An
    exception escaping the handler is still logged and the next
    descriptor handled, as C{callWithLogger} does.

    @return: True when done; False (the reactor unchanged) for any other
        reactor, or an epoll reactor whose layout is unknown.
    """
    import errno

    from twisted.internet.epollreactor import EPollReactor
    from twisted.python import log

    if type(reactor) is not EPollReactor or not all(
            hasattr(reactor, name) for name in ("_poller", "_selectables", "_doReadOrWrite")):
        return False
    selectables = reactor._selectables
    handle = reactor._doReadOrWrite
    # What callAfterReady() asks for while the ready descriptors are
    # handled: run once they all have been.
    afterReady = _AfterReady()
    reactor._lockserviceAfterReady = afterReady  # type: ignore[attr-defined]
    calls = afterReady.calls

    def doPoll(timeout: Optional[float]) -> None:
        try:
            ready = reactor._poller.poll(-1 if timeout is None else timeout, len(selectables))
        except OSError as e:
            if e.errno == errno.EINTR:
                return
            raise
        get = selectables.get
        afterReady.dispatching = True
        try:
            for fd, event in ready:
                selectable = get(fd)
                if selectable is not None:
                    try:
                        handle(selectable, fd, event)
                    except KeyboardInterrupt:
                        raise
                    except BaseException:
                        log.err()
        finally:
            afterReady.dispatching = False
        if calls:
            due = calls.copy()
            calls.clear()
            for call in due:
                try:
                    call()
                except KeyboardInterrupt:
                    raise
                except BaseException:
                    log.err()

    # An instance attribute shadows the class's method (why mypy is told).
    reactor.doIteration = reactor.doPoll = doPoll  # type: ignore[method-assign]
    return True


class _AfterReady:
    """
    The calls L{callAfterReady} gathered while L{dispatchWithoutLogContext}'s
    poll handles the ready descriptors (C{dispatching}).
    """

    def __init__(self) -> None:
        self.calls: List[Callable[[], None]] = []
        self.dispatching = False


def callAfterReady(reactor: Any, call: Callable[[], None]) -> None:
    """
    Call C{call} once the reactor has handled every descriptor ready in
    this iteration.  Asked while L{dispatchWithoutLogContext}'s poll
    handles them, it runs at the end of that poll; otherwise (a timer's
    call, another reactor, a test clock) by C{callLater(0)}, which runs
    at the same point of the loop but costs a timed call (an object, and
    a heap push and pop among the other timers).  Never left for a poll
    that may not come: a call asked outside the dispatch is a timed call.
    """
    afterReady = getattr(reactor, "_lockserviceAfterReady", None)
    if afterReady is not None and afterReady.dispatching:
        afterReady.calls.append(call)
    else:
        reactor.callLater(0, call)


def pendingTimedCalls(reactor: Any) -> Optional[List[Any]]:
    """
    Every scheduled call of C{reactor}, including those not yet moved into
    its heap, or None when the reactor's layout is unknown.  Needed to move
    them to a new time base (L{lockservice.server.clock.useMonotonicTime}).
    """
    pending = getattr(reactor, "_pendingTimedCalls", None)
    new = getattr(reactor, "_newTimedCalls", None)
    if pending is None or new is None:
        return None
    return cast(List[Any], pending)


def newTimedCalls(reactor: Any) -> List[Any]:
    return cast(List[Any], getattr(reactor, "_newTimedCalls", []))


def raiseBindErrorsAtStart(service: StreamServerEndpointService) -> None:
    """
    Make C{startService} raise when the port cannot be bound, so twistd
    stops with an error instead of running a deaf node.  (Public API only
    logs the failure.)
    """
    service._raiseSynchronously = True


class QuietClientService(ClientService):
    """
    A ClientService that does not log each connection attempt: peer links
    retry every 0.25 s while a peer is down, and the cluster logs the loss
    of a peer once itself.
    """

    _log = Logger(observer=cast(ILogObserver, lambda event: None))


def watchSocketError(transport: Any, record: Any) -> bool:
    """
    Call C{record(errno, reason)} with the socket's pending error
    (C{SO_ERROR}) and the TCP connection's own close reason, just before
    Twisted closes the socket under C{transport} (or under the TCP
    transport below a TLS one, which reports its own reason above).

    Twisted's poll/epoll reactors report a socket that was reset (RST) with
    no input pending as a clean close (C{ConnectionDone}), like a FIN; the
    pending error tells the two apart (C{ECONNRESET} after a reset, 0 after
    a FIN), and it is gone once the socket is closed.

    @return: False when the transport is not a known TCP connection.
    """
    import socket

    from twisted.internet.tcp import Connection

    tcp = transport if isinstance(transport, Connection) else getattr(transport, "transport", None)
    if not isinstance(tcp, Connection) or not hasattr(tcp, "socket"):
        return False
    original = tcp.connectionLost

    def connectionLost(reason: Any) -> None:
        try:
            error = tcp.socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except (AttributeError, OSError):
            error = 0
        record(error, reason)
        original(reason)

    tcp.connectionLost = connectionLost  # type: ignore[method-assign]
    return True


# Linux ioctl: bytes in a TCP socket's send queue not sent yet (the peer's
# window is closed); sent bytes have reached the peer's host, or are in
# flight and retransmitted by the kernel even after this process dies.
SIOCOUTQNSD = 0x894B


def unsentProbe(transport: Any) -> Callable[[], bool]:
    """
    Made once per connection: a function that tells, cheaply (it runs for
    every standby at every reactor turn with changes), whether something
    written on C{transport} (plain TCP, or TLS over TCP) has not left this
    host yet: it still waits in Twisted's buffers, or in the kernel's send
    queue because the peer does not read (a stopped or overloaded standby).
    Such bytes die with this process.  For a transport of unknown layout
    (tests) it always says False: nothing to wait for.
    """

    from twisted.internet.tcp import Connection

    tcp = transport if isinstance(transport, Connection) else getattr(transport, "transport", None)
    if not isinstance(tcp, Connection) or not all(
        hasattr(tcp, a) for a in ("_tempDataLen", "dataBuffer", "offset", "socket")
    ):
        return lambda: False
    try:
        fd = tcp.socket.fileno()
    except OSError:
        return lambda: False
    tls = transport is not tcp
    ioctl, unpack, request = fcntl.ioctl, struct.unpack, bytes(4)

    def leftUnsent() -> bool:
        if tls and getattr(getattr(transport, "_aggregator", None), "_buffer", None):
            return True
        if tcp._tempDataLen or tcp.offset < len(tcp.dataBuffer):
            return True
        if tcp.disconnected:
            return False
        try:
            return bool(unpack("i", ioctl(fd, SIOCOUTQNSD, request))[0])
        except OSError:
            return False  # not Linux, or the socket just closed

    return leftUnsent


def flushToKernel(transport: Any) -> None:
    """
    Hand what C{transport} (plain TCP, or TLS over TCP) holds in Twisted's
    write buffer to the kernel now, instead of at the reactor's next
    write-readiness round: a kill -9 of this process right after cannot
    lose it.  Runs the TCP transport's own C{doWrite} (what the reactor
    would call); what the socket does not take stays buffered as usual.
    """
    from twisted.internet.tcp import Connection

    # TLS (twisted.protocols.tls) gathers small writes until the end of the
    # reactor turn (_AggregateSmallWrites): hand them to TLS now.
    aggregator = getattr(transport, "_aggregator", None)
    if aggregator is not None and callable(getattr(aggregator, "flush", None)):
        aggregator.flush()
    tcp = transport if isinstance(transport, Connection) else getattr(transport, "transport", None)
    if not isinstance(tcp, Connection) or tcp.disconnected or tcp.disconnecting:
        return
    if not hasattr(tcp, "dataBuffer") or not hasattr(tcp, "_tempDataLen"):
        return
    if tcp._tempDataLen or tcp.offset < len(tcp.dataBuffer):
        result = tcp.doWrite()
        if result is not None:
            # The reactor's own handling of a failed write, as it would do.
            from twisted.python.failure import Failure

            tcp.reactor.callLater(0, tcp.connectionLost, Failure(result))  # type: ignore[attr-defined]


def readWaiting(transport: Any) -> None:
    """
    Deliver now, through the TCP transport's own read path (its C{doRead},
    what the reactor would call), the bytes that already wait in the kernel
    for C{transport} (plain TCP, or TLS over TCP: TLS passes on what it
    decrypts), instead of at the reactor's next poll.  Only bytes are read
    (C{FIONREAD} says how many wait): an end of stream or an error stays for
    the reactor to see, as it would have.  Does nothing for a transport of
    unknown layout (tests).
    """

    from twisted.internet.tcp import Connection

    tcp = transport if isinstance(transport, Connection) else getattr(transport, "transport", None)
    if not isinstance(tcp, Connection) or tcp.disconnected:
        return
    try:
        fd = tcp.socket.fileno()
    except OSError:
        return
    for _ in range(64):  # at most 64 reads of Twisted's buffer size
        try:
            waiting = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, bytes(4)))[0]
        except OSError:
            return
        if not waiting or tcp.disconnected or tcp.disconnecting or tcp.doRead() is not None:
            return


# What the peer of a connection that is not being read did, as its socket
# tells (see peerHungUp).
RESET = "reset"
END_OF_INPUT = "end of input"

# Linux's "peer shut down writing" poll bit (Python names it on Linux only).
_POLLRDHUP: int = getattr(select, "POLLRDHUP", 0x2000)


def peerHungUp(transport: Any) -> Optional[str]:
    """
    Whether the peer of C{transport} (plain TCP, or TLS over TCP) went
    away, for a connection the reactor is not reading (paused by
    backpressure): the reactor then does not watch its socket, and would
    notice nothing until it reads or writes again.

    One C{poll} with timeout 0 on the socket (a single system call; the
    socket is not read, and its pending error is not consumed, as reading
    C{SO_ERROR} would):
      - C{POLLHUP} or C{POLLERR}: the peer reset the connection (a client
        that closes with answers unread sends a reset), or both directions
        are shut: nothing written can reach it.  Returns L{RESET}.
      - C{POLLRDHUP}: the peer sent its end of input (FIN), whether or not
        requests it sent before are still unread in front of it (POLLRDHUP
        says so even then, unlike a read).  Returns L{END_OF_INPUT}.
    For TLS the check is on the TCP socket below (a reset is a reset; a
    TLS peer's orderly close usually sends a close_notify first, which is
    unread input, so it is found when the connection is read again).

    @return: L{RESET}, L{END_OF_INPUT}, or None (the peer is there, or the
        transport is of unknown layout, as in tests).
    """
    from twisted.internet.tcp import Connection

    tcp = transport if isinstance(transport, Connection) else getattr(transport, "transport", None)
    if not isinstance(tcp, Connection) or tcp.disconnected:
        return None
    try:
        fd = tcp.socket.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | _POLLRDHUP)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return None
    if not events:
        return None
    mask = events[0][1]
    if mask & (select.POLLHUP | select.POLLERR):
        return RESET
    if mask & _POLLRDHUP:
        return END_OF_INPUT
    return None
