# -*- test-case-name: tests.test_cli -*-
"""
The C{lockservice} command.

    lockservice status [URL]
    lockservice acquire KEY [--lease S] [--wait S] [--read | --slots N] [connection options]
    lockservice release KEY TOKEN [connection options]
    lockservice release --force KEY --reason TEXT [--http URL] --admin-secret FILE
    lockservice run KEY [--lease S] [--wait S] [--read | --slots N] [--grace S]
                    [connection options] -- CMD ARGS...
    lockservice shell [HOST:PORT] [--tls-ca FILE ...]
    lockservice events [KEY] [--follow] [--http URL]
    lockservice bench ...            (see python -m lockservice.bench --help)
    lockservice config check FILE | config show FILE
    lockservice state inspect DIR [--json] | state backup DIR FILE
    lockservice state restore FILE DIR [--force] [--config FILE]
    lockservice state adopt DIR --config FILE

Connection options: C{--addr host:port,...} (C{;} between clusters),
C{--cluster host:port,...} (repeated: one per cluster), C{--name NAME},
C{--tls-ca FILE [--tls-cert FILE --tls-key FILE]}.

Exit status: see L{EXIT_STATUSES} (and docs/operations.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

EX_OK = 0
EX_STALE = 1  # release answered STALE; release --force: the key was not held
EX_USAGE = 2
EX_NOT_ACTIVE = 3  # release --force sent to a standby (HTTP 409)
EX_UNAVAILABLE = 69
EX_LOST = 74
EX_TEMPFAIL = 75
EX_NOPERM = 77

EXIT_STATUSES = {
    EX_OK: "success (for run: CMD's own status is returned instead)",
    EX_STALE: "release answered STALE; release --force: the key was not held",
    EX_USAGE: "bad arguments (help printed when there are none), or the server "
              "rejected the request (E)",
    EX_NOT_ACTIVE: "release --force: that node is a standby (HTTP 409); "
                   "send it to the active's HTTP endpoint",
    EX_UNAVAILABLE: "no node (or HTTP endpoint) reachable, or it does not speak what "
                    "was expected (the lock port given for --http, or the reverse)",
    EX_LOST: "run: the lock was lost while CMD ran; CMD was stopped",
    EX_TEMPFAIL: "the wait ran out without a grant (acquire, run)",
    126: "run: CMD was found but could not be run",
    127: "run: CMD was not found",
    EX_NOPERM: "release --force refused: wrong admin secret, or none configured",
}

DEFAULT_ADDR = os.environ.get("LOCKSERVICE_ADDR", "127.0.0.1:7700")
DEFAULT_STATUS_URL = os.environ.get("LOCKSERVICE_URL", "http://127.0.0.1:7780")
DEFAULT_GRACE = 10.0


class CommandError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _fail(message: str, status: int) -> int:
    print(f"lockservice: {message}", file=sys.stderr)
    return status


def defaultName() -> str:
    """
    How the CLI names its connections unless told: C{host:pid:lockservice-cli}.
    """
    host = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return f"{host or 'localhost'}:{os.getpid()}:lockservice-cli"


# -- HTTP: status, events, force-release ---------------------------------------


def _baseURL(url: str) -> str:
    if "://" not in url:
        url = "http://" + url
    try:
        where = (urllib.parse.urlsplit(url)
                 if url.isprintable() and not any(c.isspace() for c in url) else None)
        host = where.hostname if where is not None else None
    except ValueError:  # "Invalid IPv6 URL", a bad port
        where = host = None
    if where is None or where.scheme not in ("http", "https") or not host:
        raise CommandError(f"{url!r} is not an http:// or https:// URL of a node's "
                           f"--http endpoint", EX_USAGE)
    return url.rstrip("/")


def _http(url: str, data: Optional[bytes] = None,
          headers: Optional[Dict[str, str]] = None) -> Any:
    """
    One HTTP request; the decoded JSON answer.  HTTP errors are returned as
    C{urllib.error.HTTPError} for the caller to map.
    """
    try:
        request = urllib.request.Request(url, data=data, headers=headers or {},
                                         method="POST" if data is not None else "GET")
    except ValueError as e:  # urlsplit's "Invalid IPv6 URL" and kin
        raise CommandError(f"{url!r} is not a valid URL: {e}", EX_USAGE) from None
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
    except urllib.error.HTTPError:
        raise
    except http.client.HTTPException:
        # BadStatusLine and kin: something answered, but not HTTP (the
        # lock port answers "E * /status unknown operation").
        where = urllib.parse.urlsplit(url)
        raise CommandError(f"{where.scheme}://{where.netloc} is not an HTTP endpoint "
                           f"(is it the lock port?)", EX_UNAVAILABLE) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach {url}: {reason}", EX_UNAVAILABLE) from None
    except ValueError as e:  # http.client.InvalidURL, a bad header value
        raise CommandError(f"cannot send to {url}: {e}", EX_USAGE) from None
    try:
        return json.loads(body)
    except ValueError:
        raise CommandError(f"{url} did not answer JSON", EX_UNAVAILABLE) from None


def _object(answer: Any, url: str, needs: tuple = ()) -> Dict[str, Any]:
    """
    C{answer} if it is a JSON object with the fields C{needs}: else the
    URL is not the endpoint it was taken for (one line, exit 69).
    """
    if not isinstance(answer, dict) or any(field not in answer for field in needs):
        raise CommandError(f"{url} did not answer as a lockservice node does "
                           f"(is it a node's --http endpoint?)", EX_UNAVAILABLE)
    return answer


def _jsonBody(e: urllib.error.HTTPError) -> Dict[str, Any]:
    try:
        return dict(json.loads(e.read()))
    except Exception:
        return {}


def fetchStatus(url: str) -> Dict[str, Any]:
    url = _baseURL(url)
    if not url.endswith("/status"):
        url += "/status"
    try:
        return _object(_http(url), url, ("role", "held_keys", "waiters", "connections",
                                          "highest_token", "uptime_seconds", "version"))
    except urllib.error.HTTPError as e:
        raise CommandError(f"{url} answered {e.code} {e.reason}", EX_UNAVAILABLE) from None


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


def formatEvent(e: Dict[str, Any]) -> str:
    """
    One event as one line: time (UTC), type, key, token, who, detail.
    """
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(e["time"]))
    when += f".{int((e['time'] % 1) * 1000):03d}Z"
    parts = [f"{e['seq']:>6}", when, f"{e['type']:13}", e.get("key") or "-"]
    if e.get("token") is not None:
        parts.append(f"token={e['token']}")
    if e.get("who"):
        parts.append(f"who={e['who']}")
    if e.get("detail"):
        parts.append(f"({e['detail']})")
    return " ".join(parts)


def eventsCommand(args: argparse.Namespace) -> int:
    """
    Print the node's recent events (oldest first); with C{--follow}, keep
    polling for new ones until interrupted.
    """
    base = _baseURL(args.http)
    since = args.since
    try:
        while True:
            query = {"since": str(since)}
            if args.key:
                query["key"] = args.key
            url = f"{base}/events?{urllib.parse.urlencode(query)}"
            try:
                answer = _http(url)
            except urllib.error.HTTPError as e:
                raise CommandError(f"{url} answered {e.code} {e.reason}",
                                   EX_UNAVAILABLE) from None
            answer = _object(answer, url, ("events",))
            if not isinstance(answer["events"], list) or not all(
                    isinstance(e, dict) and {"seq", "time", "type"} <= e.keys()
                    for e in answer["events"]):
                raise CommandError(f"{url} did not answer events as a lockservice node "
                                   f"does", EX_UNAVAILABLE)
            missed = int(answer.get("missed", 0) or 0)
            if missed and since > 0:
                # One line per gap: the node's ring dropped events this
                # reader had not seen yet (it polled too slowly).
                print(f"lockservice: warning: {missed} events missed (gone from the "
                      f"node's ring before they were read); continuing from "
                      f"#{answer.get('oldest')}", file=sys.stderr, flush=True)
            for event in answer.get("events", []):
                print(json.dumps(event) if args.json else formatEvent(event), flush=True)
            since = max(since, int(answer.get("next", since)))
            if not args.follow:
                return EX_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EX_OK


def forceReleaseCommand(args: argparse.Namespace) -> int:
    """
    C{POST /locks/<key>/release} with the admin secret: the key goes to its
    next waiter with a new token, so the old holder is fenced.
    """
    if not args.reason:
        raise CommandError("release --force needs --reason TEXT (it is recorded)", EX_USAGE)
    if not args.admin_secret:
        raise CommandError("release --force needs --admin-secret FILE", EX_USAGE)
    try:
        with open(args.admin_secret, "rb") as f:
            secret = f.read().strip().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"cannot read --admin-secret {args.admin_secret}: "
                           f"{getattr(e, 'strerror', None) or e}", EX_USAGE) from None
    if not secret or not secret.isprintable():
        raise CommandError(f"--admin-secret {args.admin_secret} must hold the secret on "
                           f"one line", EX_USAGE)
    url = f"{_baseURL(args.http)}/locks/{urllib.parse.quote(args.key, safe='')}/release"
    body = urllib.parse.urlencode({"reason": args.reason}).encode()
    try:
        answer = _http(url, data=body, headers={
            "Authorization": f"Bearer {secret}",
            "Content-Type": "application/x-www-form-urlencoded"})
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise CommandError(f"{args.key!r} is not held; nothing released", EX_STALE) from None
        if e.code == 401:
            raise CommandError("refused: wrong admin secret", EX_NOPERM) from None
        if e.code == 403:
            raise CommandError("refused: the node has no --admin-secret configured",
                               EX_NOPERM) from None
        if e.code == 409:
            active = _jsonBody(e).get("active")
            raise CommandError("this node is not active" + (
                f"; its active serves HTTP elsewhere (client address {active})"
                if active else ""), EX_NOT_ACTIVE) from None
        raise CommandError(f"{url} answered {e.code} {e.reason}", EX_UNAVAILABLE) from None
    if args.json:
        print(json.dumps(answer))
    else:
        nextToken = answer.get("next_token")
        handed = (f"handed to the next waiter with token {nextToken}" if nextToken is not None
                  else "no waiter: the key is free")
        print(f"released {answer.get('key')} (token {answer.get('released_token')}); "
              f"{handed}; reason: {answer.get('reason')}")
    return EX_OK


# -- lock commands (Twisted client) -------------------------------------------


def _tls(args: argparse.Namespace) -> Any:
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


def _clusters(args: argparse.Namespace) -> Any:
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


async def _connected(reactor: Any, args: argparse.Namespace) -> Any:
    from lockservice.client.api import connect
    from lockservice.client.errors import NoConnection

    clusters = _clusters(args)
    client = connect(reactor, clusters, name=args.name or defaultName(), tls=_tls(args))
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


async def _acquire(client: Any, key: str, lease: float, wait: float,
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
    client = await _connected(reactor, args)
    try:
        lock = await _acquire(client, args.key, args.lease, args.wait, share=args.share)
        print(lock.token)
        return EX_OK
    finally:
        await client.close()


async def releaseCommand(reactor: Any, args: argparse.Namespace) -> int:
    from lockservice.client.api import Lock
    from lockservice.client.errors import ReleaseFailed

    client = await _connected(reactor, args)
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
    command: List[str] = args.command
    client = await _connected(reactor, args)
    group: Optional[CommandGroup] = None
    previous: Dict[int, Any] = {}
    try:
        lock = await _acquire(client, args.key, args.lease, args.wait, keepAlive=True,
                              share=args.share)
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
        env = dict(os.environ, LOCKSERVICE_KEY=args.key, LOCKSERVICE_TOKEN=str(lock.token))
        try:
            group = CommandGroup(reactor, command, env)
        except OSError as e:
            await client.release(lock)
            # The shell's statuses: 127 not found, 126 found but not runnable.
            raise CommandError(f"cannot run {command[0]}: {e.strerror or e}",
                               127 if isinstance(e, FileNotFoundError) else 126) from None
        if state["pending"] is not None:
            group.signal(state["pending"])

        def lost(why: Any) -> None:
            if group is None or group.ended.called:
                return
            state["lost"] = why
            print(f"lockservice: {why}; stopping {command[0]} and its process group "
                  f"(SIGTERM, SIGKILL after {args.grace:g} s)", file=sys.stderr, flush=True)
            group.stop(args.grace)

        lock.lost.addCallback(lost)
        status = await group.ended
        if state["lost"] is None and group.alive():
            # CMD is done but left processes in its group: they must not
            # go on working once the key is released.
            print(f"lockservice: {command[0]} ended (status {status}) but left processes in its "
                  f"group; stopping them (SIGTERM, SIGKILL after {args.grace:g} s)",
                  file=sys.stderr, flush=True)
        await group.stop(args.grace)
        if state["lost"] is not None:
            return EX_LOST
        try:
            await client.release(lock)
        except Exception as e:  # the lease reclaims it anyway
            print(f"lockservice: release failed ({e}); the lease will free the key",
                  file=sys.stderr)
        return status
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if group is not None:
            group.abandon()
        await client.close()


class CommandGroup:
    """
    CMD in a process group of its own, so that C{run} can signal
    everything CMD started (a shell's children included), not only CMD.

    When C{run} owns the terminal (its stdin is a terminal and its group is
    the foreground one), CMD's group is made the foreground group while it
    runs, so CMD can read the terminal and gets Ctrl+C from it directly.
    """

    #: How often L{stop} looks whether the group has emptied.
    POLL = 0.05
    #: How long L{stop} waits for the group to empty after SIGKILL.
    AFTER_KILL = 5.0

    def __init__(self, reactor: Any, command: List[str], env: Dict[str, str]) -> None:
        import subprocess

        from twisted.internet.defer import Deferred
        from twisted.internet.threads import deferToThreadPool

        self.reactor = reactor
        self.command = command
        # process_group (3.11) sets the group between fork and exec, so no
        # signal can reach CMD before it is in its own group.
        spawnOptions: Dict[str, Any] = (
            {"process_group": 0} if sys.version_info >= (3, 11)
            else {"preexec_fn": os.setpgrp})
        self.process = subprocess.Popen(command, env=env, **spawnOptions)
        self.pgid = self.process.pid
        self._terminal = self._takeTerminal()
        self.ended: "Deferred[int]" = Deferred()
        # Popen.wait in a thread: the reactor reaps only the processes it
        # spawned, so it never takes CMD's exit status from us.
        waiting = deferToThreadPool(reactor, reactor.getThreadPool(), self.process.wait)
        waiting.addCallback(self._exited)
        self._stopping: "Optional[Deferred[None]]" = None

    def _exited(self, code: int) -> None:
        self._giveTerminalBack()
        self.ended.callback(code if code >= 0 else 128 - code)

    def _takeTerminal(self) -> Optional[int]:
        try:
            if not os.isatty(0) or os.tcgetpgrp(0) != os.getpgrp():
                return None
            os.tcsetpgrp(0, self.pgid)
        except OSError:
            return None
        # CMD may have touched the terminal before it was its group's
        # (stopped by SIGTTIN/SIGTTOU): let it go on.
        self.signal(signal.SIGCONT)
        return os.getpgrp()

    def _giveTerminalBack(self) -> None:
        if self._terminal is None:
            return
        # We are a background group until this call: without ignoring
        # SIGTTOU, tcsetpgrp would stop us.
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(0, self._terminal)
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, old)
            self._terminal = None

    def signal(self, signum: int) -> None:
        """
        Send C{signum} to every process of CMD's group.
        """
        try:
            os.killpg(self.pgid, signum)
        except OSError:
            pass  # the group is gone

    def alive(self) -> bool:
        """
        Whether a process of CMD's group (other than a zombie) still runs.
        """
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        if not os.path.isdir("/proc"):
            return True
        # Zombies answer kill(0) too: an orphan that a container's PID 1
        # never reaps must not count as working.
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and int(fields[2]) == self.pgid and fields[0] != "Z":
                return True
        return False

    def stop(self, grace: float) -> "Deferred[None]":
        """
        SIGTERM the group (if anything is left of it), SIGKILL after
        C{grace} seconds; fires once CMD has ended and the group is empty
        (or C{AFTER_KILL} seconds after the SIGKILL).
        """
        from twisted.internet.defer import Deferred

        if self._stopping is not None:
            return self._stopping
        self._stopping = Deferred()
        started = self.reactor.seconds()
        state = {"killed": False}

        def check() -> None:
            assert self._stopping is not None
            now = self.reactor.seconds()
            if self.ended.called and not self.alive():
                self._stopping.callback(None)
                return
            if not state["killed"] and now - started >= grace:
                state["killed"] = True
                self.signal(signal.SIGKILL)
            elif state["killed"] and now - started >= grace + self.AFTER_KILL:
                self._stopping.callback(None)
                return
            self.reactor.callLater(self.POLL, check)

        if self.alive():
            self.signal(signal.SIGTERM)
            self.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        check()
        return self._stopping

    def abandon(self) -> None:
        """
        C{run} is leaving on an unexpected path: leave nothing running.
        """
        if not self.ended.called or self.alive():
            self.signal(signal.SIGKILL)
        self._giveTerminalBack()


async def shellCommand(reactor: Any, args: argparse.Namespace) -> int:
    """
    An interactive line session: each line typed is sent as a request and
    each answer printed as it arrives (no C{nc} needed; TLS works too).
    End of input (Ctrl+D) ends the session once the node has answered.
    """
    from lockservice.shell import runShell

    clusters = _clusters(args)
    if len(clusters) != 1 or len(clusters[0]) != 1:
        raise CommandError("shell talks to one node: give one HOST:PORT", EX_USAGE)
    name = args.name or defaultName()
    try:
        return await runShell(reactor, clusters[0][0], _tls(args), name,
                              interactive=sys.stdin.isatty())
    except ConnectionError as e:
        raise CommandError(str(e), EX_UNAVAILABLE) from None


# -- entry point ---------------------------------------------------------------


def _seconds(text: str) -> float:
    from lockservice.core.wire import checkSeconds

    try:
        return checkSeconds(text, "seconds", positive=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text!r}")
    return value


def _token(text: str) -> int:
    if not text.isdigit() or not text.isascii() or int(text) >= 2**64:
        raise argparse.ArgumentTypeError(f"not a token: {text!r}")
    return int(text)


def _slots(text: str) -> Optional[int]:
    """
    C{--slots N}: the semaphore's slot count, 1-65535; 1 is the exclusive
    lock, so it gives C{None} (no share field on the wire).
    """
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of slots from 1 to 65535, not {text!r}")
    return None if int(text) == 1 else int(text)


def _sequence(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"not an event sequence number: {text!r}")
    return int(text)


def _key(text: str) -> str:
    from lockservice.core.wire import isValidKey

    if not isValidKey(text.encode("utf-8", "surrogateescape")):
        raise argparse.ArgumentTypeError(
            f"invalid key {text!r}: 1-250 bytes of UTF-8, no spaces or control characters")
    return text


class _Parser(argparse.ArgumentParser):
    """
    argparse, with errors as one line (plus the usage) and exit status 2.
    """

    def error(self, message: str) -> Any:
        print(f"lockservice: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EX_USAGE)


def _epilog() -> str:
    lines = ["exit statuses:"]
    lines += [f"  {code:>3}  {meaning}" for code, meaning in sorted(EXIT_STATUSES.items())]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    from lockservice import __version__

    p = _Parser(prog="lockservice", description="lockservice command-line client",
                epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lockservice {__version__}")
    p.add_argument("--reactor", metavar="NAME", default=os.environ.get("LOCKSERVICE_REACTOR"),
                   help="Twisted reactor to run on, e.g. asyncio (default: Twisted's "
                        "default; or $LOCKSERVICE_REACTOR)")
    sub = p.add_subparsers(dest="command_name", metavar="COMMAND", parser_class=_Parser)

    st = sub.add_parser("status", help="show a node's (and its cluster's) status")
    st.add_argument("url", nargs="?", default=DEFAULT_STATUS_URL,
                    help=f"the node's --http address (default {DEFAULT_STATUS_URL})")
    st.add_argument("--json", action="store_true", help="print the raw JSON")

    def connection(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--addr", default=DEFAULT_ADDR,
                        help=f"node addresses host:port,... ; ';' between clusters "
                             f"(default $LOCKSERVICE_ADDR or {DEFAULT_ADDR})")
        sp.add_argument("--cluster", action="append", metavar="HOST:PORT,...",
                        help="one cluster's addresses; repeat for several clusters "
                             "(keys are spread over them by rendezvous hashing)")
        sp.add_argument("--name", type=_key, default=None,
                        help="name of this client on the node (default host:pid:lockservice-cli)")
        sp.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, verifying the "
                        "node's certificate against this CA (PEM)")
        sp.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM), for "
                        "nodes that require one")
        sp.add_argument("--tls-key", metavar="FILE", help="the client certificate's key (PEM)")

    def lockArgs(sp: argparse.ArgumentParser, leaseDefault: float) -> None:
        sp.add_argument("key", type=_key)
        sp.add_argument("--lease", type=_positive, default=leaseDefault,
                        help=f"lease in seconds (default {leaseDefault:g})")
        sp.add_argument("--wait", type=_seconds, default=0,
                        help="seconds to wait for the lock (default 0: no limit)")
        kind = sp.add_mutually_exclusive_group()
        kind.add_argument("--read", dest="share", action="store_const", const="r",
                          help="a read lock: shared with other readers, exclusive of "
                               "writers (a plain acquire is the writer)")
        kind.add_argument("--slots", dest="share", type=_slots, metavar="N",
                          help="a semaphore of N slots (2-65535): at most N holders at "
                               "once; 1 is the plain exclusive lock")
        connection(sp)

    ac = sub.add_parser("acquire", help="acquire KEY and print its fencing token")
    lockArgs(ac, 30)

    rl = sub.add_parser(
        "release", help="release KEY held with TOKEN (or --force it over HTTP)",
        description="release KEY TOKEN: give a lock back.  release --force KEY --reason "
                    "TEXT: an operator takes KEY from its holder (the next waiter gets it "
                    "with a new token), through the node's --http endpoint and admin secret.")
    rl.add_argument("key", type=_key)
    rl.add_argument("token", type=_token, nargs="?")
    rl.add_argument("--force", action="store_true",
                    help="force-release KEY whoever holds it (needs --reason, "
                         "--admin-secret; uses --http)")
    rl.add_argument("--reason", help="why (recorded in the node's events)")
    rl.add_argument("--http", default=DEFAULT_STATUS_URL,
                    help=f"the node's HTTP endpoint for --force (default $LOCKSERVICE_URL "
                         f"or {DEFAULT_STATUS_URL})")
    rl.add_argument("--admin-secret", metavar="FILE", help="file holding the admin secret")
    rl.add_argument("--json", action="store_true", help="--force: print the raw JSON answer")
    connection(rl)

    rn = sub.add_parser(
        "run", help="run a command while holding KEY (renewed while it runs)",
        description="Acquire KEY, run CMD with LOCKSERVICE_KEY and LOCKSERVICE_TOKEN set, "
                    "renew the lock every third of --lease while CMD runs, release it when "
                    "CMD ends and exit with CMD's status.  If the lock is lost, CMD gets "
                    f"SIGTERM (SIGKILL after --grace) and the exit status is {EX_LOST}.")
    lockArgs(rn, 60)
    rn.add_argument("--grace", type=_seconds, default=DEFAULT_GRACE,
                    help=f"seconds between SIGTERM and SIGKILL when the lock is lost "
                         f"(default {DEFAULT_GRACE:g})")
    rn.add_argument("command", nargs="*", help="-- CMD ARGS... (after a literal --)")

    sh = sub.add_parser("shell", help="type requests to a node and see its answers",
                        description="An interactive line session with one node (plain TCP "
                                    "or TLS): type A/R/N/P/I requests, see the answers.")
    sh.add_argument("target", nargs="?", metavar="HOST:PORT",
                    help=f"the node (default $LOCKSERVICE_ADDR or {DEFAULT_ADDR})")
    connection(sh)

    ev = sub.add_parser("events", help="show a node's recent lock events")
    ev.add_argument("key", nargs="?", type=_key, help="only this key's events")
    ev.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    ev.add_argument("--since", type=_sequence, default=0, help="only events after this seq")
    ev.add_argument("--http", default=DEFAULT_STATUS_URL,
                    help=f"the node's HTTP endpoint (default $LOCKSERVICE_URL or "
                         f"{DEFAULT_STATUS_URL})")
    ev.add_argument("--interval", type=_positive, default=1.0,
                    help="seconds between polls with --follow (default 1)")
    ev.add_argument("--json", action="store_true", help="one JSON object per line")

    sub.add_parser("bench", help="load generator (python -m lockservice.bench --help)",
                   add_help=False)

    cf = sub.add_parser("config", help="check or show a node's TOML configuration file",
                        description="The node's --config FILE (TOML), read and checked "
                                    "exactly as twistd lockservice --config FILE does, "
                                    "nothing started.")
    cfSub = cf.add_subparsers(dest="config_command", metavar="ACTION", parser_class=_Parser)
    cfSub.required = True
    cc = cfSub.add_parser("check", help="exit 0 and print nothing if FILE is good; else "
                                        "one line and exit 2")
    cc.add_argument("file", metavar="FILE")
    cs = cfSub.add_parser("show", help="print the effective settings of FILE (the file's "
                                       "values and every default; paths, never contents)")
    cs.add_argument("file", metavar="FILE")

    sd = sub.add_parser("state", help="inspect, back up or restore a node's --state-dir",
                        description="Tools for the directory of --state-dir DIR.")
    sdSub = sd.add_subparsers(dest="state_command", metavar="ACTION", parser_class=_Parser)
    sdSub.required = True
    si = sdSub.add_parser("inspect", help="what DIR holds: format, node, token mark, the "
                                          "saved locks and their remaining leases as of now")
    si.add_argument("directory", metavar="DIR")
    si.add_argument("--json", action="store_true", help="print JSON")
    sb = sdSub.add_parser("backup", help="copy DIR's state file to FILE, checked (safe while "
                                         "the node runs)")
    sb.add_argument("directory", metavar="DIR")
    sb.add_argument("file", metavar="FILE")
    sr = sdSub.add_parser("restore", help="put backup FILE in DIR for the next start (DIR's "
                                          "node must be stopped)")
    sr.add_argument("file", metavar="FILE")
    sr.add_argument("directory", metavar="DIR")
    sr.add_argument("--force", action="store_true", help="replace a state file already in DIR")
    sr.add_argument("--config", metavar="TOML",
                    help="the node's configuration file: refuse a backup of another "
                         "node or cluster")
    sa = sdSub.add_parser("adopt", help="make DIR's state file the node's of --config "
                                        "(after its secret or peer list changed; DIR's "
                                        "node must be stopped)")
    sa.add_argument("directory", metavar="DIR")
    sa.add_argument("--config", metavar="TOML", required=True,
                    help="the node's configuration file (its secret, peers and node)")
    return p


def configCommand(args: argparse.Namespace) -> int:
    """
    C{lockservice config check FILE} and C{config show FILE}.
    """
    from lockservice import config

    try:
        if args.config_command == "check":
            config.parseFile(args.file, "lockservice config check")
            return EX_OK
        print(config.show(args.file))
    except SystemExit as e:  # the one line is written
        return int(e.code or 0)
    return EX_OK


def stateCommand(args: argparse.Namespace) -> int:
    """
    C{lockservice state inspect | backup | restore}.
    """
    from lockservice import statetools

    try:
        if args.state_command == "inspect":
            info = statetools.inspect(args.directory)
            print(json.dumps(info, indent=2) if args.json
                  else statetools.formatInspection(info))
            return EX_OK if info.get("error") is None else statetools.EX_FAILED
        if args.state_command == "backup":
            done = statetools.backup(args.directory, args.file)
            print(f"backed up {args.directory} to {done['file']} (token mark "
                  f"{done['token_mark']}, {done['saved_locks']} saved locks)")
            return EX_OK
        identity = None
        if args.config:
            from lockservice import config
            from lockservice.state import clusterIdentity

            options = config.parseFile(args.config, f"lockservice state {args.state_command}")
            identity = (clusterIdentity(options["secretBytes"], options["peerList"]),
                        options["self"] or "")
        if args.state_command == "adopt":
            assert identity is not None
            done = statetools.adopt(args.directory, *identity)
            print(f"{done['file']} now belongs to "
                  f"{done['node'] or 'this lone node'} of the configuration "
                  f"({'changed' if done['changed'] else 'it did already'}; token mark "
                  f"{done['token_mark']}, {done['saved_locks']} saved locks)")
            return EX_OK
        done = statetools.restore(args.file, args.directory, force=args.force,
                                  identity=identity)
        print(f"restored {args.file} to {done['file']} (token mark {done['token_mark']}, "
              f"{done['saved_locks']} saved locks): start the node")
        return EX_OK
    except statetools.ToolError as e:
        return _fail(str(e), e.status)
    except SystemExit as e:
        return int(e.code or 0)


def _restoreSIGINT() -> None:
    """
    Make Ctrl+C work even when SIGINT was inherited as ignored (a command
    started with C{&} from a script): Python, and Twisted after it, leave
    an ignored SIGINT ignored, and C{events --follow} or a long wait would
    then never stop on it.  (The node does the same, see L{lockservice.tap}.)
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _restoreSIGINT()
    if argv[:1] == ["bench"]:
        from lockservice import bench

        return bench.main(argv[1:])
    if not argv:
        parser().print_help()
        return EX_USAGE
    command: List[str] = []
    if "--" in argv and "run" in argv[:argv.index("--")]:
        # Everything after "--" belongs to CMD, options included.
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return _dispatch(args, command)
    except CommandError as e:
        return _fail(str(e), e.status)
    except BrokenPipeError:
        # Output piped into a reader that stopped (| head): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EX_OK


def _dispatch(args: argparse.Namespace, command: List[str]) -> int:
    name = args.command_name
    if name is None:
        parser().print_help()
        return EX_USAGE
    if name == "status":
        data = fetchStatus(args.url)
        print(json.dumps(data, indent=2) if args.json else formatStatus(data))
        return EX_OK
    if name == "events":
        return eventsCommand(args)
    if name == "config":
        return configCommand(args)
    if name == "state":
        return stateCommand(args)
    if name == "release":
        if args.force:
            if args.token is not None:
                raise CommandError("release --force takes a KEY, not a token", EX_USAGE)
            return forceReleaseCommand(args)
        if args.token is None:
            raise CommandError("release needs KEY TOKEN (or --force KEY --reason TEXT)",
                               EX_USAGE)
    if name == "run":
        args.command = args.command + command
        if not args.command:
            raise CommandError("run needs a command after --", EX_USAGE)
    if name == "shell" and args.target:
        args.addr = args.target
    # Validate what can be validated before starting a reactor.
    _clusters(args)
    _tls(args)
    return _react({"acquire": acquireCommand, "release": releaseCommand,
                   "run": runCommand, "shell": shellCommand}[name], args)


def _installReactor(name: Optional[str]) -> None:
    if not name:
        return
    from twisted.application.reactors import NoSuchReactor, installReactor

    try:
        installReactor(name)
    except NoSuchReactor:
        raise CommandError(f"no such reactor: {name!r} (try asyncio, epoll, poll, select)",
                           EX_USAGE) from None


def _react(handler: Any, args: argparse.Namespace) -> int:
    _installReactor(args.reactor)
    from twisted.internet.defer import Deferred
    from twisted.internet.task import react

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


if __name__ == "__main__":
    sys.exit(main())
