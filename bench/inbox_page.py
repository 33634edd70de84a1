"""Scenario 12: the inbox page, `parley inbox`, with 10,000 open interrupts (bench/README.md).

`page_row` opens interrupts the way scenario 7 does (bench/inbox.py: Parley's own outbox flush,
the listing's sets included) on a private redis-server, starts `parley inbox` as a real process
against it, signs in through `/signin` as a person of a users file made here (GET the form,
take its hidden `csrf`, POST principal, secret and csrf, keep the session cookie), then times
whole requests of the list's first page as the browser's HTTP client would make them (one
kept-alive connection, the body read): `GET /` (oldest first), `GET /?order=newest` and
`GET /?mine=1` (what the signed-in person may answer: theirs and anyone's).
"""

import hashlib
import json
import os
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.fleet import rss_kib
from bench.inbox import FILL_BATCH, interrupt
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer, free_port, start_parley, stop_process
from parley.schemas.keys import Keys
from parley.web.config import DEFAULT_PAGE_SIZE
from parley.web.users import hash_password

#: who signs in: one of bench/inbox.py's 50 principals, so `mine=1` lists theirs and anyone's
PRINCIPAL = "user-7"
#: the page's requests, by name: path and query
PAGES = {"first page": "/", "newest": "/?order=newest", "mine": "/?mine=1"}
START_TIMEOUT_S = 30.0


class PageParts(HTMLParser):
    """What the bench reads of a page: the hidden inputs' values (the CSRF token) and how many
    rows (`tr.interrupt`) the list has."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: dict[str, str] = {}
        self.rows = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        if tag == "input" and "name" in attributes:
            self.inputs[attributes["name"]] = attributes.get("value", "")
        if tag == "tr" and "interrupt" in attributes.get("class", "").split():
            self.rows += 1


def parse_page(html: str) -> PageParts:
    parts = PageParts()
    parts.feed(html)
    return parts



def wait_healthy(http: httpx.Client, proc: Any, log_path: Path) -> float:
    """Seconds until /healthz answers 200; fails with the process's log if it exits or never does."""
    started = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"parley inbox exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            if http.get("/healthz").status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        if time.monotonic() - started > START_TIMEOUT_S:
            raise RuntimeError(f"parley inbox did not answer /healthz in {START_TIMEOUT_S} s:\n"
                               f"{log_path.read_text()[-3000:]}")
        time.sleep(0.05)


def sign_in(http: httpx.Client, principal: str, secret: str) -> None:
    """Through the form, as a person does: the form's CSRF token, then the POST; the session
    cookie stays in `http`."""
    form = http.get("/signin")
    form.raise_for_status()
    token = parse_page(form.text).inputs.get("csrf")
    if not token:
        raise RuntimeError("GET /signin: no hidden `csrf` input in the form")
    done = http.post("/signin", data={"principal": principal, "secret": secret, "csrf": token})
    if done.status_code != 303:
        raise RuntimeError(f"POST /signin: status {done.status_code}, expected 303")


def time_page(http: httpx.Client, path: str, requests: int, rows_expected: int,
              dist: Callable[[list[float]], dict[str, Any]],
              percentile: Callable[[list[float], float], float]) -> dict[str, Any]:
    """`requests` GETs of `path`, each timed from the request to its body read; every one must
    be the list (200, not a redirect to sign in) with `rows_expected` rows."""
    times: list[float] = []
    size = 0
    for _ in range(requests):
        t = time.perf_counter()
        response = http.get(path)
        body = response.text
        times.append((time.perf_counter() - t) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: status {response.status_code}")
        rows = parse_page(body).rows
        if rows != rows_expected:
            raise RuntimeError(f"GET {path}: {rows} rows, expected {rows_expected}")
        size = len(response.content)
    return {"path": path, "rows": rows_expected, "bytes": size,
            "ms": {**dist(times), "p95": round(percentile(times, 0.95), 2)}}


def rows_of(name: str, open_interrupts: int) -> int:
    """The rows the first page of `name` has: a whole page, or all there are."""
    if name != "mine":
        return min(DEFAULT_PAGE_SIZE, open_interrupts)
    mine = 0
    for i in range(open_interrupts):
        (_, [row]) = interrupt(i)
        mine += row.resumable_by is None or PRINCIPAL in row.resumable_by
        if mine == DEFAULT_PAGE_SIZE:
            break
    return mine


def page_row(workdir: Path, open_interrupts: int, requests: int,
             dist: Callable[[list[float]], dict[str, Any]],
             percentile: Callable[[list[float], float], float],
             log: Callable[[str], None]) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(workdir / "redis", appendonly=False).start()
    proc = None
    try:
        r = redis.Redis.from_url(server.url)
        outbox = Outbox(r, Keys())
        t = time.perf_counter()
        for start in range(0, open_interrupts, FILL_BATCH):
            outbox.flush_many([interrupt(i) for i in range(start, min(open_interrupts, start + FILL_BATCH))])
        fill_s = time.perf_counter() - t
        r.close()

        secret = hashlib.sha256(os.urandom(16)).hexdigest()
        users_file, keys_file = workdir / "inbox-users.json", workdir / "keys.json"
        users_file.write_text(json.dumps({PRINCIPAL: {"password": hash_password(secret)}}))
        keys_file.write_text(json.dumps({PRINCIPAL: hashlib.sha256(os.urandom(16)).hexdigest()}))
        port, log_path = free_port(), workdir / "inbox.log"
        proc = start_parley(["inbox", "--port", str(port), "--host", "127.0.0.1",
                             "--users-file", str(users_file), "--keys-file", str(keys_file),
                             "--session-secret", secret],
                            {"PARLEY_REDIS_URL": server.url, "PARLEY_LOG_LEVEL": "WARNING"}, log_path)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            start_s = wait_healthy(http, proc, log_path)
            sign_in(http, PRINCIPAL, secret)
            # the first list after start (templates compiled, connections opened), apart
            t = time.perf_counter()
            first = http.get("/")
            first_ms = (time.perf_counter() - t) * 1000
            first.raise_for_status()
            pages = {name: time_page(http, path, requests, rows_of(name, open_interrupts), dist, percentile)
                     for name, path in PAGES.items()}
        row = {"open": open_interrupts, "fill_s": round(fill_s, 2), "requests": requests,
               "page_size": DEFAULT_PAGE_SIZE,
               "start_s": round(start_s, 2), "first_request_ms": round(first_ms, 2),
               "inbox_rss_kib": rss_kib(proc.pid), **pages}
        log(f"  {open_interrupts:,} open: " + ", ".join(
            f"{name} p50 {pages[name]['ms']['p50']} ms" for name in PAGES))
        return row
    finally:
        if proc is not None:
            stop_process(proc)
        server.stop(kill=True)
