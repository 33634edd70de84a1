"""Scenario 14, the inbox listing at many shards: a page of `Client.interrupt_page` for each
query of scenario 7 (bench/inbox.py), the same open interrupts spread over 1, 4, 16 shards
(`--listing-shard-counts`).

Each row is a deployment of its own: S private redis-servers (`appendonly no`: only reads are
measured), and with S > 1 the placement (`Placement.default`, partition p on shard p mod S,
`--listing-shard-partitions` partitions) written to every shard's `parley:config`, as a
dispatcher writes it; the row of one shard is one Redis and no placement (a deployment of one
Redis, as scenario 11's). The same `--listing-shard-open` interrupts are opened in every row,
each through the outbox flush (`Outbox.flush_many`, a dispatcher's writes) of its session's
shard. The client is `Client(Shards(...))`: a page reads every shard's part at once (one
thread per shard, parley/client/sync.py `_each`), merges them, and reads the placement again
(one HMGET per shard, one after another) to keep each row from its session's shard only.

Per row and query: up to `--listing-shard-pages` pages of `--listing-shard-limit` rows walked
with the cursor, each page timed as the client sees it, Redis's commands per page summed over
every shard (INFO commandstats). For S > 1, what the fan-out is made of (`fanout`): the threads
the client started, the same shards' first pages read one after another, and the placement read
alone. Every row must list the same rows, in the same order, as the first row measured (the
same data, only spread), or the scenario raises: a broken listing is not reported as fast.
"""

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import redis

from bench.common import dist, ints, log, out_of_time, percentile
from bench.fleet import cpu_seconds, machine_busy_seconds
from bench.inbox import QUERIES, open_interrupts, walk
from bench.report import save
from parley.client import Client
from parley.client.inbox import merged_page
from parley.client.shards import Shards, write_placement
from parley.dispatcher.enqueue import Outbox
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from parley.schemas.shards import Placement

#: the fan-out's threads' names (parley/client/sync.py)
FANOUT_THREADS = "parley-shards"


class ShardListingError(RuntimeError):
    """A row's listing differs from the first row's: the same interrupts, listed otherwise."""


RowKey = tuple[str, str]


def dist95(values: list[float]) -> dict[str, Any]:
    """`dist` (p50/p90/p99/max/mean, ms) and p95."""
    out = dist(values)
    if values:
        out["p95"] = round(percentile(values, 0.95), 2)
    return out


def shard_listing_row(workdir: Path, shards: int, opened: int, partitions: int, pages: int,
                      limit: int) -> tuple[dict[str, Any], dict[str, list[RowKey]]]:
    """One row: `opened` interrupts over `shards` fresh redis-servers, every query's pages
    walked. Returns the row and, per query, the (session, interrupt id) of every row walked,
    in order (what the next rows are checked against)."""
    servers: list[RedisServer] = []
    clients: list[redis.Redis] = []
    try:
        for i in range(shards):
            servers.append(RedisServer(workdir / f"redis-{i}", appendonly=False))
            servers[-1].start()  # listed first: stopped in the finally even if its start fails
        clients = [redis.Redis.from_url(s.url) for s in servers]
        keys = Keys()
        placement: Placement | None = None
        if shards > 1:
            placement = Placement.default(partitions, shards)
            for i, r in enumerate(clients):
                write_placement(r, keys, i, placement)
        shard_of = placement.shard_of_session if placement is not None else (lambda _session: 0)

        t = time.perf_counter()
        open_interrupts([Outbox(r, keys) for r in clients], shard_of, 0, opened)
        fill_s = time.perf_counter() - t
        per_shard = [int(r.zcard(keys.interrupt_index)) for r in clients]
        if sum(per_shard) != opened:
            raise ShardListingError(f"{shards} shard(s): {sum(per_shard)} interrupts open of {opened}")

        client = Client(clients[0] if shards == 1 else Shards(clients, keys))
        before = {th.ident for th in threading.enumerate()}
        cpu0, busy0, wall0 = cpu(servers), machine_busy_seconds(), time.monotonic()
        row: dict[str, Any] = {"shards": shards, "mode": "placement" if shards > 1 else "one Redis",
                               "open": opened, "partitions": partitions,
                               "limit": limit, "fill_s": round(fill_s, 2), "open_per_shard": per_shard}
        walked: dict[str, list[RowKey]] = {}
        for name, where in QUERIES.items():
            items: list[Any] = []
            row[name] = walk(clients, client, where, pages, limit, dist95, keep=items)
            walked[name] = [(x.session, x.interrupt_id) for x in items]
        if shards > 1:
            started = [th for th in threading.enumerate()
                       if th.ident not in before and th.name.startswith(FANOUT_THREADS)]
            row["fanout"] = fanout(clients, keys, limit, pages, len(started))
        row["usage"] = usage(servers, cpu0, busy0, wall0)
        return row, walked
    finally:
        for r in clients:
            r.close()
        for s in servers:
            s.stop(kill=True)


def cpu(servers: list[RedisServer]) -> dict[str, float]:
    """CPU seconds so far of this driver and of each redis-server."""
    out = {f"redis-{i}": cpu_seconds(s.proc.pid) or 0.0 for i, s in enumerate(servers) if s.proc is not None}
    out["driver"] = cpu_seconds() or 0.0
    return out


