# -*- test-case-name: tests.client.test_client_tooz -*-
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
C{timeout} seconds); a number waits that long.  Giving up on an acquire
(Ctrl+C, a timeout) withdraws it from the node's queue.

Groups are the node's group extension: a member stays in a group for the
C{timeout} option (default 30 s), renewed by C{heartbeat()} (tooz's
heart, or the program's own calls); watchers poll the members at
C{run_watchers()}.  Leaders are the election recipe: C{run_watchers()}
tries (without waiting) to lead every group watched with
C{watch_elected_as_leader}, on a connection named by the member id.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import weakref
from typing import Any, Dict, List, Optional, Set, Union

import tooz
from tooz import coordination, locking, utils

from lockservice.client import sync
from lockservice.client.errors import LockRejected, LockTimeout, NoConnection, ReleaseFailed
from lockservice.client.groups import MemberInfo
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


class LockserviceDriver(coordination.CoordinationDriverCachedRunWatchers):
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
        # A member's lease in its groups (tooz's `timeout` option), renewed
        # by heartbeat().
        self.timeout = float(_option(options, "timeout", DEFAULT_LEASE))
        self._memberId = _bytes(member_id)
        self._memberText = self._memberId.decode("utf-8", "replace")
        self._client: Optional[sync.Client] = None
        self._locks: "weakref.WeakSet[LockserviceLock]" = weakref.WeakSet()
        # The groups this member leads: group -> its leadership.
        self._leading: Dict[bytes, sync.Leadership] = {}

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
        leading, self._leading = self._leading, {}
        grants.extend(leadership.lock for leadership in leading.values())
        if grants:
            client.releaseAll(grants, STOP_RELEASE_WAIT)
        client.close()

    # -- groups (the node's group extension) -----------------------------------

    def _ask(self, method: str, *args: Any) -> Any:
        try:
            return self._connected().groups(method, *args)
        except NoConnection as e:
            raise coordination.ToozConnectionError(str(e)) from e
        except LockRejected as e:
            raise tooz.ToozError(f"lockservice refused it: {e.message}") from e

    def create_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def create() -> None:
            if self._ask("create", _bytes(group_id)) == "EXISTS":
                raise coordination.GroupAlreadyExist(group_id)

        return _result(create)

    def get_groups(self) -> coordination.CoordAsyncResult[List[bytes]]:
        return _result(lambda: list(self._ask("list")))

    def join_group(self, group_id: bytes,
                   capabilities: Any = b"") -> coordination.CoordAsyncResult[None]:
        def join() -> None:
            outcome = self._ask("join", _bytes(group_id), self._memberId, self.timeout,
                                _dumps(capabilities))
            if outcome == "NONE":
                raise coordination.GroupNotCreated(group_id)
            if outcome == "EXISTS":
                raise coordination.MemberAlreadyExist(group_id, self._member_id)
            self._joined_groups.add(group_id)

        return _result(join)

    def leave_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def leave() -> None:
            outcome = self._ask("leave", _bytes(group_id), self._memberId)
            if outcome == "NONE":
                raise coordination.GroupNotCreated(group_id)
            if outcome == "NOTJOINED":
                raise coordination.MemberNotJoined(group_id, self._member_id)
            self._joined_groups.discard(group_id)

        return _result(leave)

    def delete_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def delete() -> None:
            outcome = self._ask("delete", _bytes(group_id))
            if outcome == "NONE":
                raise coordination.GroupNotCreated(group_id)
            if outcome == "NOTEMPTY":
                raise coordination.GroupNotEmpty(group_id)

        return _result(delete)

    def get_members(self, group_id: bytes) -> coordination.CoordAsyncResult[Set[bytes]]:
        def members() -> Set[bytes]:
            found = self._ask("members", _bytes(group_id))
            if found is None:
                raise coordination.GroupNotCreated(group_id)
            return set(found)

        return _result(members)

    def _info(self, group_id: bytes, member_id: Any) -> MemberInfo:
        found = self._ask("info", _bytes(group_id), _bytes(member_id))
        if found == "NONE":
            raise coordination.GroupNotCreated(group_id)
        if found == "NOTJOINED":
            raise coordination.MemberNotJoined(group_id, member_id)
        return found  # type: ignore[no-any-return]

    def get_member_capabilities(self, group_id: bytes,
                                member_id: bytes) -> coordination.CoordAsyncResult[Any]:
        return _result(lambda: _loads(self._info(group_id, member_id).capabilities))

    def get_members_with_capabilities(
            self, group_id: bytes) -> coordination.CoordAsyncResult[Dict[bytes, Any]]:
        def both() -> Dict[bytes, Any]:
            found = self._ask("members", _bytes(group_id))
            if found is None:
                raise coordination.GroupNotCreated(group_id)
            out: Dict[bytes, Any] = {}
            for member in found:
                info = self._ask("info", _bytes(group_id), member)
                if isinstance(info, MemberInfo):  # (else it left meanwhile)
                    out[member] = _loads(info.capabilities)
            return out

        return _result(both)

    def get_member_info(self, group_id: bytes,
                        member_id: bytes) -> coordination.CoordAsyncResult[Dict[str, Any]]:
        def info() -> Dict[str, Any]:
            found = self._info(group_id, member_id)
            return {
                "capabilities": _loads(found.capabilities),
                "created_at": datetime.datetime.fromtimestamp(found.joinedAt,
                                                              datetime.timezone.utc),
                "updated_at": datetime.datetime.fromtimestamp(found.updatedAt,
                                                              datetime.timezone.utc),
            }

        return _result(info)

    def update_capabilities(self, group_id: bytes,
                            capabilities: Any) -> coordination.CoordAsyncResult[None]:
        def update() -> None:
            outcome = self._ask("update", _bytes(group_id), self._memberId,
                                _dumps(capabilities))
            if outcome == "NONE":
                raise coordination.GroupNotCreated(group_id)
            if outcome == "NOTJOINED":
                raise coordination.MemberNotJoined(group_id, self._member_id)

        return _result(update)

    def watch_join_group(self, group_id: bytes, callback: Any) -> None:
        self._mustExist(group_id)
        super().watch_join_group(group_id, callback)

    def watch_leave_group(self, group_id: bytes, callback: Any) -> None:
        self._mustExist(group_id)
        super().watch_leave_group(group_id, callback)

    def _mustExist(self, group_id: bytes) -> None:
        if self._ask("members", _bytes(group_id)) is None:
            raise coordination.GroupNotCreated(group_id)

    # -- leaders (the election recipe) ---------------------------------------------

    def _election(self, group_id: bytes) -> bytes:
        return b"tooz-leader/" + _bytes(group_id)

    def run_elect_coordinator(self) -> List[Any]:  # type: ignore[override]
        """
        Try (without waiting) to lead every group with an elected-leader
        watch; the watches of a group this member now leads are run.
        """
        results: List[Any] = []
        for group_id, hooks in list(self._hooks_elected_leader.items()):
            leading = self._leading.get(group_id)
            if leading is not None and not leading.lost.is_set():
                continue
            try:
                leading = self._connected().campaign(self._election(group_id), self._memberText,
                                                     self.lease, TRY_WAIT)
            except LockTimeout:
                continue
            except NoConnection as e:
                raise coordination.ToozConnectionError(str(e)) from e
            self._leading[group_id] = leading
            results.extend(hooks.run(coordination.LeaderElected(group_id, self._member_id)))
        return results

    def run_watchers(self, timeout: Optional[float] = None) -> List[Any]:
        results = super().run_watchers(timeout)
        results.extend(self.run_elect_coordinator())
        return results

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        leading = self._leading.pop(group_id, None)
        if leading is None:
            return False
        try:
            return bool(leading.resign())
        except ReleaseFailed:
            return False

    def get_leader(  # type: ignore[override]
            self, group_id: bytes) -> coordination.CoordAsyncResult[Optional[bytes]]:
        def leader() -> Optional[bytes]:
            who = self._connected().leader(self._election(group_id))
            return None if who is None or who.value is None else who.value.encode("utf-8")

        return _result(leader)

    def get_lock(self, name: bytes) -> LockserviceLock:
        lock = LockserviceLock(name, self)
        self._locks.add(lock)
        return lock

    def heartbeat(self) -> float:
        """
        Renew this member in every group it joined (a member that stops
        beating leaves its groups when the `timeout` runs out), and every
        grant held through this coordinator (locks and leaderships also
        renew themselves every third of their lease).  Seconds until the
        next beat.
        """
        for group_id in list(self._joined_groups):
            try:
                if self._ask("beat", _bytes(group_id), self._memberId,
                             self.timeout) != "OK":
                    self._joined_groups.discard(group_id)
            except tooz.ToozError:
                pass
        for lock in list(self._locks):
            if lock.token is not None:
                lock.heartbeat()
        return min(self.lease, self.timeout) / 3


def _dumps(capabilities: Any) -> bytes:
    """
    A member's capabilities as its blob (msgpack, as tooz's drivers store
    them); none (tooz's default, C{b""}) as an empty blob.
    """
    return b"" if capabilities == b"" else utils.dumps(capabilities)


def _loads(blob: bytes) -> Any:
    return utils.loads(blob) if blob else None


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _result(work: Any) -> coordination.CoordinatorResult[Any]:
    """
    C{work()} run now, as the done result tooz's API returns (its error
    raised by C{get()}).
    """
    future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
    try:
        future.set_result(work())
    except Exception as e:
        future.set_exception(e)
    return coordination.CoordinatorResult(future)


def _safeName(name: str) -> Optional[str]:
    """
    A member id as a connection name: the key grammar (no spaces or
    control characters, at most 237 bytes), or no name.
    """
    cleaned = "".join(c if c.isprintable() and not c.isspace() else "_" for c in name)
    raw = cleaned.encode("utf-8")[:237]
    return raw.decode("utf-8", "ignore") or None
