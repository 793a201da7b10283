"""
Run one conformance driver process and talk JSON lines with it, every wait
bounded.

A reader thread takes each stdout line as it comes, with its arrival time
and its place in the output (so tests can check the order of lines);
anything on stdout that is not one JSON object is kept in C{garbage} and
fails the test at teardown (a driver writes nothing else on stdout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

Json = Dict[str, Any]
Id = Union[int, str]


@dataclass
class Line:
    index: int      # place among every stdout line of the driver
    time: float     # time.monotonic() when read
    obj: Json
    raw: str


class DriverError(AssertionError):
    pass


class DriverProcess:
    def __init__(self, command: Sequence[str], args: Sequence[str], kind: str,
                 env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None) -> None:
        self.kind = kind
        self.argv = list(command) + list(args)
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True)
        self.started = time.monotonic()
        self.cond = threading.Condition()
        self.lines: List[Line] = []
        self.garbage: List[str] = []
        self.stderr: List[str] = []
        self.eof = False
        self._nextId = 1
        self.sent: Dict[str, float] = {}  # json id -> time sent
        self._out = threading.Thread(target=self._readOut, daemon=True)
        self._err = threading.Thread(target=self._readErr, daemon=True)
        self._out.start()
        self._err.start()

    # -- reading ----------------------------------------------------------------

    def _readOut(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            text = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.monotonic()
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            with self.cond:
                if not isinstance(obj, dict):
                    self.garbage.append(text)
                else:
                    self.lines.append(Line(len(self.lines) + len(self.garbage), now, obj, text))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _readErr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self.cond:
                if len(self.stderr) < 2000:
                    self.stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def stderrTail(self, n: int = 25) -> str:
        with self.cond:
            return "\n".join(self.stderr[-n:])

    def describe(self) -> str:
        with self.cond:
            out = "\n".join(f"  {ln.time - self.started:7.3f} {ln.raw}" for ln in self.lines[-30:])
        return (f"[{self.kind} driver: {' '.join(self.argv)}]\n"
                f"stdout (last lines):\n{out}\nstderr (tail):\n{self.stderrTail()}")

    # -- writing ----------------------------------------------------------------

    def newId(self) -> int:
        n = self._nextId
        self._nextId += 1
        return n

    def send_raw(self, text: Union[str, bytes]) -> float:
        data = text.encode() if isinstance(text, str) else text
        if not data.endswith(b"\n"):
            data += b"\n"
        assert self.proc.stdin is not None
        now = time.monotonic()
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise DriverError(f"driver stdin closed ({e})\n{self.describe()}") from e
        return now

    def send(self, command: Json) -> Id:
        """
        Send one command (an C{id} is added when missing); its id.
        """
        if "id" not in command:
            command = {"id": self.newId(), **command}
        self.sent[json.dumps(command["id"])] = self.send_raw(json.dumps(command))
        return command["id"]

    def cmd(self, op: str, **fields: Any) -> Id:
        return self.send({"op": op, **fields})

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    # -- waiting ----------------------------------------------------------------

    def wait_line(self, predicate: Callable[[Json], bool], timeout: float, what: str = "line",
                  start: int = 0) -> Line:
        deadline = time.monotonic() + timeout
        with self.cond:
            seen = start
            while True:
                for line in self.lines[seen:]:
                    if predicate(line.obj):
                        return line
                seen = max(seen, len(self.lines))
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self.eof and self.proc.poll() is not None:
                    break
                self.cond.wait(min(left, 0.2))
        raise DriverError(f"no {what} within {timeout:g} s\n{self.describe()}")

    def result(self, ident: Id, timeout: float = 10.0) -> Json:
        return self.result_line(ident, timeout).obj

    def result_line(self, ident: Id, timeout: float = 10.0) -> Line:
        """
        The result line of command C{ident} (matched by id, same JSON type).
        """
        want = json.dumps(ident)
        return self.wait_line(lambda o: "id" in o and "event" not in o
                              and json.dumps(o["id"]) == want,
                              timeout, what=f"result for id {want}")

    def elapsed(self, ident: Id, line: Line) -> float:
        return line.time - self.sent[json.dumps(ident)]

    def call(self, op: str, timeout: float = 10.0, **fields: Any) -> Json:
        return self.result(self.cmd(op, **fields), timeout)

    def event(self, key: str, timeout: float, event: str = "lost") -> Line:
        return self.wait_line(lambda o: o.get("event") == event and o.get("key") == key,
                              timeout, what=f"{event} event for {key!r}")

    def events(self, event: str = "lost") -> List[Json]:
        with self.cond:
            return [ln.obj for ln in self.lines if ln.obj.get("event") == event]

    def results_for(self, ident: Id) -> List[Line]:
        want = json.dumps(ident)
        with self.cond:
            return [ln for ln in self.lines
                    if "id" in ln.obj and json.dumps(ln.obj["id"]) == want]

    def all_lines(self) -> List[Line]:
        with self.cond:
            return list(self.lines)

    def no_line(self, predicate: Callable[[Json], bool], within: float) -> None:
        """
        Assert that no line matching C{predicate} comes within C{within} s
        (a bounded negative check).
        """
        try:
            line = self.wait_line(predicate, within)
        except DriverError:
            return
        raise DriverError(f"unexpected line {line.raw}\n{self.describe()}")

    def wait_exit(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_eof(self, timeout: float) -> None:
        self._out.join(timeout)

    # -- ending -----------------------------------------------------------------

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._out.join(2)
        self._err.join(2)


def run_briefly(command: Sequence[str], args: Sequence[str], timeout: float = 15.0,
                stdin: bytes = b"",
                env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """
    Run a driver to its end (bad-argument checks); killed past C{timeout}.
    """
    proc = subprocess.Popen(list(command) + list(args), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, None, out, err)  # type: ignore[arg-type]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
