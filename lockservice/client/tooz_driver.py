# -*- test-case-name: tests.test_client_tooz -*-
"""
A tooz driver (OpenStack's coordination layer), on the blocking client:

    coordinator = tooz.coordination.get_coordinator(
        "lockservice://10.0.0.1:7700,10.0.0.2:7700?lease=30", b"compute-7")
    coordinator.start()
    with coordinator.get_lock(b"instance/42") as lock:
        write(fence=lock.token)

Registered as C{lockservice} under tooz's C{tooz.backends} entry point
(C{pip install 'lockservice[tooz]'}).  URL options (query string, or
keyword arguments of C{get_coordinator}):

  - C{lease} (default 30 s): each grant's lease, renewed in the background
    every third of it (and by C{heartbeat()}).
  - C{name}: the connection name shown by the node (default: the member id).
  - C{admin} and C{admin_secret_file} (or C{admin_secret}): a node's HTTP
    endpoint (C{http://host:port}) and admin secret, for C{break_()}, which
    is then the fenced force-release.  Without them C{break_()} raises
    C{tooz.NotImplemented}.
  - C{ca}, C{cert}, C{key}: TLS (the CA that signed the nodes' certificates,
    and this client's certificate and key).

Locks are exclusive, or read locks with C{shared=True}.
C{acquire(blocking=False)} is a try (the smallest wait the protocol has,
C{0.000001} s: C{0} would wait forever); C{blocking=True} waits forever (or
C{timeout} seconds); a number waits that long.  Groups and leaders are not
offered (C{tooz.NotImplemented}).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import weakref
from typing import Any, Dict, List, Optional, Union

import tooz
from tooz import coordination, locking

from lockservice.client import sync
from lockservice.client.errors import LockRejected, LockTimeout, NoConnection, ReleaseFailed
from lockservice.tls import ClientTLS

TRY_WAIT = 0.000001
DEFAULT_LEASE = 30.0
START_TIMEOUT = 10.0
# stop() waits at most this long for the releases of the locks still held.
STOP_RELEASE_WAIT = 5.0


def _option(options: Dict[str, Any], name: str, default: Any = None) -> Any:
    value = options.get(name)
    if isinstance(value, list):
        value = value[-1] if value else None
    return default if value is None else value


class LockserviceLock(locking.Lock):
    """
    One lock name of a coordinator.  One object may hold several grants
    (two read locks, or an acquire from each of two threads in turn);
    C{release()} gives back the latest.

    @ivar token: the fencing token of the latest grant held, or None.
    """

    def __init__(self, name: bytes, driver: "LockserviceDriver") -> None:
        super().__init__(name)
        self._driver = driver
        self._grants: List[sync.Lock] = []
        self._guard = threading.Lock()

    @property
    def token(self) -> Optional[int]:
        with self._guard:
            return self._grants[-1].token if self._grants else None

    def _key(self) -> str:
        name = self.name
        return name.decode("utf-8") if isinstance(name, bytes) else str(name)

    def acquire(self, blocking: Union[bool, float] = True, shared: bool = False,
                timeout: Optional[float] = None) -> bool:
        if blocking is True:
            wait = float(timeout) if timeout else 0.0   # 0: no limit
        elif blocking is False or not blocking:
            wait = TRY_WAIT
        else:
            wait = float(blocking)
        client = self._driver._connected()
        try:
            grant = client.acquire(self._key(), self._driver.lease, wait,
                                   share="r" if shared else None, keepAlive=True)
        except LockTimeout:
            return False
        except NoConnection as e:
            raise coordination.ToozConnectionError(str(e)) from e
        except LockRejected as e:
            raise tooz.ToozError(f"lockservice refused the acquire: {e.message}") from e
        with self._guard:
            self._grants.append(grant)
        return True

    def _takeAll(self) -> List[sync.Lock]:
        with self._guard:
            grants, self._grants = self._grants, []
        return grants

    def release(self) -> bool:
        with self._guard:
            if not self._grants:
                return False
            grant = self._grants.pop()
        try:
            return grant.release()
        except ReleaseFailed:
            return False

    def heartbeat(self) -> bool:
        """
        Renew every grant held now; True if at least one is still held.
        """
        with self._guard:
            grants = list(self._grants)
        if not grants:
            return False
        renewed = False
        for grant in grants:
            try:
                renewed = grant.renew() or renewed
            except Exception:
                pass
        return renewed

    def is_still_owner(self) -> bool:
        with self._guard:
            grants = list(self._grants)
        return any(not grant.lost.is_set() for grant in grants) and self.heartbeat()

    def break_(self) -> bool:
        admin = self._driver.admin
        if admin is None:
            raise tooz.NotImplemented(
                "break_() needs the node's admin HTTP endpoint and secret "
                "(admin=http://host:port&admin_secret_file=PATH)")
        url, secret = admin
        key = urllib.parse.quote(self._key(), safe="")
        request = urllib.request.Request(
            f"{url}/locks/release?key={key}", method="POST",
            data=b"reason=tooz+break_", headers={"Authorization": f"Bearer {secret}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                json.loads(response.read())
                return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise tooz.ToozError(f"force-release refused: HTTP {e.code} "
                                 f"{e.read().decode('utf-8', 'replace')}") from e
        except OSError as e:
            raise coordination.ToozConnectionError(f"force-release: {e}") from e


class LockserviceDriver(coordination.CoordinationDriver):
    """
    C{lockservice://host:port[,host:port...][?lease=30&name=...]}
    """

    CHARACTERISTICS = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: Dict[str, Any]) -> None:
        super().__init__(member_id, parsed_url, options)
        self.addresses = parsed_url.netloc
        if not self.addresses:
            raise ValueError("lockservice:// needs host:port[,host:port...]")
        self.lease = float(_option(options, "lease", DEFAULT_LEASE))
        memberName = member_id.decode("utf-8", "replace") if isinstance(
            member_id, bytes) else str(member_id)
        self.name = str(_option(options, "name", memberName))
        self.admin: Optional[tuple] = None
        url = _option(options, "admin")
        secret = _option(options, "admin_secret")
        secretFile = _option(options, "admin_secret_file")
        if secretFile:
            with open(secretFile) as f:
                secret = f.read().strip()
        if url and secret:
            self.admin = (url.rstrip("/"), secret)
        ca = _option(options, "ca")
        self.tls = ClientTLS.fromFiles(ca, cert=_option(options, "cert"),
                                       key=_option(options, "key")) if ca else None
        self._client: Optional[sync.Client] = None
        self._locks: "weakref.WeakSet[LockserviceLock]" = weakref.WeakSet()

    def _connected(self) -> sync.Client:
        if self._client is None:
            raise tooz.ToozError("the coordinator is not started")
        return self._client

    def _start(self) -> None:
        try:
            client = sync.connect(self.addresses, name=_safeName(self.name), tls=self.tls)
        except ValueError as e:
            raise coordination.ToozConnectionError(str(e)) from e
        try:
            client.whenConnected(START_TIMEOUT, failFast=True)
        except NoConnection as e:
            client.close()
            raise coordination.ToozConnectionError(str(e)) from e
        self._client = client

    def _stop(self) -> None:
        """
        Give back every lock this coordinator holds (at once, all together,
        within L{STOP_RELEASE_WAIT}), then close: a stopped member's locks
        are free for the others now, not when their leases run out.
        """
        client, self._client = self._client, None
        if client is None:
            return
        grants = [grant for lock in list(self._locks) for grant in lock._takeAll()]
        if grants:
            client.releaseAll(grants, STOP_RELEASE_WAIT)
        client.close()

    # Groups and leaders are not offered: tooz's suite skips these tests.
    def watch_join_group(self, group_id: bytes, callback: Any) -> None:
        raise tooz.NotImplemented("lockservice offers locks, not groups")

    def watch_leave_group(self, group_id: bytes, callback: Any) -> None:
        raise tooz.NotImplemented("lockservice offers locks, not groups")

    def watch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        raise tooz.NotImplemented("lockservice offers locks, not leaders")

    def get_lock(self, name: bytes) -> LockserviceLock:
        lock = LockserviceLock(name, self)
        self._locks.add(lock)
        return lock

    def heartbeat(self) -> float:
        """
        Renew every grant held through this coordinator now.  (Locks also
        renew themselves every third of the lease, so a program that never
        beats keeps them.)  Seconds until the next beat.
        """
        for lock in list(self._locks):
            if lock.token is not None:
                lock.heartbeat()
        return self.lease / 3


def _safeName(name: str) -> Optional[str]:
    """
    A member id as a connection name: the key grammar (no spaces or
    control characters, at most 237 bytes), or no name.
    """
    cleaned = "".join(c if c.isprintable() and not c.isspace() else "_" for c in name)
    raw = cleaned.encode("utf-8")[:237]
    return raw.decode("utf-8", "ignore") or None
