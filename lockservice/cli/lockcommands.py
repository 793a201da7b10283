# -*- test-case-name: tests.cli.test_cli -*-
"""
The commands that talk to the lock port with the Twisted client:
C{acquire}, C{release}, C{run}, C{shell}.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any, Dict, List, Optional

from lockservice.cli.errors import (
    EX_LOST,
    EX_OK,
    EX_STALE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    CommandError,
)
from lockservice.cli.processgroup import CommandGroup

DEFAULT_ADDR = os.environ.get("LOCKSERVICE_ADDR", "127.0.0.1:7700")


DEFAULT_GRACE = 10.0


def defaultName() -> str:
    """
    How the CLI names its connections unless told: C{host:pid:lockservice-cli}.
    """
    host = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return f"{host or 'localhost'}:{os.getpid()}:lockservice-cli"


def clientTLS(args: argparse.Namespace) -> Any:
    from lockservice.tls import ClientTLS

    if args.tls_ca is None:
        if args.tls_cert or args.tls_key:
            raise CommandError("--tls-cert/--tls-key need --tls-ca (the CA that signed "
                               "the node's certificate)", EX_USAGE)
        return None
    try:
        return ClientTLS.fromFiles(args.tls_ca, args.tls_cert, args.tls_key)
    except ValueError as e:
        raise CommandError(str(e), EX_USAGE) from None


def clustersOf(args: argparse.Namespace) -> Any:
    from lockservice.client.api import parseClusters
    from lockservice.client.endpoints import splitAddress

    if args.cluster:
        clusters = [[a.strip() for a in c.split(",") if a.strip()] for c in args.cluster]
    else:
        clusters, _ = parseClusters(args.addr)
    if not clusters or not all(clusters):
        raise CommandError("no address given", EX_USAGE)
    for cluster in clusters:
        for address in cluster:
            try:
                splitAddress(address)
            except ValueError as e:
                raise CommandError(str(e), EX_USAGE) from None
    return clusters


async def connected(reactor: Any, args: argparse.Namespace) -> Any:
    from lockservice.client.api import connect
    from lockservice.client.errors import NoConnection

    clusters = clustersOf(args)
    client = connect(reactor, clusters, name=args.name or defaultName(), tls=clientTLS(args))
    try:
        await client.whenConnected(timeout=5, failFast=True)
    except NoConnection as e:
        await client.close()
        raise CommandError(f"cannot reach lockservice: {e}", EX_UNAVAILABLE) from None
    # One ping per cluster: a port that accepts connections but does not
    # speak the lock protocol (the --http port by mistake) would otherwise
    # leave an acquire waiting forever.
    for cluster in clusters:
        answered = False
        try:
            answered = await client.ping("cli").addTimeout(5, reactor)
        except Exception:
            pass
        if not answered:
            await client.close()
            raise CommandError(f"{','.join(cluster)} does not answer the lock protocol "
                               f"(is it the HTTP port?)", EX_UNAVAILABLE)
    return client


async def acquire(client: Any, key: str, lease: float, wait: float,
                   keepAlive: bool = False, share: Any = None) -> Any:
    """
    C{client.acquire}, its failures as L{CommandError}s.  C{share} is
    C{None} (exclusive), C{"r"} (a read lock) or a slot count 2-65535.
    """
    from lockservice.client.errors import LockRejected, LockTimeout, NoConnection

    # No share= for an exclusive lock: the plain call every client takes.
    extra: Dict[str, Any] = {} if share is None else {"share": share}
    try:
        return await client.acquire(key, lease, wait, keepAlive=keepAlive, **extra)
    except LockTimeout:
        raise CommandError(f"no grant for {key!r} within {wait:g} s", EX_TEMPFAIL) from None
    except LockRejected as e:
        raise CommandError(f"rejected: {e.message}", EX_USAGE) from None
    except NoConnection as e:
        raise CommandError(str(e), EX_UNAVAILABLE) from None


async def acquireCommand(reactor: Any, args: argparse.Namespace) -> int:
    client = await connected(reactor, args)
    try:
        lock = await acquire(client, args.key, args.lease, args.wait, share=args.share)
        print(lock.token)
        return EX_OK
    finally:
        await client.close()


async def releaseCommand(reactor: Any, args: argparse.Namespace) -> int:
    from lockservice.client.api import Lock
    from lockservice.client.errors import ReleaseFailed

    client = await connected(reactor, args)
    try:
        try:
            ok = await client.release(Lock(args.key, args.token))
        except ReleaseFailed as e:
            raise CommandError(str(e), EX_UNAVAILABLE) from None
        print("OK" if ok else "STALE")
        return EX_OK if ok else EX_STALE
    finally:
        await client.close()


async def runCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    Hold the lock while CMD runs, renewing it every third of the lease;
    release when CMD ends (Ctrl+C and SIGTERM are passed on to CMD's
    process group) and exit with CMD's status.  If the lock is lost
    meanwhile, CMD's process group gets SIGTERM, then SIGKILL after
    C{--grace} seconds, one line says why, and the exit status is
    L{EX_LOST}.  Either way nothing left in CMD's group outlives C{run}.
    """
    client = await connected(reactor, args)
    try:
        lock = await acquire(client, args.key, args.lease, args.wait, keepAlive=True,
                             share=args.share)
        env = dict(os.environ, LOCKSERVICE_KEY=args.key, LOCKSERVICE_TOKEN=str(lock.token))
        return await runWhileHeld(reactor, args.command, env, lock.lost, lock.release,
                                  args.grace, "the lock")
    finally:
        await client.close()


