# -*- test-case-name: tests.cluster.test_partition -*-
"""
Real network faults between real nodes: each node in its own network
namespace, all on one bridge, with iptables rules inside a node's
namespace to cut or reset its links.

    root namespace (tests, clients)      10.213.N.1  bridge lsbrN
      |-- veth -- namespace lsN-0        10.213.N.2  node 0
      |-- veth -- namespace lsN-1        10.213.N.3  node 1
      ...

Traffic stays on addresses inside namespaces this lab made (and the
bridge's own address); everything is removed on L{Lab.close}, and by
L{Lab.open} itself when it fails halfway.  N is unique per live lab on the
host (a lock file under /run/lockservice-netns), so concurrent runs do not
collide; a failed C{ip}/C{iptables} command raises L{NetnsError} with the
tool's stderr.  Needs root,
C{ip} and C{iptables}; L{unavailable} says why not when they are missing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import subprocess
import tempfile
from typing import IO, List, Optional, Sequence, Tuple

from lockservice.testing.harness import Cluster, Node, freePort

#: Lab ids: the third octet of the lab's subnet 10.213.ID.0/24.
LAB_IDS = range(1, 255)


class NetnsError(RuntimeError):
    """
    An C{ip} or C{iptables} command of the lab failed; the message has the
    command, its exit status and its stderr.
    """


def unavailable() -> Optional[str]:
    """
    None when network namespaces and iptables can be used here, else why not.
    """
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2/iptables)"
    name = f"lsprobe{os.getpid()}-{random.randrange(16**6):06x}"
    try:
        _run(["ip", "netns", "add", name])
        try:
            _run(["ip", "netns", "exec", name, "iptables", "-L", "-n"])
        finally:
            _run(["ip", "netns", "del", name], check=False)
    except (OSError, NetnsError) as e:
        return f"cannot use a network namespace with iptables: {e}"
    return None


def _run(cmd: Sequence[str], check: bool = True) -> bool:
    """
    Run C{cmd}; True if it succeeded.  With C{check}, a failure raises
    L{NetnsError} with the tool's own stderr (what went wrong is there).
    """
    done = subprocess.run(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=30)
    if done.returncode != 0 and check:
        why = done.stderr.decode("utf-8", "replace").strip() or "(nothing on stderr)"
        raise NetnsError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {why}")
    return done.returncode == 0


def _lockDirectory() -> str:
    path = "/run/lockservice-netns" if os.path.isdir("/run") else os.path.join(
        tempfile.gettempdir(), "lockservice-netns")
    os.makedirs(path, exist_ok=True)
    return path


def _reserve(wanted: Optional[int]) -> Tuple[int, IO[bytes]]:
    """
    A lab id no other live lab on this host holds, and the open lock file
    that holds it (an C{flock}: the kernel drops it when its process dies,
    so a crashed run's id is free again, and its leftovers are swept).
    """
    directory = _lockDirectory()
    if wanted is not None:
        candidates = [wanted]
    else:
        candidates = list(LAB_IDS)
        random.shuffle(candidates)
    for lab in candidates:
        f = open(os.path.join(directory, f"lab-{lab}.lock"), "wb")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        return lab, f
    raise NetnsError(f"lab id {wanted} is in use by another run" if wanted is not None
                     else f"all {len(LAB_IDS)} lab ids are in use by other runs")


class Lab:
    """
    A bridge and C{size} namespaces, one per node.

    Each lab holds an id of its own on this host (see L{_reserve}), so
    concurrent runs never share names or a subnet.  If L{open} fails
    halfway, it removes what it made before it raises.
    """

    def __init__(self, size: int, lab: Optional[int] = None) -> None:
        if not 1 <= size <= 250:
            raise ValueError(f"a lab has 1-250 nodes, not {size}")
        self.size = size
        self._wanted = lab
        self._lock: Optional[IO[bytes]] = None
        self._setId(*_reserve(lab))

    def _setId(self, lab: int, lock: IO[bytes]) -> None:
        self.id = lab
        self._lock = lock
        self.bridge = f"lsbr{self.id}"
        self.subnet = f"10.213.{self.id}"
        self.hub = f"{self.subnet}.1"
        self.namespaces = [f"ls{self.id}-{i}" for i in range(self.size)]
        self.veths = [f"lsv{self.id}x{i}" for i in range(self.size)]

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 2}"

    def _forwardRule(self, action: str) -> List[str]:
        return ["iptables", action, "FORWARD", "-i", self.bridge, "-o", self.bridge,
                "-j", "ACCEPT"]

    def open(self) -> "Lab":
        if self._lock is None:  # closed before: take an id again
            self._setId(*_reserve(self._wanted))
        self._sweep()  # what a crashed run with this id left behind
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.hub}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            # Where bridged frames pass the host's iptables (br_netfilter), a
            # FORWARD policy of DROP would cut the nodes off from each other.
            _run(self._forwardRule("-I"))
            for i, ns in enumerate(self.namespaces):
                outer, inner = self.veths[i], f"lsv{self.id}y{i}"
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
                _run(["ip", "link", "set", inner, "netns", ns])
                _run(["ip", "link", "set", outer, "master", self.bridge])
                _run(["ip", "link", "set", outer, "up"])
                _run(["ip", "netns", "exec", ns, "ip", "addr", "add",
                      f"{self.address(i)}/24", "dev", inner])
                _run(["ip", "netns", "exec", ns, "ip", "link", "set", inner, "up"])
                _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def _sweep(self) -> None:
        """
        Remove everything named after this lab's id; each step may find
        nothing to remove.  (A veth still in the root namespace is not
        removed with a namespace, hence the explicit deletes.)
        """
        for ns in self.namespaces:
            _run(["ip", "netns", "del", ns], check=False)
        for veth in self.veths:
            _run(["ip", "link", "del", veth], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        # One rule per open, but a crashed run may have left one too.
        for _ in range(10):
            if not _run(self._forwardRule("-D"), check=False):
                break

    def close(self) -> None:
        """
        Remove the namespaces, veths, bridge and iptables rule, and give
        the lab's id back.
        """
        if self._lock is None:
            return
        try:
            self._sweep()
        finally:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "Lab":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- nodes --------------------------------------------------------------

    def nodes(self, port: int, logDir: str, args: Sequence[str] = ()) -> List[Node]:
        """
        One node per namespace, all on C{port}, in priority order.
        """
        addresses = [f"{self.address(i)}:{port}" for i in range(self.size)]
        made = []
        for i in range(self.size):
            node = Node(port, peers=[port] * self.size, args=args, logDir=logDir,
                        name=f"node{i}")
            node.host = self.address(i)
            node.address = addresses[i]
            node.peerAddresses = addresses
            node.prefix = ["ip", "netns", "exec", self.namespaces[i]]
            made.append(node)
        return made

    # -- faults -------------------------------------------------------------

    def _iptables(self, i: int, *rule: str) -> None:
        _run(["ip", "netns", "exec", self.namespaces[i], "iptables", *rule])

    def cutPeers(self, i: int, target: str = "DROP", inbound: bool = True,
                 outbound: bool = True, bothEnds: bool = False) -> None:
        """
        Cut node C{i}'s links to the other nodes (clients, on the bridge's
        own address, still reach it).  C{target} C{"RESET"} answers with
        TCP resets instead of dropping; C{bothEnds} puts the rules in the
        other nodes' namespaces too, so both ends of each link see resets.
        """
        jump = ["REJECT", "--reject-with", "tcp-reset"] if target == "RESET" else ["DROP"]
        # Resets themselves pass (REJECT would silently drop them), so the
        # far end of each link does see the RST.
        proto = ["-p", "tcp", "!", "--tcp-flags", "RST", "RST"] if target == "RESET" else []
        others = f"{self.subnet}.0/24"
        if bothEnds:
            for k in range(self.size):
                if k != i:
                    self._iptables(k, "-A", "INPUT", *proto, "-s", self.address(i), "-j", *jump)
                    self._iptables(k, "-A", "OUTPUT", *proto, "-d", self.address(i), "-j", *jump)
        if inbound:
            self._iptables(i, "-A", "INPUT", "-s", self.hub, "-j", "ACCEPT")
            self._iptables(i, "-A", "INPUT", *proto, "-s", others, "-j", *jump)
        if outbound:
            self._iptables(i, "-A", "OUTPUT", "-d", self.hub, "-j", "ACCEPT")
            self._iptables(i, "-A", "OUTPUT", *proto, "-d", others, "-j", *jump)

    def dropOneWay(self, i: int, j: int) -> None:
        """
        Drop what node C{i} sends to node C{j} (one way: C{j} still reaches
        C{i}, and the clients reach both).
        """
        self._iptables(i, "-A", "OUTPUT", "-d", self.address(j), "-j", "DROP")

    def cutClients(self, i: int) -> None:
        """
        Cut node C{i} off from the clients (the root namespace) only.
        """
        self._iptables(i, "-I", "INPUT", "-s", self.hub, "-j", "DROP")
        self._iptables(i, "-I", "OUTPUT", "-d", self.hub, "-j", "DROP")

    def heal(self, i: Optional[int] = None) -> None:
        for k in range(self.size) if i is None else [i]:
            self._iptables(k, "-F", "INPUT")
            self._iptables(k, "-F", "OUTPUT")


class LabCluster(Cluster):
    """
    A L{lockservice.testing.harness.Cluster} with one node per namespace of
    C{lab} (starting a node inside a namespace takes longer: 30 s to be
    ready).
    """

    readyTimeout = 30.0

    def __init__(self, lab: Lab, logDir: str, args: Sequence[str] = ()) -> None:
        self.lab = lab
        self.logDir = logDir
        self.nodes = lab.nodes(freePort(), logDir, args)
