"""
The dashboard in a real headless browser (Debian's chromium) against a
real node with held keys, waiters, a long hold and a deadlock: what the
page's script renders is checked in the DOM the browser dumps.

Without a browser the test is skipped, saying why; under CI (CI=true)
a missing browser fails the test instead (CI installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import List, Optional

import pytest

from lockservice.testing.harness import LineClient, freePort, waitFor

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def findBrowser() -> Optional[str]:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def headless(browser: str, *args: str) -> List[str]:
    profile = tempfile.mkdtemp(prefix="lockservice-chromium-")
    return [browser, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", *args]


@pytest.fixture
def browser() -> str:
    path = findBrowser()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no headless browser installed (CI must install Debian's chromium)")
        pytest.skip("no headless browser: apt-get install -y chromium")
    return path


def renderedDOM(browser: str, url: str) -> str:
    # The virtual time budget lets the page's fetch() of /dashboard.json
    # complete and render before the DOM is dumped.
    command = headless(browser, "--virtual-time-budget=5000", "--dump-dom", url)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def screenshot(browser: str, url: str, path: str) -> None:
    command = headless(browser, "--virtual-time-budget=5000", "--hide-scrollbars",
                       "--window-size=1400,1050", f"--screenshot={path}", url)
    subprocess.run(command, capture_output=True, timeout=120, check=True)


def test_dashboard_renders_a_busy_node(spawn, browser, tmp_path) -> None:  # type: ignore[no-untyped-def]
    http = freePort()
    node = spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1", "--warn-hold", "0.2"])
    clients = [LineClient(node.port) for _ in range(5)]
    try:
        billing, reports, x, y, anonymous = clients
        billing.ask(b"I billing-worker-1")
        reports.ask(b"I reports-nightly")
        x.ask(b"I deadlock-x")
        y.ask(b"I deadlock-y")
        billing.ask(b"A accounts/1042 120 0")
        reports.send(b"A accounts/1042 60 0\n")
        anonymous.send(b"A accounts/1042 30 0\n")
        x.ask(b"A inventory/a 300 0")
        y.ask(b"A inventory/b 300 0")
        x.send(b"A inventory/b 300 0\n")
        y.send(b"A inventory/a 300 0\n")
        status = f"http://127.0.0.1:{http}/status"

        def ready() -> bool:
            import json
            import urllib.request

            with urllib.request.urlopen(status, timeout=5) as r:
                data = json.loads(r.read())
            return data["waiters"] == 4 and data["long_holds"] == 3 and bool(data["deadlocks"])

        waitFor(ready, 20, what="queued, long holds and the deadlock")
        dom = renderedDOM(browser, f"http://127.0.0.1:{http}/")
        # Rendered by the page's script, not in the HTML the node sent.
        assert re.search(r'<span id="role" class="role active">active</span>', dom), dom[:3000]
        row = re.search(r'<tr data-key="accounts/1042" class="long">(.*?)</tr>', dom, re.S)
        assert row, dom
        assert '<td class="holder">billing-worker-1</td>' in row.group(1)
        waiters = re.findall(r'<li class="waiter">([^<]*)</li>', row.group(1))
        host, port = anonymous.sock.getsockname()
        assert [w.split(" (")[0] for w in waiters] == ["reports-nightly", f"{host}:{port}"]
        assert 'id="deadlocks"' in dom and "cycle of 2" in dom
        assert "deadlock-x waits for inventory/b (held by deadlock-y)" in dom
        assert re.search(r'<tr data-key="inventory/a" class="long deadlock">', dom)
        assert 'id="long-holds"' in dom
        assert dom.count('<li class="event">') == 3  # the three grants
        assert dom.count('<span class="ev-type ev-grant">grant</span>') == 3
        assert 'class="series-grants"' in dom and 'class="series-hold_max"' in dom
        # Charts (issue 21 item 14): round y ticks beyond 0 and the
        # maximum, x ticks in seconds ago, a legend per chart, and grant
        # and wait lines told apart by their dash pattern too.
        yTicks = re.findall(r'<text[^>]*class="tick y-tick"[^>]*>([^<]*)</text>', dom)
        assert len(yTicks) >= 2 * 3 and yTicks[0] == "0", yTicks
        assert re.findall(r'class="tick x-tick"[^>]*>now<', dom)
        assert re.search(r'class="tick x-tick"[^>]*>-\d+s<', dom)
        legend = re.findall(r'<g class="legend-item">.*?<text[^>]*>([^<]*)</text></g>', dom)
        assert legend == ["grants/s", "waits/s", "mean", "max"], legend
        grants = re.search(r'<polyline[^>]*class="series-grants"', dom).group(0)
        waits = re.search(r'<polyline[^>]*class="series-waits"', dom).group(0)
        assert 'stroke-dasharray="none"' in grants and 'stroke-dasharray="5 3"' in waits
        # The deadlock banner and the badges of the keys in the cycle.
        assert dom.count('<span class="flag deadlock">deadlock</span>') == 2
        # A filter box; typed into, it keeps the matching rows only.
        assert '<input id="filter"' in dom
        filtered = renderedDOM(browser, f"http://127.0.0.1:{http}/#filter=reports")
        rows = re.findall(r'<tr data-key="([^"]*)"', filtered)
        assert rows == ["accounts/1042"], rows  # reports-nightly waits there
        filtered = renderedDOM(browser, f"http://127.0.0.1:{http}/#filter=deadlock-y")
        assert sorted(re.findall(r'<tr data-key="([^"]*)"', filtered)) == [
            "inventory/a", "inventory/b"]  # holds b, waits for a
        assert "<title>lockservice</title>" in dom
        assert ">this node<" in dom  # the active of a single node: no "None"
        if os.environ.get("LOCKSERVICE_SCREENSHOT"):
            screenshot(browser, f"http://127.0.0.1:{http}/",
                       os.environ["LOCKSERVICE_SCREENSHOT"])
    finally:
        for c in clients:
            c.close()


def test_dashboard_shows_shared_keys(spawn, browser) -> None:  # type: ignore[no-untyped-def]
    """
    A read lock held by two readers with a writer and a reader queued, and
    a semaphore: each row says the key's kind, lists every holder with its
    token, and each waiter's mode.
    """
    http = freePort()
    node = spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1"])
    names = ["reader-1", "reader-2", "writer", "reader-3", "slot-a"]
    clients = [LineClient(node.port) for _ in names]
    try:
        for client, name in zip(clients, names, strict=True):
            client.ask(b"I " + name.encode())
        r1, r2, w, r3, a = clients
        t1 = r1.ask(b"A reports/daily 300 0 r").split()[2].decode()
        t2 = r2.ask(b"A reports/daily 300 0 r").split()[2].decode()
        w.send(b"A reports/daily 60 0\n")
        r3.send(b"A reports/daily 60 0 r\n")
        a.ask(b"A pool 300 0 3")

        def ready() -> bool:
            import json
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=5) as r:
                data = json.loads(r.read())
            return data["waiters"] == 2 and data["shared_grants"] == 3

        waitFor(ready, 20, what="two readers, a semaphore slot and two waiters")
        dom = renderedDOM(browser, f"http://127.0.0.1:{http}/")
        row = re.search(r'<tr data-key="reports/daily"[^>]*>(.*?)</tr>', dom, re.S)
        assert row, dom
        assert '<span class="kind kind-read-write">read-write: 2 readers</span>' in row.group(1)
        holders = re.findall(r'<li class="holder-item">([^<]*)</li>', row.group(1))
        assert [h.split(" (")[0] for h in holders] == ["reader-1", "reader-2"]
        assert f"token {t1}," in holders[0] and f"token {t2}," in holders[1]
        waiters = re.findall(r'<li class="waiter">([^<]*)</li>', row.group(1))
        assert [x.split(" (")[0] for x in waiters] == ["writer · writer", "reader-3 · reader"]
        pool = re.search(r'<tr data-key="pool"[^>]*>(.*?)</tr>', dom, re.S)
        assert pool and '<span class="kind kind-semaphore">semaphore 1/3</span>' in pool.group(1)
        assert re.search(r'<b id="shared">3</b>', dom)
        filtered = renderedDOM(browser, f"http://127.0.0.1:{http}/#filter=reader-2")
        assert re.findall(r'<tr data-key="([^"]*)"', filtered) == ["reports/daily"]
        if os.environ.get("LOCKSERVICE_SCREENSHOT_SHARED"):
            screenshot(browser, f"http://127.0.0.1:{http}/",
                       os.environ["LOCKSERVICE_SCREENSHOT_SHARED"])
    finally:
        for c in clients:
            c.close()
