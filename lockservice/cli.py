# -*- test-case-name: tests.test_cli -*-
"""
The C{lockservice} command: status, acquire, release, run, bench.

    lockservice status [URL]
    lockservice acquire KEY --lease S --wait S [--addr host:port,...]
    lockservice release KEY TOKEN [--addr ...]
    lockservice run KEY [--lease S] [--wait S] [--addr ...] -- CMD ARGS...
    lockservice bench ...            (see python -m lockservice.bench --help)

Exit status: 0 success; 1 release answered STALE; 2 bad arguments;
69 server unreachable; 75 the wait ran out without a grant; for C{run},
otherwise the command's own status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

EX_STALE = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75

DEFAULT_ADDR = os.environ.get("LOCKSERVICE_ADDR", "127.0.0.1:7700")
DEFAULT_STATUS_URL = os.environ.get("LOCKSERVICE_URL", "http://127.0.0.1:7780")


class CommandError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _fail(message: str, status: int) -> int:
    print(f"lockservice: {message}", file=sys.stderr)
    return status


# -- status --------------------------------------------------------------------


def fetchStatus(url: str) -> Dict[str, Any]:
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if not url.rstrip("/").endswith("/status"):
        url = url.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.loads(response.read()))
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach {url}: {reason}", EX_UNAVAILABLE) from None
    except ValueError:
        raise CommandError(f"{url} did not answer JSON", EX_UNAVAILABLE) from None


def formatStatus(s: Dict[str, Any]) -> str:
    lines = [
        f"node         {s.get('node') or '(single node)'}",
        f"role         {s['role']}   term {s.get('term', 0)}",
        f"active       {s.get('active') or '-'}",
        f"held keys    {s['held_keys']}   waiters {s['waiters']}   "
        f"connections {s['connections']}",
        f"highest token {s['highest_token']}",
        f"uptime       {s['uptime_seconds']:.0f} s   version {s['version']}",
    ]
    if s.get("peers"):
        lines.append("")
        lines.append(f"{'PEER':24} {'PRIO':>4} {'ALIVE':5} {'ROLE':12} {'TERM':>5} {'HEARD':>8}")
        for p in s["peers"]:
            heard = p.get("last_heard_seconds_ago")
            lines.append(
                f"{p['address']:24} {p['priority']:>4} {'yes' if p['alive'] else 'no':5} "
                f"{p['role']:12} {p['term']:>5} "
                f"{(f'{heard:.2f}s' if heard is not None else '-'):>8}"
            )
    return "\n".join(lines)


# -- lock commands (Twisted client) -------------------------------------------


async def _connected(reactor: Any, addr: str) -> Any:
    from lockservice.client.api import NoConnection, connect

    client = connect(reactor, addr)
    try:
        await client.whenConnected(timeout=5)
    except NoConnection:
        await client.close()
        raise CommandError(f"cannot reach lockservice at {addr}", EX_UNAVAILABLE) from None
    return client


async def _acquire(reactor: Any, client: Any, key: str, lease: float, wait: float) -> Any:
    from lockservice.client.api import LockRejected, LockTimeout, NoConnection

    try:
        return await client.acquire(key, lease, wait)
    except LockTimeout:
        raise CommandError(f"no grant for {key!r} within {wait} s", EX_TEMPFAIL) from None
    except LockRejected as e:
        raise CommandError(f"rejected: {e.message}", EX_USAGE) from None
    except NoConnection as e:
        raise CommandError(str(e), EX_UNAVAILABLE) from None


async def acquireCommand(reactor: Any, args: argparse.Namespace) -> int:
    client = await _connected(reactor, args.addr)
    try:
        lock = await _acquire(reactor, client, args.key, args.lease, args.wait)
        print(lock.token)
        return 0
    finally:
        await client.close()


async def releaseCommand(reactor: Any, args: argparse.Namespace) -> int:
    from lockservice.client.api import Lock, ReleaseFailed

    client = await _connected(reactor, args.addr)
    try:
        try:
            ok = await client.release(Lock(args.key, args.token))
        except ReleaseFailed as e:
            raise CommandError(str(e), EX_UNAVAILABLE) from None
        print("OK" if ok else "STALE")
        return 0 if ok else EX_STALE
    finally:
        await client.close()


async def runCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    Hold the lock while CMD runs; release when it ends (also on Ctrl+C,
    which is passed on to CMD); exit with CMD's status.
    """
    from twisted.internet.defer import Deferred
    from twisted.internet.protocol import ProcessProtocol

    command: List[str] = args.command
    if not command:
        raise CommandError("run needs a command after --", EX_USAGE)
    client = await _connected(reactor, args.addr)
    try:
        lock = await _acquire(reactor, client, args.key, args.lease, args.wait)
        ended: "Deferred[int]" = Deferred()

        class Child(ProcessProtocol):
            def processEnded(self, reason: Any) -> None:
                code = reason.value.exitCode
                sig = reason.value.signal
                ended.callback(code if code is not None else 128 + (sig or 0))

        env = dict(os.environ, LOCKSERVICE_KEY=args.key, LOCKSERVICE_TOKEN=str(lock.token))
        try:
            process = reactor.spawnProcess(
                Child(), command[0], command, env=env, childFDs={0: 0, 1: 1, 2: 2},
                usePTY=False,
            )
        except OSError as e:
            await client.release(lock)
            raise CommandError(f"cannot run {command[0]}: {e}", 127) from None

        def passOn(signum: int, frame: Any) -> None:
            reactor.callFromThread(_signalChild, process, signum)

        previous = {s: signal.signal(s, passOn) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            status = await ended
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            try:
                await client.release(lock)
            except Exception as e:  # the lease reclaims it anyway
                print(f"lockservice: release failed ({e}); the lease will free the key",
                      file=sys.stderr)
        return status
    finally:
        await client.close()


def _signalChild(process: Any, signum: int) -> None:
    try:
        process.signalProcess({int(signal.SIGINT): "INT", int(signal.SIGTERM): "TERM"}[signum])
    except Exception:
        pass  # already gone


# -- entry point ---------------------------------------------------------------


def _positiveSeconds(text: str) -> float:
    from lockservice.core.wire import checkSeconds

    try:
        return checkSeconds(text, "seconds", positive=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _token(text: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise argparse.ArgumentTypeError(f"not a token: {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lockservice", description="lockservice command-line client")
    sub = p.add_subparsers(dest="command_name", required=True)

    st = sub.add_parser("status", help="show a node's (and its cluster's) status")
    st.add_argument("url", nargs="?", default=DEFAULT_STATUS_URL,
                    help=f"the node's --http address (default {DEFAULT_STATUS_URL})")
    st.add_argument("--json", action="store_true", help="print the raw JSON")

    def lockArgs(sp: argparse.ArgumentParser, leaseDefault: Optional[float]) -> None:
        sp.add_argument("key")
        sp.add_argument("--addr", default=DEFAULT_ADDR,
                        help=f"node addresses host:port,... (default {DEFAULT_ADDR})")
        if leaseDefault is not None:
            sp.add_argument("--lease", type=_positiveSeconds, default=leaseDefault,
                            help=f"lease in seconds (default {leaseDefault:g})")
            sp.add_argument("--wait", type=_positiveSeconds, default=0,
                            help="seconds to wait for the lock (default 0: no limit)")

    ac = sub.add_parser("acquire", help="acquire KEY and print its fencing token")
    lockArgs(ac, 30)
    rl = sub.add_parser("release", help="release KEY held with TOKEN")
    lockArgs(rl, None)
    rl.add_argument("token", type=_token)
    rn = sub.add_parser("run", help="run a command while holding KEY")
    lockArgs(rn, 60)
    rn.add_argument("command", nargs="*", help="-- CMD ARGS... (after a literal --)")
    sub.add_parser("bench", help="load generator (python -m lockservice.bench --help)",
                   add_help=False)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from lockservice import bench

        return bench.main(argv[1:])
    command: List[str] = []
    if argv[:1] == ["run"] and "--" in argv:
        # Everything after "--" belongs to CMD, options included.
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    args = parser().parse_args(argv)
    if args.command_name == "run":
        args.command = args.command + command
    if args.command_name in ("acquire", "run") and args.lease <= 0:
        return _fail("--lease must be > 0", EX_USAGE)
    try:
        if args.command_name == "status":
            data = fetchStatus(args.url)
            print(json.dumps(data, indent=2) if args.json else formatStatus(data))
            return 0
        from twisted.internet.defer import Deferred
        from twisted.internet.task import react

        handler = {"acquire": acquireCommand, "release": releaseCommand,
                   "run": runCommand}[args.command_name]
        result: Dict[str, int] = {}

        async def body(reactor: Any) -> None:
            try:
                result["status"] = await handler(reactor, args)
            except CommandError as e:
                result["status"] = _fail(str(e), e.status)

        try:
            react(lambda reactor: Deferred.fromCoroutine(body(reactor)))
        except SystemExit:
            pass
        return result.get("status", 1)
    except CommandError as e:
        return _fail(str(e), e.status)


if __name__ == "__main__":
    sys.exit(main())
