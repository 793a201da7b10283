# -*- test-case-name: tests.cli.test_cli -*-
"""
The commands that talk to a node's C{--http} endpoint: C{status},
C{events}, C{release --force}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional

from lockservice.cli.errors import (
    EX_NOPERM,
    EX_NOT_ACTIVE,
    EX_OK,
    EX_STALE,
    EX_UNAVAILABLE,
    EX_USAGE,
    CommandError,
)

DEFAULT_STATUS_URL = os.environ.get("LOCKSERVICE_URL", "http://127.0.0.1:7780")


def baseURL(url: str) -> str:
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


def httpJSON(url: str, data: Optional[bytes] = None,
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
    url = baseURL(url)
    if not url.endswith("/status"):
        url += "/status"
    try:
        return _object(httpJSON(url), url, ("role", "held_keys", "waiters", "connections",
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
    base = baseURL(args.http)
    since = args.since
    try:
        while True:
            query = {"since": str(since)}
            if args.key:
                query["key"] = args.key
            url = f"{base}/events?{urllib.parse.urlencode(query)}"
            try:
                answer = httpJSON(url)
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
    url = f"{baseURL(args.http)}/locks/{urllib.parse.quote(args.key, safe='')}/release"
    body = urllib.parse.urlencode({"reason": args.reason}).encode()
    try:
        answer = httpJSON(url, data=body, headers={
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
