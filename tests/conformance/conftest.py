"""
The conformance suite: real lockservice nodes, every official client driven
through its conformance driver (docs/protocol.md, "Conformance driver").

Which drivers run: C{LOCKSERVICE_DRIVERS}, a comma list of C{python,go,js}
(default all three).  C{LOCKSERVICE_GO_DRIVER} / C{LOCKSERVICE_JS_DRIVER}
may name prebuilt drivers (the Go binary; the JS C{driver.js});
C{LOCKSERVICE_PYTHON_DRIVER} may name a command line for the Python one.
Otherwise each driver is built once (cached by a hash of its sources, so
pytest-xdist workers share one build).  A driver that cannot be built is a
test failure, never a skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest

from lockservice.testing.harness import LineClient, Node, freePort, freePorts

from .driver import DriverProcess
from .proxy import LineProxy

REPO = Path(__file__).resolve().parents[2]
GO_DIR = REPO / "clients" / "go"
JS_DIR = REPO / "clients" / "js"
ALL_DRIVERS = ("python", "go", "js")
ADMIN_SECRET = "conformance-admin-secret-0123456789"
BUILD_ROOT = Path(tempfile.gettempdir()) / f"lockservice-conformance-{os.getuid()}"


def selected_drivers() -> List[str]:
    raw = os.environ.get("LOCKSERVICE_DRIVERS", "").strip()
    if not raw:
        return list(ALL_DRIVERS)
    kinds = [k.strip() for k in raw.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL_DRIVERS]
    if unknown:
        raise pytest.UsageError(f"LOCKSERVICE_DRIVERS: unknown driver(s) {unknown}; "
                                f"choose from {','.join(ALL_DRIVERS)}")
    return kinds


# -- markers ------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: the client conformance suite "
                            "(tests/conformance)")
    config.addinivalue_line("markers", "cluster: conformance tests on a 3-node cluster")
    config.addinivalue_line("markers", "faults: conformance tests that cut, stall or "
                            "pause connections and nodes")
    config.addinivalue_line("markers", "tls: conformance tests over TLS and mutual TLS")


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.conformance)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kind" in metafunc.fixturenames:
        metafunc.parametrize("kind", selected_drivers())


# -- building the drivers ---------------------------------------------------------

_commands: Dict[str, List[str]] = {}


def _digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class _BuildLock:
    def __init__(self, name: str) -> None:
        BUILD_ROOT.mkdir(parents=True, exist_ok=True)
        self.path = BUILD_ROOT / f"{name}.lock"

    def __enter__(self) -> "_BuildLock":
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _run(argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None,
         timeout: float = 300) -> None:
    try:
        done = subprocess.run(list(argv), cwd=str(cwd), env=env, capture_output=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{' '.join(argv)} (in {cwd}): {e}") from e
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} (in {cwd}) exited {done.returncode}:\n"
                           + done.stdout.decode(errors="replace")[-3000:]
                           + done.stderr.decode(errors="replace")[-3000:])


def _go_tool() -> str:
    for candidate in (shutil.which("go"), str(Path(sys.executable).parent / "go"),
                      "/work/venv/bin/go", "/usr/local/go/bin/go"):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("no `go` tool found (PATH, the venv's bin)")


def _build_go() -> List[str]:
    given = os.environ.get("LOCKSERVICE_GO_DRIVER")
    if given:
        if not os.access(given, os.X_OK):
            raise RuntimeError(f"LOCKSERVICE_GO_DRIVER={given} is not an executable file")
        return [given]
    if not (GO_DIR / "cmd" / "lockservice-driver").is_dir():
        raise RuntimeError(f"{GO_DIR}/cmd/lockservice-driver is missing")
    sources = [p for p in GO_DIR.rglob("*") if p.is_file() and p.suffix in (".go", ".mod", ".sum")
               and not p.name.endswith("_test.go")]
    out = BUILD_ROOT / f"go-{_digest(sources)}" / "lockservice-driver"
    with _BuildLock("go"):
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            go = _go_tool()
            env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOTOOLCHAIN="local",
                       PATH=f"{Path(go).parent}:{os.environ.get('PATH', '')}")
            tmp = out.with_suffix(".tmp")
            _run([go, "build", "-o", str(tmp), "./cmd/lockservice-driver"], GO_DIR, env)
            tmp.rename(out)
    return [str(out)]


def _build_js() -> List[str]:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("no `node` on PATH")
    given = os.environ.get("LOCKSERVICE_JS_DRIVER")
    if given:
        if not os.path.isfile(given):
            raise RuntimeError(f"LOCKSERVICE_JS_DRIVER={given} is not a file")
        return [node, given] if given.endswith(".js") else [given]
    files = ["package.json", "package-lock.json", "tsconfig.json"]
    for name in files:
        if not (JS_DIR / name).is_file():
            raise RuntimeError(f"{JS_DIR}/{name} is missing")
    sources = [JS_DIR / n for n in files] + sorted((JS_DIR / "src").rglob("*.ts"))
    where = BUILD_ROOT / f"js-{_digest(sources)}"
    driver = where / "dist" / "driver.js"
    with _BuildLock("js"):
        if not driver.exists():
            # Built in a copy: `npm ci` in the shared tree would pull
            # node_modules from under the engineers working in it.
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            for name in files:
                shutil.copy2(JS_DIR / name, where / name)
            shutil.copytree(JS_DIR / "src", where / "src")
            shared = JS_DIR / "node_modules"
            if (shared / "typescript").is_dir():
                (where / "node_modules").symlink_to(shared)
            else:
                _run(["npm", "ci", "--no-audit", "--no-fund"], where)
            _run(["npm", "run", "build"], where)
            if not driver.exists():
                raise RuntimeError(f"`npm run build` made no {driver}")
    return [node, str(driver)]


def _build_python() -> List[str]:
    given = os.environ.get("LOCKSERVICE_PYTHON_DRIVER")
    if given:
        return shlex.split(given)
    return [sys.executable, "-m", "lockservice.driver"]


_BUILDERS: Dict[str, Callable[[], List[str]]] = {
    "python": _build_python, "go": _build_go, "js": _build_js,
}
_failures: Dict[str, str] = {}


def driver_command(kind: str) -> List[str]:
    """
    How to start the C{kind} driver (built on first use); fails the test
    (never skips) when it cannot be had.
    """
    if kind in _commands:
        return _commands[kind]
    if kind in _failures:
        pytest.fail(_failures[kind], pytrace=False)
    try:
        _commands[kind] = _BUILDERS[kind]()
    except Exception as e:  # noqa: BLE001 - any build problem is a failure
        _failures[kind] = f"the {kind} conformance driver is not available: {e}"
        pytest.fail(_failures[kind], pytrace=False)
    return _commands[kind]


# -- drivers --------------------------------------------------------------------------

@pytest.fixture
def start_driver(kind: str, tmp_path: Path) -> Iterator[Callable[..., DriverProcess]]:
    """
    C{start_driver(addrs, name=None, args=(...), kind=...)}: a running
    driver; every one is killed at teardown, and any stdout line that is
    not a JSON object fails the test.
    """
    started: List[DriverProcess] = []

    def start(addrs: str, name: Optional[str] = None, args: Sequence[str] = (),
              which: Optional[str] = None) -> DriverProcess:
        k = which or kind
        argv = ["--addrs", addrs]
        if name is not None:
            argv += ["--name", name]
        argv += list(args)
        proc = DriverProcess(driver_command(k), argv, k, cwd=str(tmp_path))
        started.append(proc)
        return proc

    yield start
    problems = []
    for proc in started:
        proc.kill()
        if proc.garbage:
            problems.append(f"{proc.kind} wrote lines that are not JSON objects on stdout: "
                            f"{proc.garbage[:5]}")
        seen: Dict[str, int] = {}
        for line in proc.all_lines():
            if "event" not in line.obj and line.obj.get("id") is not None:
                ident = json.dumps(line.obj["id"])
                seen[ident] = seen.get(ident, 0) + 1
        twice = sorted(i for i, n in seen.items() if n > 1)
        if twice:
            problems.append(f"{proc.kind} answered command(s) {twice} more than once")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


# -- nodes ---------------------------------------------------------------------------

class NodeBox:
    """
    A node (one C{Node} of the harness) with its HTTP endpoint.
    """

    def __init__(self, node: Node, http_port: int) -> None:
        self.node = node
        self.port = node.port
        self.address = node.address
        self.http_port = http_port

    # HTTP
    def get(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}",
                                    timeout=timeout) as r:
            return json.loads(r.read())

    def lock(self, key: str) -> Dict[str, Any]:
        return self.get("/locks/" + urllib.request.quote(key, safe=""))  # type: ignore[no-any-return]

    def holders(self, key: str) -> List[Dict[str, Any]]:
        lock = self.lock(key)
        if not lock.get("held", True) or "holders" not in lock:
            return []
        return [h for h in lock["holders"] if not h.get("delayed")]

    def tokens(self, key: str) -> List[int]:
        return [h["token"] for h in self.holders(key)]

    def waiters(self, key: str) -> int:
        lock = self.lock(key)
        return int(lock.get("queue_length", 0) or 0)

    def events(self, key: Optional[str] = None) -> List[Dict[str, Any]]:
        path = "/events?limit=1000"
        if key is not None:
            path += "&key=" + urllib.request.quote(key, safe="")
        return self.get(path)["events"]  # type: ignore[no-any-return]

    def status(self) -> Dict[str, Any]:
        return self.get("/status")  # type: ignore[no-any-return]

    def force_release(self, key: str) -> Dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/locks/release?key="
            + urllib.request.quote(key, safe=""), method="POST",
            headers={"Authorization": f"Bearer {ADMIN_SECRET}"}, data=b"")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    # the line protocol
    def raw(self, name: Optional[str] = None, timeout: float = 10.0) -> LineClient:
        c = LineClient(self.port, timeout=timeout)
        if name is not None:
            assert c.ask(f"I {name}".encode(), timeout) == f"I {name}".encode()
        return c

    def hold(self, key: str, lease: float = 60, name: Optional[str] = None,
             share: Optional[str] = None) -> "Holder":
        c = self.raw(name)
        line = f"A {key} {lease} 5" + (f" {share}" if share else "")
        answer = c.ask(line.encode(), 10).decode()
        parts = answer.split()
        assert parts[:2] == ["A", key], f"{line!r} answered {answer!r}"
        return Holder(c, key, int(parts[2]))


class Holder:
    """
    A grant held by a raw line connection (another client, for the tests).
    """

    def __init__(self, conn: LineClient, key: str, token: int) -> None:
        self.conn = conn
        self.key = key
        self.token = token

    def release(self) -> str:
        return self.conn.ask(f"R {self.key} {self.token}".encode(), 10).decode()

    def close(self) -> None:
        self.conn.close()


# Where a lone node started with big_tokens=True begins its tokens: above
# 2^53 (and odd), so a client that keeps tokens in a float64 (a JavaScript
# number) gets every other token wrong.  The node's own tokens are µs
# timestamps, about 1.8e15: below 2^53 (9.007e15) until the 2250s.
BIG_TOKEN_MARK = 2**53 + 1_000_001
# The module node's --max-wait and --max-lease: 34.7 days, more than a
# timer of 2^31-1 ms (24.8 days) can hold.
LONG = 3_000_000


def _big_token_state(directory: Path) -> None:
    """
    A --state-dir whose token high-water mark is BIG_TOKEN_MARK (a lone
    node's state file, written with the node's own lockservice.state).
    """
    from lockservice import state

    directory.mkdir(parents=True, exist_ok=True)
    saved = state.State(cluster=state.clusterIdentity(b"", []), node="", mark=BIG_TOKEN_MARK)
    (directory / "state").write_bytes(state.encode(saved))


def start_node(log_dir: str, extra: Sequence[str] = (), port: Optional[int] = None,
               http: bool = True, tls: Any = None, big_tokens: bool = False) -> NodeBox:
    secret = Path(log_dir) / "admin-secret"
    secret.write_text(ADMIN_SECRET + "\n")
    http_port = freePort() if http else 0
    args = list(extra) + ["--admin-secret", str(secret)]
    if big_tokens:
        _big_token_state(Path(log_dir) / "state")
        args += ["--state-dir", str(Path(log_dir) / "state")]
    if http:
        args += ["--http", f"tcp:{http_port}:interface=127.0.0.1"]
    node = Node(port or freePort(), args=args, logDir=log_dir, tls=tls)
    try:
        node.start(timeout=30)
    except BaseException:
        node.stop()
        raise
    return NodeBox(node, http_port)


def start_cluster(log_dir: str, size: int = 3, extra: Sequence[str] = ()) -> List[NodeBox]:
    ports = freePorts(size)
    secret = Path(log_dir) / "admin-secret"
    secret.write_text(ADMIN_SECRET + "\n")
    boxes: List[NodeBox] = []
    try:
        for i, port in enumerate(ports):
            http_port = freePort()
            node = Node(port, peers=ports, logDir=log_dir, name=f"node{i}",
                        args=list(extra) + ["--admin-secret", str(secret),
                                            "--http", f"tcp:{http_port}:interface=127.0.0.1"])
            boxes.append(NodeBox(node, http_port))
            node.start(wait=False)
        for box in boxes:
            box.node.waitReady(30)
        wait_until(lambda: _role(boxes[0]) == "active", 20, "node0 active")
    except BaseException:
        for box in boxes:
            box.node.stop()
        raise
    return boxes


def _role(box: NodeBox) -> Optional[str]:
    try:
        return box.status().get("role")  # type: ignore[no-any-return]
    except (OSError, ValueError, urllib.error.URLError):
        return None


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
        except (OSError, ValueError, urllib.error.URLError) as e:
            value, last = None, e
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s"
                                 + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeBox]:
    """
    One lone node per module (tests use their own keys): HTTP admin on,
    --max-waiters 3 (the limit tests), --max-observers 2, --max-wait and
    --max-lease of LONG seconds (above 2^31 ms), and tokens above 2^53
    (BIG_TOKEN_MARK).
    """
    box = start_node(str(tmp_path_factory.mktemp("lone")),
                     ["--max-waiters", "3", "--max-observers", "2",
                      "--max-wait", str(LONG), "--max-lease", str(LONG)], big_tokens=True)
    yield box
    box.node.stop()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., NodeBox]]:
    made: List[NodeBox] = []

    def make(extra: Sequence[str] = (), tls: Any = None, big_tokens: bool = True) -> NodeBox:
        where = tmp_path / f"n{len(made)}"
        where.mkdir(parents=True, exist_ok=True)
        box = start_node(str(where), extra, tls=tls, big_tokens=big_tokens)
        made.append(box)
        return box

    yield make
    for box in made:
        _stop(box.node)


def _stop(node: Node) -> None:
    if node.alive():
        try:
            node.signal(signal.SIGCONT)
        except OSError:
            pass
    node.stop()


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], LineProxy]]:
    made: List[LineProxy] = []

    def make(port: int) -> LineProxy:
        p = LineProxy(port)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture
def raws() -> Iterator[List[Any]]:
    """
    A list to put raw connections and holders in: closed at teardown.
    """
    items: List[Any] = []
    yield items
    for item in items:
        try:
            item.close()
        except OSError:
            pass


_counter = [0]


@pytest.fixture
def key(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """
    C{key("name")}: a key unique to this test (tests share module nodes).
    """
    base = request.node.name.replace("[", "-").replace("]", "").replace(" ", "")[:60]

    def make(suffix: str = "k") -> str:
        _counter[0] += 1
        return f"{base}/{suffix}/{os.getpid()}.{_counter[0]}"

    return make
