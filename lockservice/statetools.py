# -*- test-case-name: tests.cli.test_state_tools -*-
"""
C{lockservice state inspect|backup|restore}: the operator's tools for a
node's C{--state-dir} (see L{lockservice.state} for what it holds).

  - C{inspect DIR}: what the directory holds, as of now (the remaining
    leases are computed as the node would at a start now).
  - C{backup DIR FILE}: a copy of the state file that can be restored.
    Safe while the node runs: the node replaces the file atomically (a
    rename), so a read sees one whole version; the copy is checked
    (checksum, format) before it is written, itself atomically.
  - C{restore FILE DIR}: put a backup in place for the next start.  It
    refuses the directory of a running node (the node holds C{DIR/lock}
    with C{flock}; the restore takes that same lock while it writes, so a
    node cannot start half-way through), a corrupt file (checksum) and a
    file of another format.

The files are read and checked with L{lockservice.state.decode}, and
written byte for byte: a restored file is the backup itself.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from lockservice.state import (
    FILENAME,
    FORMAT,
    LOCKNAME,
    OLD_FORMAT,
    State,
    StateError,
    bootClock,
    decode,
    downtime,
)

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2


class ToolError(Exception):
    """
    The tool cannot do what it was asked; the message is one line.
    """

    def __init__(self, message: str, status: int = EX_FAILED) -> None:
        super().__init__(message)
        self.status = status


def checksumOK(data: bytes) -> bool:
    """
    Whether C{data} ends with the SHA-256 of everything before it.
    """
    end = data.rfind(b"sha256 ")
    if end < 0 or not data.endswith(b"\n"):
        return False
    return hashlib.sha256(data[:end]).hexdigest().encode() == data[end + 7:-1]


def formatOf(data: bytes) -> Optional[int]:
    """
    The format version of a state file (1 or 2), or None if it is not one
    this version reads.
    """
    if data.startswith(FORMAT + b"\n"):
        return 2
    if data.startswith(OLD_FORMAT + b"\n"):
        return 1
    return None


def check(data: bytes, what: str, cluster: Optional[str] = None,
          node: Optional[str] = None) -> State:
    """
    The state in C{data}, checked as a node checks it at start.

    @raise ToolError: it would be refused (corrupt, another format, ...).
    """
    try:
        return decode(data, cluster, node)
    except StateError as e:
        raise ToolError(f"{what}: {e}") from None


def running(directory: str) -> bool:
    """
    Whether a node runs on C{directory} now (it holds C{DIR/lock}).
    """
    import fcntl

    try:
        fd = os.open(os.path.join(directory, LOCKNAME), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ToolError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ToolError(f"cannot read {what} {path}: {e.strerror}") from None


def _stateFile(directory: str) -> str:
    if not os.path.isdir(directory):
        raise ToolError(f"{directory} is not a directory", EX_USAGE)
    path = os.path.join(directory, FILENAME)
    if not os.path.exists(path):
        raise ToolError(f"{directory} holds no state file (no node has run with "
                        f"--state-dir {directory})")
    return path


def isoMicros(micros: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(micros / 1e6)) + (
        f".{micros % 1_000_000:06d}Z")


def remaining(state: State, wallNow: int,
              boot: Optional[Tuple[str, int]]) -> List[Optional[float]]:
    """
    Seconds left of each saved lease if the node started now (None: it
    ran out), as L{lockservice.state.NodeState.start} computes them.
    """
    down = downtime(state.saved, state.boot, wallNow, boot)
    left: List[Optional[float]] = []
    for lock in state.locks:
        if down is None:
            left.append(None)
            continue
        seconds = (min(lock.deadline - state.saved, lock.deadline - lock.granted) - down) / 1e6
        left.append(round(seconds, 3) if seconds > 0 else None)
    return left


def _text(raw: Optional[bytes]) -> Optional[str]:
    return None if raw is None else raw.decode("utf-8", "replace")


def inspect(directory: str, wallNow: Optional[int] = None,
            boot: Optional[Tuple[str, int]] = None) -> Dict[str, Any]:
    """
    What C{directory} holds, as plain data.

    @raise ToolError: there is no state file, or it cannot be read.
    """
    path = _stateFile(directory)
    data = _read(path, "state file")
    info: Dict[str, Any] = {
        "directory": os.path.abspath(directory),
        "file": os.path.abspath(path),
        "bytes": len(data),
        "running": running(directory),
        "format": formatOf(data),
        "checksum": "ok" if checksumOK(data) else "mismatch",
    }
    try:
        state = decode(data, None, None)
    except StateError as e:
        info["error"] = str(e)
        return info
    if wallNow is None:
        wallNow = time.time_ns() // 1000
    if boot is None:
        boot = bootClock()
    left = remaining(state, wallNow, boot)
    info.update({
        "error": None,
        "cluster": state.cluster,
        "node": state.node or None,
        "token_mark": state.mark,
        "term": state.term,
        "saved": isoMicros(state.saved) if state.saved else None,
        "locks": [{
            "key": _text(lock.key),
            "token": lock.token,
            "share": lock.share.decode("ascii", "replace"),
            "holder": _text(lock.holder),
            "lock_delay": lock.delayed,
            "granted": isoMicros(lock.granted),
            "deadline": isoMicros(lock.deadline),
            "remaining_seconds": seconds,
        } for lock, seconds in zip(state.locks, left, strict=True)],
    })
    groups = getattr(state, "groups", None)
    if groups is not None:
        info["groups"] = len(groups)
    return info


def formatInspection(info: Dict[str, Any]) -> str:
    """
    L{inspect}'s answer for a person.
    """
    lines = [
        f"state dir    {info['directory']} ("
        + ("in use by a running node" if info["running"] else "no node runs on it") + ")",
        f"file         {info['file']} ({info['bytes']} bytes)",
        f"format       {info['format'] if info['format'] is not None else 'unknown'}",
        f"checksum     {info['checksum']}",
    ]
    if info.get("error"):
        lines.append(f"refused      {info['error']} (a node would not start with it)")
        return "\n".join(lines)
    lines += [
        f"cluster      {info['cluster']} (a hash of the secret and the peer list)",
        f"node         {info['node'] or '- (a lone node)'}",
        f"token mark   {info['token_mark']} (tokens after a restart start above it)",
        f"term         {info['term']}",
        f"saved        {info['saved'] or '- (no held locks saved)'}",
        f"saved locks  {len(info['locks'])}",
    ]
    if "groups" in info:
        lines.append(f"groups       {info['groups']} group and member records")
    if info["locks"]:
        lines.append("")
        lines.append(f"{'KEY':30} {'TOKEN':>18} {'SHARE':5} {'DELAY':5} {'REMAINING':>10} HOLDER")
        for lock in info["locks"]:
            left = lock["remaining_seconds"]
            lines.append(
                f"{lock['key']:30} {lock['token']:>18} {lock['share']:5} "
                f"{'yes' if lock['lock_delay'] else 'no':5} "
                f"{(f'{left:.1f} s' if left is not None else 'ran out'):>10} "
                f"{lock['holder'] or '-'}")
    return "\n".join(lines)


def _writeAtomically(path: str, data: bytes, owner: Optional[Tuple[int, int]] = None) -> None:
    """
    Replace C{path} with C{data}: a temporary file beside it, fsync,
    rename, fsync of the directory (so a crash leaves the old file or the
    new one).
    """
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if owner is not None:
                os.fchown(fd, *owner)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    dirfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def backup(directory: str, target: str) -> Dict[str, Any]:
    """
    Copy C{directory}'s state file to C{target}, checked.

    @raise ToolError: no state file, it does not check, or C{target}
        cannot be written.
    """
    path = _stateFile(directory)
    # The node renames a complete new file over the old one: a read gets
    # one whole version.  Should it ever not check, read again (a file
    # mangled on disk fails every time, and is refused).
    for _attempt in range(3):
        data = _read(path, "state file")
        if checksumOK(data):
            break
        time.sleep(0.05)
    state = check(data, f"state file {path}")
    if os.path.isdir(target):
        raise ToolError(f"{target} is a directory: give the backup file's name", EX_USAGE)
    try:
        _writeAtomically(target, data)
    except OSError as e:
        raise ToolError(f"cannot write {target}: {e.strerror}") from None
    return {"file": os.path.abspath(target), "bytes": len(data), "node": state.node or None,
            "token_mark": state.mark, "saved_locks": len(state.locks)}


def restore(source: str, directory: str, force: bool = False,
            identity: Optional[Tuple[str, str]] = None) -> Dict[str, Any]:
    """
    Put backup C{source} in C{directory} for the node's next start.

    @param force: replace a state file already there.
    @param identity: C{(cluster, node)} the file must belong to (else any).
    @raise ToolError: the backup is refused, a node runs on C{directory},
        or a state file is there and C{force} is not given.
    """
    import fcntl

    data = _read(source, "backup")
    if formatOf(data) is None:
        first = data.split(b"\n", 1)[0][:40]
        raise ToolError(f"backup {source} is not a state file of a format this version "
                        f"reads (it starts {first!r})")
    if not checksumOK(data):
        raise ToolError(f"backup {source}: checksum mismatch (corrupt or truncated)")
    cluster, node = identity if identity is not None else (None, None)
    state = check(data, f"backup {source}", cluster, node)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ToolError(f"cannot make {directory}: {e.strerror}") from None
    info = os.stat(directory)
    # The node may run as another user (root restores for it): the files
    # made here are the directory owner's.
    owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
    lockPath = os.path.join(directory, LOCKNAME)
    try:
        fd = os.open(lockPath, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise ToolError(f"cannot open {lockPath}: {e.strerror}") from None
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ToolError(f"{directory} is in use by a running node: stop it first") from None
        target = os.path.join(directory, FILENAME)
        if os.path.exists(target) and not force:
            raise ToolError(f"{directory} already holds a state file: give --force to "
                            f"replace it", EX_USAGE)
        try:
            _writeAtomically(target, data, owner)
        except OSError as e:
            raise ToolError(f"cannot write {target}: {e.strerror}") from None
    finally:
        os.close(fd)  # (and the lock with it)
    return {"file": os.path.abspath(target), "node": state.node or None,
            "token_mark": state.mark, "saved_locks": len(state.locks)}


def adopt(directory: str, cluster: str, node: str) -> Dict[str, Any]:
    """
    Make C{directory}'s state file belong to C{cluster} and C{node} (after
    the secret or the peer list changed, which changes the cluster's
    identity): the same state, rewritten for its new owner.

    @raise ToolError: no state file, it does not check, or a node runs on
        C{directory}.
    """
    import fcntl

    from lockservice.state import encode

    path = _stateFile(directory)
    lockPath = os.path.join(directory, LOCKNAME)
    try:
        fd = os.open(lockPath, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise ToolError(f"cannot open {lockPath}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ToolError(f"{directory} is in use by a running node: stop it first") from None
        state = check(_read(path, "state file"), f"state file {path}")
        before = (state.cluster, state.node)
        state.cluster, state.node = cluster, node
        info = os.stat(path)
        owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
        try:
            _writeAtomically(path, encode(state), owner)
        except OSError as e:
            raise ToolError(f"cannot write {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    return {"file": os.path.abspath(path), "changed": before != (cluster, node),
            "node": node or None, "token_mark": state.mark, "saved_locks": len(state.locks)}
