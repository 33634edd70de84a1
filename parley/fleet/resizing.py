"""A larger partition count for a stopped deployment: `parley partitions resize --to M`.

The partition count N bounds a deployment's shards (at most one per partition) and its busy
dispatchers per shard; it is fixed while the deployment runs. Resizing multiplies it, M = k x N,
while every Parley process is stopped: then a session's new partition (crc32 mod M) is
congruent to its old one mod N, so the table places partition p' on the shard of p' mod N and
**no session changes shard**: what changes is the count in `<prefix>:config` (and the table,
with several shards), each shard's per-partition lists of sessions (`partition:<p>:sessions`,
each session listed under its new partition) and nothing else. The streams of the new
partitions are made by their dispatchers when they start.

Refused, with every reason found and nothing changed, unless every shard answers and each is
quiet: no dispatcher registered in the last 30 s and no partition lease held, no live RQ worker,
no job queued, in flight or running, and every input and results stream empty (all applied; a
dispatcher deletes what it applied). Run again after a stop half way (a shard unreachable,
Ctrl-C), it finishes: the count already written, it lists the sessions under their partitions.

A producer left running across the resize still sends with the old count: its inputs land on
the stream of the session's old partition, where that partition's dispatcher moves each to its
own partition's stream (dispatcher/consume.py, `forward_strays`). Restart producers after the
resize all the same: their reads of a session follow the new count only then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from parley.client.shards import Shards, read_view
from parley.fleet.copying import Copier, text
from parley.fleet.move_errors import MoveError
from parley.fleet.move_lock import LockHeld, MoveLock
from parley.fleet.placement_writes import PlacementWriter
from parley.schemas.jobs import JOBS
from parley.schemas.keys import Keys, partition_of
from parley.schemas.shards import PlacementError, agreed_placement, check_order, check_resize

#: a dispatcher registered this recently may still be running
QUIET_MS = 30_000
RELIST_BATCH = 500


@dataclass(frozen=True, slots=True)
class Resized:
    """What a resize did: the count before and after, sessions listed anew, the table's version
    (None: one Redis, no table)."""

    before: int
    after: int
    relisted: int
    version: int | None


def resize(shards: Shards, to: int) -> Resized:
    """The deployment `shards` names (every shard) resized to `to` partitions; MoveError saying
    every reason it cannot be now (see the module's docstring)."""
    keys = shards.keys
    try:
        lock = MoveLock(shards.clients, keys.partitions_lock).__enter__()
    except LockHeld as exc:
        raise MoveError(str(exc)) from None
    try:
        return _resize(shards, keys, to, lambda: lock.lost)
    finally:
        lock.__exit__(None, None, None)


def _resize(shards: Shards, keys: Keys, to: int, lock_lost: Callable[[], bool]) -> Resized:
    views = shards.views()  # every shard: a resize is not done with one of them missing
    try:
        check_order(views)
    except PlacementError as exc:
        raise MoveError(str(exc)) from None
    counts = {v.partitions for v in views if v.partitions is not None}
    if not counts:
        raise MoveError("no dispatcher has ever served this deployment: start it with --partitions "
                        f"{to} instead")
    if len(counts) > 1:
        return _finish(shards, keys, views, counts, to, lock_lost)
    now = counts.pop()
    try:  # the table every shard holds, from the views just read
        placement = agreed_placement(views) if shards.sharded else None
    except PlacementError as exc:
        raise MoveError(str(exc)) from None
    if now == to:
        before = placement.partitions if placement is not None else now
        for r in shards.clients:  # a run stopped after the count was written
            unsuffixed(r, keys, to)
        relisted = sum(relist(r, keys, to) for r in shards.clients)
        return Resized(before, to, relisted, None if placement is None else placement.version)
    try:
        check_resize(now, to)
        resized = placement.resized(to) if placement is not None else None
    except PlacementError as exc:
        raise MoveError(str(exc)) from None
    problems = [f"shard {i}: {why}" for i, r in enumerate(shards.clients) for why in busy(r, keys, now)]
    copier = Copier(keys)
    problems += [f"shard {i}: its sessions are not all in their partitions' lists: run `parley "
                 "partitions index` first" for i, r in enumerate(shards.clients) if not copier.indexed(r)]
    if problems:
        raise MoveError("the deployment is not stopped, so it cannot be resized (nothing was changed):\n  "
                        + "\n  ".join(problems))
    if resized is not None:
        writer = PlacementWriter(shards, lock_lost)
        for i in reversed(range(len(shards.clients))):  # shard 0 last: found there, found everywhere
            held = read_view(shards.clients[i], keys, i).placement
            writer.write(i, resized, None if held is None else held.version)
    else:
        shards.clients[0].hset(keys.config, "partitions", to)
    for r in shards.clients:
        if now == 1:
            unsuffixed(r, keys, to)
        r.delete(*(keys.lease(p) for p in range(now)))
    relisted = sum(relist(r, keys, to) for r in shards.clients)
    return Resized(now, to, relisted, None if resized is None else resized.version)


def _finish(shards: Shards, keys: Keys, views: list[Any], counts: set[int], to: int,
            lock_lost: Callable[[], bool]) -> Resized:
    """A resize to `to` that stopped between shards' table writes: the newest table (of `to`
    partitions) written on the shards that hold the one before, the old leases deleted, the
    sessions listed. Any other mix of counts is refused."""
    newest = max((v.placement for v in views if v.placement is not None), key=lambda p: p.version,
                 default=None)
    before = min(counts)
    if newest is None or len(counts) != 2 or newest.partitions != to or to % before \
            or newest.shards != len(views):
        raise MoveError(f"the shards hold different partition counts ({sorted(counts)}): run the "
                        "resize that stopped half way again, with its --to and every shard's URL")
    problems = [f"shard {i}: {why}" for i, r in enumerate(shards.clients) for why in busy(r, keys, before)]
    if problems:
        raise MoveError("the deployment is not stopped, so the resize cannot be finished (nothing was "
                        "changed):\n  " + "\n  ".join(problems))
    writer = PlacementWriter(shards, lock_lost)
    for v in reversed(views):
        if v.placement != newest:
            writer.write(v.index, newest, None if v.placement is None else v.placement.version)
    for r in shards.clients:
        r.delete(*(keys.lease(p) for p in range(before)))
    relisted = sum(relist(r, keys, to) for r in shards.clients)
    return Resized(before, to, relisted, newest.version)


def unsuffixed(r: redis.Redis, keys: Keys, to: int) -> None:
    """One partition's streams have no suffix, and are not read again at `to` partitions: an
    input that reached one after the checks (a producer not stopped) is moved to its session's
    partition's stream, then the streams are deleted (a results stream only when empty)."""
    producers = [text(p) for p in r.hkeys(keys.producers)]
    for stream in (keys.inputs(0, 1), *(keys.producer_inputs(p, 0, 1) for p in producers)):
        entries: Any = r.xrange(stream)
        for entry_id, fields in entries:
            session = text(fields.get(b"session", b""))
            if not session:  # no session to place it by: to the rejected stream, as a bad input
                pipe = r.pipeline(transaction=True)
                pipe.xadd(keys.rejected, {**fields, b"error": b"no session, on a one-partition stream at a "
                                                               b"resize"})
                pipe.xdel(stream, entry_id)
                pipe.execute()
                continue
            pipe = r.pipeline(transaction=True)
            pipe.xadd(f"{stream}:{partition_of(session, to)}", fields)
            pipe.xdel(stream, entry_id)
            pipe.execute()
        r.delete(stream)
    if not r.xlen(keys.results(0, 1)):
        r.delete(keys.results(0, 1))


def busy(r: redis.Redis, keys: Keys, partitions: int) -> list[str]:
    """What keeps this shard from being resized now: live processes, jobs, unapplied inputs."""
    problems = []
    now_ms = int(time.time() * 1000)
    live = [text(d) for d in r.zrangebyscore(keys.dispatchers, now_ms - QUIET_MS, "+inf")]
    if live:
        problems.append(f"dispatcher(s) {', '.join(live)} registered in the last {QUIET_MS // 1000} s: stop "
                        "every dispatcher (and wait that long)")
    held = [text(k) for k in r.scan_iter(match=f"{keys.prefix}:lease:*", count=1000)]
    if held:
        problems.append(f"{len(held)} partition lease(s) held: stop every dispatcher")
    workers: Any = r.smembers("rq:workers")
    alive = [text(w) for w in workers or () if r.exists(text(w))]
    if alive:
        problems.append(f"{len(alive)} RQ worker(s) alive: stop every worker")
    jobs = int(r.hlen(keys.inflight)) + int(r.hlen(keys.running))
    jobs += sum(int(r.llen(f"rq:queue:{keys.queue(spec.queue)}")) for spec in JOBS.values())
    if jobs:
        problems.append(f"{jobs} job(s) queued, in flight or running: let the workers finish them")
    producers = [text(p) for p in r.hkeys(keys.producers)]
    streams = [s for p in range(partitions)
               for s in (keys.inputs(p, partitions), keys.results(p, partitions),
                         *(keys.producer_inputs(q, p, partitions) for q in producers))]
    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xlen(s)
    unapplied = {s: int(n) for s, n in zip(streams, pipe.execute(), strict=True) if int(n)}
    if unapplied:
        some = ", ".join(f"{s} ({n})" for s, n in list(unapplied.items())[:5])
        problems.append(f"{sum(unapplied.values())} entr(ies) not yet applied in {len(unapplied)} stream(s), "
                        f"{some}: stop the producers and let the dispatchers apply them first")
    return problems


def relist(r: redis.Redis, keys: Keys, partitions: int) -> int:
    """Every session of a partition list of `r` listed under its partition of `partitions`
    (moved from the list it is in when that is another). Returns how many moved."""
    moved = 0
    lists = [text(k) for k in r.scan_iter(match=f"{keys.prefix}:partition:*:sessions", count=1000)]
    for name in lists:
        here = int(name.split(":")[-2])
        start = 0
        while True:
            members = [text(m) for m in r.zrange(name, start, start + RELIST_BATCH - 1)]
            if not members:
                break
            away = [(s, partition_of(s, partitions)) for s in members]
            away = [(s, p) for s, p in away if p != here]
            if away:
                pipe = r.pipeline(transaction=True)
                for s, p in away:
                    pipe.zadd(keys.partition_sessions(p), {s: 0})
                pipe.zrem(name, *(s for s, _p in away))
                pipe.execute()
                moved += len(away)
            start += len(members) - len(away)  # what stayed; the moved are gone from the list
    return moved
