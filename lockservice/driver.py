"""
The conformance driver of the Python client: one small program that every
official client ships, so that one suite tests them all against real
nodes.  It speaks JSON lines -- one command per line on stdin, one result
or event per line on stdout -- and uses the asyncio client, the same one
applications import:

    python -m lockservice.driver --addrs HOST:PORT[,HOST:PORT...] [--name NAME]
        [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]

Commands run concurrently; results come back in completion order, each
echoing its command's C{id}.  Tokens are decimal strings.  See
docs/protocol.md ("Conformance drivers") for every command and result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from typing import Any, Awaitable, Callable, Dict, NoReturn, Optional, Set, Tuple, Union

from lockservice.client import aio
from lockservice.client.arguments import checkShare, encodeKey
from lockservice.client.election import DEFAULT_LEADER_LEASE
from lockservice.client.errors import (
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
)
from lockservice.core import wire

# At close, held locks are released (best effort) within this.
CLOSE_WITHIN = 5.0

Id = Union[int, str]
Json = Dict[str, Any]


class BadCommand(Exception):
    """
    A malformed command: answered C{bad_command}.
    """


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"lockservice.driver: {message}\n")
        raise SystemExit(2)


def parseArguments(argv: Any) -> argparse.Namespace:
    parser = _Parser(prog="python -m lockservice.driver", add_help=False)
    parser.add_argument("--addrs", required=True)
    parser.add_argument("--name")
    parser.add_argument("--tls-ca")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is not None and args.tls_ca is None:
        parser.error("--tls-cert needs --tls-ca")
    return args


def _field(command: Json, name: str, kind: Any, required: bool = True) -> Any:
    value = command.get(name)
    if value is None:
        if required:
            raise BadCommand(f"missing field {name!r}")
        return None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadCommand(f"field {name!r} must be a number")
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadCommand(f"field {name!r} must be a {kind.__name__}")
    return value


def _token(command: Json, name: str = "token") -> int:
    text = _field(command, name, str)
    token = wire.parseToken(text.encode("ascii", "replace"))
    if token is None:
        raise ValueError(f"invalid token {text!r}: decimal digits, at most 2^64-1")
    return token


def _seconds(value: float, name: str, positive: bool) -> float:
    return wire.checkSeconds(value, name, positive=positive)


def errorOf(error: BaseException) -> str:
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, LockTimeout):
        return "timeout"
    if isinstance(error, LockRejected):
        return "rejected"
    if isinstance(error, ValueError):
        return "invalid"
    return "no_connection"  # NoConnection, ReleaseFailed, anything unforeseen


class Driver:
    def __init__(self, client: aio.Client, write: Callable[[Json], None]) -> None:
        self.client = client
        self.write = write
        # Pending commands that may be cancelled: id (as JSON) -> task.
        self.tasks: Dict[str, "asyncio.Task[None]"] = {}
        self.running: Set["asyncio.Task[None]"] = set()
        self.held: Dict[Tuple[str, int], aio.Lock] = {}
        self.leaderships: Dict[str, Set[aio.Leadership]] = {}
        self.watching: Set["asyncio.Future[None]"] = set()
        self.closing = False

    # -- reading commands -----------------------------------------------------

    def line(self, text: str) -> Optional["asyncio.Task[None]"]:
        if self.closing or not text.strip():
            return None
        try:
            command = json.loads(text)
        except ValueError:
            self.write({"id": None, "ok": False, "error": "bad_command", "message": "not JSON"})
            return None
        if not isinstance(command, dict):
            self.write({"id": None, "ok": False, "error": "bad_command",
                        "message": "a command is a JSON object"})
            return None
        ident = command.get("id")
        if isinstance(ident, bool) or not isinstance(ident, (int, str)):
            self.write({"id": None, "ok": False, "error": "bad_command",
                        "message": "missing or bad id (an integer or a string)"})
            return None
        op = command.get("op")
        if op == "close":
            return asyncio.ensure_future(self.close(ident))
        handlers: Dict[Any, Callable[[Json], Callable[[], Awaitable[Json]]]] = {
            "acquire": self.acquire, "release": self.release, "renew": self.renew,
            "observe": self.observe, "campaign": self.campaign, "leader": self.leader,
            "resign": self.resign,
        }
        try:
            if op == "cancel":
                self.cancel(ident, command)
                return None
            handler = handlers.get(op)
            if handler is None:
                raise BadCommand(f"unknown op {op!r}")
            run = handler(command)
        except BadCommand as e:
            self.write({"id": ident, "ok": False, "error": "bad_command", "message": str(e)})
            return None
        except ValueError as e:
            self.write({"id": ident, "ok": False, "error": "invalid", "message": str(e)})
            return None
        task = asyncio.ensure_future(self._run(ident, run))
        if op in ("acquire", "observe", "campaign"):
            self.tasks[json.dumps(ident)] = task
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def _run(self, ident: Id, run: Callable[[], Awaitable[Json]]) -> None:
        try:
            result = await run()
        except asyncio.CancelledError:
            result = {"ok": False, "error": "cancelled", "message": "cancelled"}
        except Exception as e:
            result = {"ok": False, "error": errorOf(e), "message": str(e)}
        finally:
            self.tasks.pop(json.dumps(ident), None)
        if not self.closing:
            self.write({"id": ident, **result})

    # -- the commands ------------------------------------------------------------

    def acquire(self, command: Json) -> Callable[[], Awaitable[Json]]:
        key = _field(command, "key", str)
        lease = _field(command, "lease", float)
        wait = _field(command, "wait", float)
        share = command.get("share")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (str, int))):
            raise BadCommand("field 'share' must be null, \"r\" or an integer")
        keepalive = _field(command, "keepalive", bool, required=False) or False
        encodeKey(key)
        checkShare(share)
        _seconds(lease, "lease", positive=True)
        _seconds(wait, "wait", positive=False)

        async def run() -> Json:
            lock = await self.client.acquire(key, lease, wait, share=share, keepAlive=keepalive)
            self.held[(lock.key, lock.token)] = lock
            if keepalive:
                self._watchLoss(lock.lost, lock.key, lock.token,
                                lambda: self.held.pop((lock.key, lock.token), None))
            return {"ok": True, "token": str(lock.token)}

        return run

    def _watchLoss(self, lost: asyncio.Event, key: str, token: int,
                   forget: Callable[[], object]) -> None:
        """
        Tell C{{"event": "lost", ...}} the moment C{lost} is set.
        """
        async def watch() -> None:
            await lost.wait()
            forget()
            if not self.closing:
                self.write({"event": "lost", "key": key, "token": str(token)})

        self.watching.add(asyncio.ensure_future(watch()))

    def release(self, command: Json) -> Callable[[], Awaitable[Json]]:
        key = _field(command, "key", str)
        token = _token(command)
        encodeKey(key)

        async def run() -> Json:
            lock = self.held.pop((key, token), None)
            try:
                if lock is not None:
                    released = await lock.release()
                else:
                    released = await self.client.releaseToken(key, token)
            except ReleaseFailed as e:
                return {"ok": False, "error": "no_connection", "message": str(e)}
            if not released:
                return {"ok": False, "error": "stale", "message": f"{key}: token {token} "
                        "does not hold it"}
            return {"ok": True}

        return run

    def renew(self, command: Json) -> Callable[[], Awaitable[Json]]:
        key = _field(command, "key", str)
        token = _token(command)
        lease = _field(command, "lease", float)
        encodeKey(key)
        _seconds(lease, "lease", positive=True)

        async def run() -> Json:
            lock = self.held.get((key, token))
            try:
                if lock is not None:
                    renewed = await lock.renew(lease)
                else:
                    renewed = await self.client.renewToken(key, token, lease)
            except NoConnection as e:
                return {"ok": False, "error": "no_connection", "message": str(e)}
            if not renewed:
                return {"ok": False, "error": "stale", "message": f"{key}: token {token} "
                        "does not hold it"}
            return {"ok": True}

        return run

    def observe(self, command: Json) -> Callable[[], Awaitable[Json]]:
        key = _field(command, "key", str)
        token = _token(command) if command.get("token") is not None else None
        wait = _field(command, "wait", float)
        encodeKey(key)
        _seconds(wait, "wait", positive=False)

        async def run() -> Json:
            state = await self.client.observeOnce(key, token, wait)
            if token is not None and state.token == token:
                return {"ok": False, "error": "timeout", "token": str(state.token),
                        "message": f"{key}: nothing changed within {wait:g} s"}
            return {"ok": True, "token": str(state.token), "holder": state.holder,
                    "value": state.value}

        return run

    def campaign(self, command: Json) -> Callable[[], Awaitable[Json]]:
        election = _field(command, "election", str)
        value = _field(command, "value", str)
        lease = _field(command, "lease", float, required=False)
        if lease is None:
            lease = DEFAULT_LEADER_LEASE
        encodeKey(election, "election")
        _seconds(lease, "lease", positive=True)
        from lockservice.client.election import campaignName

        campaignName(value, self.client.instance)

        async def run() -> Json:
            leadership = await self.client.campaign(election, value, lease)
            self.leaderships.setdefault(election, set()).add(leadership)
            self._watchLoss(leadership.lost, election, leadership.token,
                            lambda: self.leaderships.get(election, set()).discard(leadership))
            return {"ok": True, "token": str(leadership.token)}

        return run

    def leader(self, command: Json) -> Callable[[], Awaitable[Json]]:
        election = _field(command, "election", str)
        encodeKey(election, "election")

        async def run() -> Json:
            who = await self.client.leader(election)
            if who is None:
                return {"ok": True, "value": None, "token": "0", "holder": None}
            return {"ok": True, "value": who.value, "token": str(who.token),
                    "holder": who.holder}

        return run

    def resign(self, command: Json) -> Callable[[], Awaitable[Json]]:
        election = _field(command, "election", str)
        encodeKey(election, "election")

        async def run() -> Json:
            for leadership in list(self.leaderships.pop(election, ())):
                try:
                    await leadership.resign()
                except ReleaseFailed as e:
                    return {"ok": False, "error": "no_connection", "message": str(e)}
            return {"ok": True}

        return run

    def cancel(self, ident: Id, command: Json) -> None:
        target = command.get("target")
        if isinstance(target, bool) or not isinstance(target, (int, str)):
            raise BadCommand("field 'target' must be an integer or a string")
        task = self.tasks.get(json.dumps(target))
        if task is None or task.done():
            self.write({"id": ident, "ok": False, "error": "unknown_target",
                        "message": f"no pending acquire, observe or campaign {target!r}"})
            return
        task.cancel()

        async def after() -> None:
            await asyncio.wait([task])
            if not self.closing:
                self.write({"id": ident, "ok": True})

        self.running.add(asyncio.ensure_future(after()))

    # -- closing -----------------------------------------------------------------

    async def close(self, ident: Optional[Id] = None) -> None:
        """
        C{close} (C{ident} given) or the end of stdin: pending commands end
        C{cancelled}, held locks are released (best effort), then exit.
        """
        if self.closing:
            return
        for task in list(self.tasks.values()):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running), timeout=CLOSE_WITHIN)
        self.closing = True
        releases = [asyncio.ensure_future(lock.release()) for lock in self.held.values()]
        releases += [asyncio.ensure_future(leadership.resign())
                     for held in self.leaderships.values() for leadership in held]
        if releases:
            await asyncio.wait(releases, timeout=CLOSE_WITHIN)
        try:
            await asyncio.wait_for(self.client.close(), 1.0)
        except (asyncio.TimeoutError, Exception):
            pass
        for watch in self.watching:
            watch.cancel()
        if ident is not None:
            self.write({"id": ident, "ok": True})


def _writer() -> Callable[[Json], None]:
    def write(result: Json) -> None:
        try:
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # stdout is gone: nobody to tell

    return write


async def _main(args: argparse.Namespace) -> int:
    tls = None
    if args.tls_ca is not None:
        from lockservice.tls import ClientTLS

        try:
            tls = ClientTLS.fromFiles(args.tls_ca, args.tls_cert, args.tls_key)
        except Exception as e:
            sys.stderr.write(f"lockservice.driver: {e}\n")
            return 2
    try:
        client = await aio.connect(args.addrs, name=args.name, tls=tls)
    except ValueError as e:
        sys.stderr.write(f"lockservice.driver: {e}\n")
        return 2
    driver = Driver(client, _writer())
    lines: "asyncio.Queue[bytes]" = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read() -> None:  # a daemon thread: stdin may be a pipe, a file or a TTY
        for raw in sys.stdin.buffer:
            loop.call_soon_threadsafe(lines.put_nowait, raw)
        loop.call_soon_threadsafe(lines.put_nowait, b"")

    threading.Thread(target=read, name="driver stdin", daemon=True).start()
    while True:
        raw = await lines.get()
        if not raw:
            await driver.close()
            return 0
        task = driver.line(raw.decode("utf-8", "replace"))
        if task is not None and _isClose(raw):
            await task
            return 0


def _isClose(raw: bytes) -> bool:
    try:
        command = json.loads(raw)
    except ValueError:
        return False
    return isinstance(command, dict) and command.get("op") == "close"


def main(argv: Any = None) -> None:
    args = parseArguments(sys.argv[1:] if argv is None else argv)
    status = asyncio.run(_main(args))
    sys.stdout.flush()
    sys.stderr.flush()
    # Not SystemExit: the stdin reader thread may be blocked in a read
    # holding stdin's buffer lock, and the interpreter's shutdown then
    # aborts the process (a fatal error and a core) instead of exiting.
    os._exit(status)


if __name__ == "__main__":
    main()
