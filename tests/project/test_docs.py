"""
The examples of README.md and docs/*.md run as written, against real nodes.

Every fenced code block of those pages (docs/operations.md has a test of its
own) is read from the Markdown itself and handled by its info string:

  ``sh``             run by bash (errexit, pipefail) in the page's scratch
                     directory, in page order; ``.venv`` there is a link to
                     this test's Python environment, and its ``bin`` comes
                     first on PATH (``python``, ``python3``)
  ``sh server``      a command that starts a node and keeps running: started
                     in the background, waited for (every ``tcp:PORT`` in it
                     answers ``P``), stopped at the end of the page.  A
                     leading ``python3 -m venv .venv && .venv/bin/pip install
                     ... &&`` is not run: the test's environment is that venv
                     (the tox ``packaging`` env installs the wheel into a
                     fresh venv and starts a node from it)
  ``python``         run as a script by this Python, in the scratch directory
  ``text output``    what the runnable block just before it prints; every
                     number of ten or more digits (a fencing token) matches
                     any such number
  ``text``, ``sql``, ``toml``, ``json``, ``go``
                     not run: transcripts, output samples, other languages
                     (the Go client's examples run in its own tests)
  ``ts``             must be one of clients/js/examples/*.ts verbatim (the
                     TypeScript client's tests run those)
  ``shell-norun``, ``python-norun``
                     not meant to run here: an install from the network, the
                     hosts of a real cluster, a web framework and its
                     database, the whole test suite, a benchmark of minutes

A block with any other info string (or none) fails the test, so no example
escapes it.  Ports: every port 77NN of a page stands for a free loopback
port of its own (the same number, the same port throughout the page).  A
page that does not start a node on 7700 itself gets one from the test,
started as the README's quick start starts it (``--listen`` 7700,
``--http`` 7780), as a reader who followed the quick start has; the
``lockservice`` command's defaults (``$LOCKSERVICE_ADDR``,
``$LOCKSERVICE_URL``) point at those two ports.

The last test greps the user-facing pages for words of the project's work
log (ticket numbers, work sessions, branch names, dated entries, the
specification's name and section numbers): a page describes the product.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from lockservice.testing.harness import Node, freePort, ping

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(
    p for p in (ROOT / "docs").glob("*.md") if p.name != "operations.md")

RUN = {"sh", "python"}
NOT_RUN = {"text", "sql", "toml", "json", "go", "shell-norun", "python-norun"}
CHECKED = {"ts"}
BLOCK_TIMEOUT = 60.0
SETUP = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install \S+ && ")
PORT = re.compile(r"(?<![\d.])77\d\d(?!\d)")
TOKEN = re.compile(r"\d{10,}")


@dataclass
class Block:
    page: Path
    line: int
    info: str
    text: str

    @property
    def kind(self) -> str:
        return self.info.split()[0] if self.info else ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> List[Block]:
    """
    The fenced code blocks of C{page}, in order (``` fences, any indent).
    """
    found: List[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^( *)(```+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not re.match(r"^ *" + fence + r"\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: unclosed code block")
        found.append(Block(page, i + 1, info, "\n".join(body) + "\n"))
        i = j + 1
    return found


def normalised(text: str) -> List[str]:
    return [TOKEN.sub("<token>", line.rstrip()) for line in text.rstrip("\n").splitlines()]


class Page:
    """
    One page's run: its scratch directory, its ports, what it started.
    """

    def __init__(self, page: Path, scratch: Path) -> None:
        self.page = page
        self.scratch = scratch
        self.ports: Dict[str, int] = {}
        self.groups: List[int] = []
        self.nodes: List[Node] = []
        (scratch / ".venv").symlink_to(sys.prefix)
        self.env = dict(os.environ)
        self.env["PATH"] = str(Path(sys.prefix) / "bin") + os.pathsep + self.env.get("PATH", "")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop("VIRTUAL_ENV", None)
        # The lockservice command's defaults (127.0.0.1:7700, and 7780 for
        # --http), moved with the page's ports.
        self.env["LOCKSERVICE_ADDR"] = f"127.0.0.1:{self.port('7700')}"
        self.env["LOCKSERVICE_URL"] = f"http://127.0.0.1:{self.port('7780')}"

    def port(self, number: str) -> int:
        if number not in self.ports:
            self.ports[number] = freePort()
        return self.ports[number]

    def localised(self, text: str) -> str:
        return PORT.sub(lambda m: str(self.port(m.group(0))), text)

    def startDefaultNode(self) -> None:
        node = Node(self.port("7700"),
                    args=["--http", f"tcp:{self.port('7780')}:interface=127.0.0.1"],
                    logDir=str(self.scratch / "default-node"))
        os.makedirs(node.logDir, exist_ok=True)
        self.nodes.append(node)
        node.start()

    def _spawn(self, argv: List[str], name: str) -> subprocess.Popen:  # type: ignore[type-arg]
        out = open(self.scratch / f"{name}.out", "wb")
        err = open(self.scratch / f"{name}.err", "wb")
        try:
            proc = subprocess.Popen(argv, cwd=self.scratch, env=self.env, stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            out.close()
            err.close()
        self.groups.append(proc.pid)
        return proc

    def output(self, name: str) -> str:
        return (self.scratch / f"{name}.out").read_text(errors="replace")

    def errors(self, name: str) -> str:
        return (self.scratch / f"{name}.err").read_text(errors="replace")

    def serve(self, block: Block, name: str) -> None:
        text = SETUP.sub("", block.text.strip())
        assert "pip install" not in text, f"{block.where}: a server block installs nothing else"
        text = self.localised(text)
        proc = self._spawn(["bash", "-c", "exec " + text if "\n" not in text else text], name)
        lockPorts = {int(p) for p in re.findall(r"--listen tcp:(\d+)", text)}
        ports = [int(p) for p in re.findall(r"tcp:(\d+)", text)]
        assert lockPorts, f"{block.where}: a server block listens on tcp:PORT"
        deadline = time.monotonic() + 30
        for port in ports:
            while not (ping(port, timeout=0.5) if port in lockPorts else listening(port)):
                if proc.poll() is not None:
                    raise AssertionError(f"{block.where}: the server exited with "
                                         f"{proc.returncode}:\n{self.errors(name)}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{block.where}: nothing answers on {port}")
                time.sleep(0.05)

    def run(self, block: Block, name: str) -> str:
        text = self.localised(block.text)
        if block.kind == "sh":
            argv = ["bash", "-e", "-o", "pipefail", "-c", text]
        else:
            script = self.scratch / f"{name}.py"
            script.write_text(text)
            argv = [sys.executable, str(script)]
        proc = self._spawn(argv, name)
        try:
            code = proc.wait(BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{block.where}: still running after {BLOCK_TIMEOUT:g} s\n"
                                 f"{self.output(name)}{self.errors(name)}") from None
        out = self.output(name)
        assert code == 0, (f"{block.where}: exit status {code}\n--- stdout\n{out}"
                           f"--- stderr\n{self.errors(name)}")
        return out

    def stop(self) -> None:
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for node in self.nodes:
            node.stop()


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


# The pages with something to run (the others' blocks are checked by kind).
RUNNABLE = [page for page in PAGES if any(b.kind in RUN for b in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    if any("nc " in b.text for b in found if b.kind == "sh") and shutil.which("nc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nc is missing (Debian: apt-get install netcat-openbsd)")
        pytest.skip("nc is missing (Debian: apt-get install netcat-openbsd)")
    run = Page(page, tmp_path)
    try:
        if not any(b.info.split()[1:] == ["server"] and "tcp:7700" in b.text for b in found):
            run.startDefaultNode()
        last: Optional[Block] = None
        printed = ""
        for n, block in enumerate(found):
            name = f"block{n:02d}-line{block.line}"
            if block.info == "sh server":
                run.serve(block, name)
                last = None
            elif block.kind in RUN and block.info in ("sh", "python"):
                printed = run.run(block, name)
                last = block
            elif block.info == "text output":
                assert last is not None, (f"{block.where}: an output block follows the block "
                                          "whose output it is")
                assert normalised(printed) == normalised(run.localised(block.text)), (
                    f"{block.where}: {last.where} printed\n{printed}\ninstead of\n{block.text}")
                last = None
            else:
                last = None
    finally:
        run.stop()


def test_every_code_block_says_how_it_is_tested() -> None:
    """
    Every fenced block is run, checked or declared not to run: an example
    without an info string (or with a new one) would escape the test above.
    """
    js = ROOT / "clients" / "js" / "examples"
    examples = {p.read_text() for p in js.glob("*.ts")}
    wrong = []
    for page in PAGES + [ROOT / "docs" / "operations.md"]:
        for block in blocks(page):
            if page.name == "operations.md":
                continue
            if block.info in ("sh", "sh server", "python", "text output"):
                continue
            if block.kind in NOT_RUN and block.info == block.kind:
                continue
            if block.kind == "ts" and block.info == "ts":
                if block.text not in examples:
                    wrong.append(f"{block.where}: a ts block that is not one of "
                                 "clients/js/examples/*.ts")
                continue
            wrong.append(f"{block.where}: info string {block.info!r}")
        if page.name != "operations.md":
            wrong.extend(indentedBlocks(page))
    assert not wrong, "\n".join(wrong)


def indentedBlocks(page: Path) -> List[str]:
    """
    Code blocks made by indenting (four spaces after a blank line, not in a
    list): they have no info string, so they would escape the test.
    """
    found = []
    lines = page.read_text().splitlines()
    inFence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            inFence = not inFence
            continue
        if inFence or not line.startswith("    ") or not line.strip() or lines[i - 1].strip():
            continue
        before = [x for x in lines[:i] if x.strip()]
        previous = before[-1] if before else ""
        if not re.match(r"^(\s|[-*] |\d+\. )", previous):
            found.append(f"{page.relative_to(ROOT)}:{i + 1}: an indented code block: fence it")
    return found


def _slug(heading: str) -> str:
    """
    GitHub's anchor for a heading.
    """
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set:
    seen: Dict[str, int] = {}
    out = set()
    inFence = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inFence = not inFence
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if m and not inFence:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_between_pages_lead_somewhere() -> None:
    """
    Every relative link of the pages names a file of the tree, and every
    #anchor one of that page's headings.
    """
    broken = []
    for page in PAGES + [ROOT / "CHANGELOG.md"] + sorted((ROOT / "clients").glob("*/README.md")):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# Words of the project's work log, not of the product.
WORK_WORDS = [
    (re.compile(r"\bissues? #?\d", re.I), "a ticket number"),
    (re.compile(r"\btickets?\b", re.I), "a ticket"),
    (re.compile(r"\bSPEC\b"), "the specification's name"),
    (re.compile(r"§"), "a section number"),
    (re.compile(r"\b(this|that|previous|next|last|first|second|third|earlier|morning's)"
                r" session\b", re.I), "a work session"),
    (re.compile(r"\bsessions? \d", re.I), "a work session"),
    (re.compile(r"\bstop \d+(?![\d.]| ?(?:s|ms|seconds?|minutes?)\b)", re.I), "a work stop"),
    (re.compile(r"\bbranch(es)?\b", re.I), "a branch"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b(?!T)"), "a dated entry"),
    (re.compile(r"`[0-9a-f]{7,12}`"), "a commit id"),
    (re.compile(r"\bitem \d", re.I), "a ticket's item"),
]


def test_no_words_of_the_work_log_in_the_pages() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "clients").glob("*/README.md"))]
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for pattern, what in WORK_WORDS:
                m = pattern.search(line)
                if m:
                    found.append(f"{page.relative_to(ROOT)}:{number}: {what}: {m.group(0)!r}")
    assert not found, "\n".join(found)
