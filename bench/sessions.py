"""Scenario 9: the list of sessions at 1,000 / 100,000 sessions (bench/README.md).

`listing_rows` lists sessions through Parley's own outbox flush (the `Listing` moves of
dispatcher/enqueue.py) and writes each session's record (its core, what a page reads per row)
on a private redis-server, growing to each size in turn, and at each size walks pages of
`Client.sessions` for each kind of filter: everything (the three status sets merged), one
status, one metadata pair, an age range, newest first, and a combination (status + metadata +
age). A page's time is one `Client.sessions` call as a client sees it; Redis's commands per
page come from INFO commandstats.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.inbox import walk_pages
from parley.client import Client
from parley.dispatcher.core.effects import listing_move
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer
from parley.schemas.codes import SessionStatus
from parley.schemas.keys import Keys
from parley.schemas.listing import listed
from parley.schemas.state import Core, Interrupt

TENANTS = 20
BASE_MS = 1_764_558_000_000
FILL_BATCH = 1_000


def session(i: int) -> Core:
    """The i-th session: a third each active, parked (one open interrupt) and closed; one of 20
    tenants and a tier in its metadata; created 1 ms apart."""
    core = Core(session=f"tenant-{i % TENANTS:02}-s{i:07}", created_at=BASE_MS + i,
                metadata={"tenant": f"t{i % TENANTS:02}", "tier": i % 3, "user": f"user{i}@example.com"})
    if i % 3 == 1:
        core.interrupts = {"int-1": Interrupt(id="int-1", reason="confirm", anchor="msg-2", turn="msg-1",
                                              origin=None, raised_at=core.created_at)}
    elif i % 3 == 2:
        core.status, core.closed_at = SessionStatus.CLOSED, core.created_at + 1_000
    return core


def queries(size: int) -> dict[str, dict[str, Any]]:
    middle = BASE_MS + size // 2
    return {
        "all": {},
        "status": {"status": "parked"},
        "metadata": {"metadata": {"tenant": "t03"}},
        "age": {"created_after": middle, "created_before": middle + size // 10},
        "newest": {"newest_first": True},
        "combined": {"status": "parked", "metadata": {"tenant": "t03"}, "created_after": BASE_MS + size // 4},
    }


QUERY_NAMES = list(queries(1))


def walk(r: redis.Redis, client: Client, where: dict[str, Any], pages: int, limit: int,
         dist: Callable[[list[float]], dict[str, Any]]) -> dict[str, Any]:
    return walk_pages(r, lambda cursor: client.sessions(**where, limit=limit, cursor=cursor), pages, dist)


def fill(r: redis.Redis, outbox: Outbox, keys: Keys, start: int, stop: int) -> None:
    pipe = r.pipeline(transaction=False)
    batch = []
    for i in range(start, stop):
        core = session(i)
        pipe.hset(keys.meta(core.session), mapping={"ver": 1, "core": core.to_json()})
        where = listed(core)
        assert where is not None
        batch.append((core.session, [listing_move(1, None, where)]))
    pipe.execute()
    outbox.flush_many(batch)


def listing_rows(workdir: Path, sizes: list[int], pages: int, limit: int,
                 dist: Callable[[list[float]], dict[str, Any]],
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    server = RedisServer(workdir, appendonly=False).start()
    try:
        r = redis.Redis.from_url(server.url)
        keys = Keys()
        outbox, client = Outbox(r, keys), Client(r)
        rows: list[dict[str, Any]] = []
        listed_so_far = 0
        for size in sizes:
            t = time.perf_counter()
            while listed_so_far < size:
                upto = min(size, listed_so_far + FILL_BATCH)
                fill(r, outbox, keys, listed_so_far, upto)
                listed_so_far = upto
            fill_s = time.perf_counter() - t
            row: dict[str, Any] = {"sessions": size, "limit": limit, "fill_s": round(fill_s, 2),
                                   "used_memory_mib": round(int(r.info("memory")["used_memory"]) / 2**20, 1)}
            for name, where in queries(size).items():
                row[name] = walk(r, client, where, pages, limit, dist)
            rows.append(row)
            log(f"  {size:,} sessions: "
                + ", ".join(f"{n} p50 {row[n]['page_ms'].get('p50')} ms" for n in QUERY_NAMES))
        r.close()
        return rows
    finally:
        server.stop(kill=True)