def usage(servers: list[RedisServer], cpu0: dict[str, float], busy0: float, wall0: float) -> dict[str, Any]:
    """What the row's listing cost in CPU (this driver, the redis-servers together) and the
    machine's other load meanwhile, in cores (its busy time less ours: the machine is shared)."""
    cpu1, busy1, wall = cpu(servers), machine_busy_seconds(), time.monotonic() - wall0
    used = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
    redis_s = sum(v for k, v in used.items() if k.startswith("redis-"))
    other = max(0.0, (busy1 - busy0) - sum(used.values()))
    return {"wall_s": round(wall, 2),
            "cpu_s": {"driver": round(used["driver"], 2), "redis": round(redis_s, 2)},
            "machine_busy_s": round(busy1 - busy0, 2),
            "other_load_cores": round(other / wall, 2) if wall > 0 else None}


def fanout(clients: list[redis.Redis], keys: Keys, limit: int, repeats: int, threads: int) -> dict[str, Any]:
    """What the first page of `all` over S shards is made of, each part timed `repeats` times
    on its own: the shards' pages read one after another (each shard's own client, as a
    deployment of one Redis reads it: the parts without the threads), their merge
    (`merged_page`, pure), and the placement read (the S HMGETs a page reads after its
    parts, one after another). `threads`: the fan-out threads the client had started by then."""
    where = QUERIES["all"]
    singles = [Client(r) for r in clients]
    shards = Shards(clients, keys)
    serial: list[float] = []
    merge: list[float] = []
    placement: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        pages = [c.interrupt_page(where, limit, None) for c in singles]
        serial.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        placed = shards.refresh()
        placement.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        merged_page(where, limit, pages, placed)
        merge.append((time.perf_counter() - t) * 1000)
    return {"threads": threads, "shard_pages_one_after_another_ms": dist95(serial),
            "merge_ms": dist95(merge), "placement_read_ms": dist95(placement)}


def check_same(shards: int, walked: dict[str, list[RowKey]], reference: dict[str, list[RowKey]],
               reference_shards: int, limit: int) -> None:
    """ShardListingError unless every query listed the same rows in the same order as the
    reference row (the first page of `all` first: the check the scenario exists for)."""
    first, ref_first = walked["all"][:limit], reference["all"][:limit]
    if not first or first != ref_first:
        raise ShardListingError(
            f"the first page of `all` at {shards} shard(s) is not the one at {reference_shards}: "
            f"{len(first)} rows, first {first[:3]}, against {len(ref_first)}, first {ref_first[:3]}")
    for name, rows in walked.items():
        ref = reference[name]
        if rows != ref:
            at = next((i for i, (a, b) in enumerate(zip(rows, ref, strict=False)) if a != b),
                      min(len(rows), len(ref)))
            raise ShardListingError(
                f"`{name}` at {shards} shard(s) lists {len(rows)} rows, at {reference_shards} shard(s) "
                f"{len(ref)}: they differ from row {at} on ({rows[at:at + 1]} against {ref[at:at + 1]})")


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured row's p50 page time per query over the 1-shard row's (`page_p50_vs_one_shard`;
    None without a 1-shard row)."""
    one = next((r for r in rows if r.get("shards") == 1 and "skipped" not in r), None)
    for row in rows:
        if "skipped" in row:
            continue
        for name in QUERIES:
            base = one[name]["page_ms"].get("p50") if one is not None else None
            p50 = row[name]["page_ms"].get("p50")
            row[name]["page_p50_vs_one_shard"] = round(p50 / base, 2) if base and p50 is not None else None


def shard_listing(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """Scenario 14: `out["scenario_14"]`, one row per shard count."""
    rows = out.setdefault("scenario_14", [])
    reference: tuple[int, dict[str, list[RowKey]]] | None = None
    for count in args.listing_shard_counts:
        why = out_of_time(args, f"scenario 14 ({count} shard(s))")
        if why:
            rows.append({"shards": count, "skipped": why})
            continue
        log(f"scenario 14: the inbox listing at {count} shard(s): {args.listing_shard_open:,} open "
            f"interrupts, {args.listing_shard_partitions} partitions, {args.listing_shard_pages} pages "
            f"of {args.listing_shard_limit} per query")
        row, walked = shard_listing_row(workdir / f"s14-{count}", count, args.listing_shard_open,
                                        args.listing_shard_partitions, args.listing_shard_pages,
                                        args.listing_shard_limit)
        if reference is None:
            reference = (count, walked)
        else:
            check_same(count, walked, reference[1], reference[0], args.listing_shard_limit)
        row["same_rows_as_shards"] = reference[0]
        rows.append(row)
        add_ratios(rows)
        spread = ints(row["open_per_shard"]) if count <= 4 else [f"{min(row['open_per_shard'])}-"
                                                                  f"{max(row['open_per_shard'])}"]
        log(f"  {count} shard(s) (open per shard {'/'.join(spread)}), fill {row['fill_s']} s: "
            + ", ".join(f"{n} p50 {row[n]['page_ms'].get('p50')} ms" for n in QUERIES)
            + f"; all: {row['all']['redis_commands_per_page']} commands/page, "
            f"x{row['all']['page_p50_vs_one_shard']} the 1-shard p50")
        if "fanout" in row:
            f = row["fanout"]
            log(f"  fan-out: {f['threads']} threads; the shards' pages one after another p50 "
                f"{f['shard_pages_one_after_another_ms'].get('p50')} ms, their merge p50 "
                f"{f['merge_ms'].get('p50')} ms, the placement read p50 "
                f"{f['placement_read_ms'].get('p50')} ms")
        log(f"  cpu: driver {row['usage']['cpu_s']['driver']} s, redis {row['usage']['cpu_s']['redis']} s "
            f"in {row['usage']['wall_s']} s; other load {row['usage']['other_load_cores']} cores")
        save(args, out)