async def runWhileHeld(reactor: Any, command: List[str], env: Dict[str, str], lost: Any,
                       release: Any, grace: float, what: str) -> int:
    """
    Run C{command} in a process group of its own while something is held
    (a lock, a leadership): Ctrl+C and SIGTERM are passed on to the group;
    when C{lost} fires, the group gets SIGTERM, then SIGKILL after
    C{grace} seconds, and the status is L{EX_LOST}; when the command ends,
    C{release()} gives it back and the command's status is returned.
    """
    group: Optional[CommandGroup] = None
    previous: Dict[int, Any] = {}
    try:
        state: Dict[str, Any] = {"lost": None, "pending": None}

        def passOn(signum: int, frame: Any) -> None:
            if group is None:
                state["pending"] = signum  # CMD is being started: it gets it next
            else:
                reactor.callFromThread(group.signal, signum)

        # Handlers first: CMD then starts with SIGINT/SIGTERM at their
        # defaults even where run inherited them ignored (exec resets
        # handled signals, not ignored ones).
        previous = {s: signal.signal(s, passOn) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            group = CommandGroup(reactor, command, env)
        except OSError as e:
            await release()
            # The shell's statuses: 127 not found, 126 found but not runnable.
            raise CommandError(f"cannot run {command[0]}: {e.strerror or e}",
                               127 if isinstance(e, FileNotFoundError) else 126) from None
        if state["pending"] is not None:
            group.signal(state["pending"])

        def gone(why: Any) -> None:
            if group is None or group.ended.called:
                return
            state["lost"] = why
            print(f"lockservice: {why}; stopping {command[0]} and its process group "
                  f"(SIGTERM, SIGKILL after {grace:g} s)", file=sys.stderr, flush=True)
            group.stop(grace)

        lost.addCallback(gone)
        status = await group.ended
        if state["lost"] is None and group.alive():
            # CMD is done but left processes in its group: they must not
            # go on working once the key is released.
            print(f"lockservice: {command[0]} ended (status {status}) but left processes in its "
                  f"group; stopping them (SIGTERM, SIGKILL after {grace:g} s)",
                  file=sys.stderr, flush=True)
        await group.stop(grace)
        if state["lost"] is not None:
            return EX_LOST
        try:
            await release()
        except Exception as e:  # the lease reclaims it anyway
            print(f"lockservice: giving back {what} failed ({e}); its lease will end it",
                  file=sys.stderr)
        return int(status)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if group is not None:
            group.abandon()


async def shellCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    An interactive line session: each line typed is sent as a request and
    each answer printed as it arrives (no C{nc} needed; TLS works too).
    End of input (Ctrl+D) ends the session once the node has answered.
    """
    from lockservice.shell import runShell

    clusters = clustersOf(args)
    if len(clusters) != 1 or len(clusters[0]) != 1:
        raise CommandError("shell talks to one node: give one HOST:PORT", EX_USAGE)
    name = args.name or defaultName()
    try:
        return await runShell(reactor, clusters[0][0], clientTLS(args), name,
                              interactive=sys.stdin.isatty())
    except ConnectionError as e:
        raise CommandError(str(e), EX_UNAVAILABLE) from None
