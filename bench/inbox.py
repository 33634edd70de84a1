"""Scenario 7: the inbox listing at 1,000 / 10,000 / 100,000 open interrupts (bench/README.md).

`listing_rows` opens interrupts through Parley's own outbox flush (index_add.lua, the listing's
sets included) on a private redis-server, growing to each size in turn, and at each size walks
pages of the listing (`Client.interrupt_page`) for each kind of query: everything, one reason,
one principal (its own and those anyone may answer), one session prefix, and a combination
(reason + principal + older than). A page's time is one `interrupt_page` call as a client sees
it; Redis's commands per page come from INFO commandstats.
"""

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.dispatcher.core import IndexAdd
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys

REASONS = ("confirm", "budget", "review", "escalate")
TENANTS = 20
PRINCIPALS = 50
BASE_MS = 1_764_558_000_000
FILL_BATCH = 1_000


def interrupt(i: int) -> tuple[str, list[Any]]:
    """The i-th open interrupt: a quarter per reason, a third anyone may answer, the rest one
    principal each of 50; 20 tenants' sessions."""
    session = f"tenant-{i % TENANTS:02}-s{i:07}"
    return session, [IndexAdd(seq=1, interrupt_id="int-1", reason=REASONS[i % len(REASONS)], anchor="msg-2",
                              raised_at=BASE_MS + i, deadline=None, parent=None,
                              payload={"tool": "send_email", "to": f"user{i}@example.com"},
                              resumable_by=None if i % 3 == 0 else [f"user-{i % PRINCIPALS}"],
                              metadata={"tenant": i % TENANTS})]


QUERIES: dict[str, InterruptFilter] = {
    "all": InterruptFilter(),
    "reason": InterruptFilter(reason="review"),
    "principal": InterruptFilter(principal="user-7"),
    "prefix": InterruptFilter(session_prefix="tenant-03-"),
    "combined": InterruptFilter(reason="review", principal="user-7", raised_before=BASE_MS + 10**9),
}


def open_interrupts(outboxes: Sequence[Outbox], shard_of: Callable[[str], int], start: int,
                    stop: int) -> None:
    """Interrupts `start` to `stop - 1` opened, FILL_BATCH at a time, each through the outbox of
    its session's shard (`shard_of`; one MULTI per shard per batch). One outbox and `shard_of`
    always 0: scenario 7's one Redis."""
    for lo in range(start, stop, FILL_BATCH):
        by_shard: dict[int, list[tuple[str, list[Any]]]] = {}
        for i in range(lo, min(stop, lo + FILL_BATCH)):
            session, items = interrupt(i)
            by_shard.setdefault(shard_of(session), []).append((session, items))
        for shard, batch in by_shard.items():
            outboxes[shard].flush_many(batch)


def servers(r: redis.Redis | Sequence[redis.Redis]) -> list[redis.Redis]:
    return [r] if isinstance(r, redis.Redis) else list(r)


def commands(r: redis.Redis | Sequence[redis.Redis]) -> int:
    """Commands Redis has run (INFO commandstats), summed over every shard given."""
    return sum(int(v["calls"]) for c in servers(r) for v in c.info("commandstats").values())


def walk_pages(r: redis.Redis | Sequence[redis.Redis], fetch: Callable[[str | None], Any], pages: int,
               dist: Callable[[list[float]], dict[str, Any]],
               keep: list[Any] | None = None) -> dict[str, Any]:
    """Up to `pages` pages from the first on (`fetch(cursor)` reads one: anything with `items`
    and `cursor`), each timed; Redis commands per page, summed over every shard in `r` (one
    client, or each shard's). With `keep`, every row walked is appended to it (after its
    page's time is taken)."""
    times: list[float] = []
    rows = 0
    cursor: str | None = None
    before = commands(r)
    for _ in range(pages):
        t = time.perf_counter()
        page = fetch(cursor)
        times.append((time.perf_counter() - t) * 1000)
        rows += len(page.items)
        if keep is not None:
            keep.extend(page.items)
        cursor = page.cursor
        if cursor is None:
            break
    spent = commands(r) - before - len(servers(r))  # less the first INFO of each shard
    return {"pages": len(times), "rows": rows, "page_ms": dist(times),
            "redis_commands_per_page": round(spent / len(times), 2)}


def walk(r: redis.Redis | Sequence[redis.Redis], client: Client, where: InterruptFilter, pages: int,
         limit: int, dist: Callable[[list[float]], dict[str, Any]],
         keep: list[Any] | None = None) -> dict[str, Any]:
    return walk_pages(r, lambda cursor: client.interrupt_page(where, limit, cursor), pages, dist, keep)


def listing_rows(workdir: Path, sizes: list[int], pages: int, limit: int,
                 dist: Callable[[list[float]], dict[str, Any]],
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    server = RedisServer(workdir, appendonly=False).start()
    try:
        r = redis.Redis.from_url(server.url)
        outbox, client = Outbox(r, Keys()), Client(r)
        rows: list[dict[str, Any]] = []
        opened = 0
        for size in sizes:
            t = time.perf_counter()
            open_interrupts([outbox], lambda _session: 0, opened, size)
            opened = max(opened, size)
            fill_s = time.perf_counter() - t
            row: dict[str, Any] = {"open": size, "limit": limit, "fill_s": round(fill_s, 2),
                                   "used_memory_mib": round(int(r.info("memory")["used_memory"]) / 2**20, 1)}
            for name, where in QUERIES.items():
                row[name] = walk(r, client, where, pages, limit, dist)
            rows.append(row)
            log(f"  {size:,} open: "
                + ", ".join(f"{n} p50 {row[n]['page_ms'].get('p50')} ms" for n in QUERIES))
        r.close()
        return rows
    finally:
        server.stop(kill=True)
