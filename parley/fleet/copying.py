"""Copying a partition's keys from one shard to another, and deleting them from a shard.

What belongs to a partition P is said by schemas/moves.py; this is the Redis side of it:
every key of P's sessions and P's streams (inputs, results, every registered producer's input
stream of P), copied by DUMP/RESTORE REPLACE, which keeps consumer groups, pending entries and
TTLs; P's sessions' members of the shard-wide sets (interrupt index and its listing sets,
deadlines, expiring, idle, the list of sessions, pending counts); and their share of the
`stats` counters, added on the target in one MULTI with the `copied:P` mark. The clean deletes
the same from a shard (the source after a flip, a partial copy on a target after an undo).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import redis

from parley.schemas.keys import Keys
from parley.schemas.moves import (
    Holds,
    copied_field,
    held_of,
    in_partition,
    parked_of,
    partition_streams,
    session_key_pattern,
    session_of_key,
    session_of_member,
    shared_sets,
)

SCAN_COUNT = 1000

#: P's members of one shard-wide set: (key, kind, [(member, score or value)])
Members = tuple[str, Holds, list[tuple[str, Any]]]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Copier:
    """Finds, copies and deletes a partition's keys and members under `keys`' prefix."""

    def __init__(self, keys: Keys):
        self.keys = keys

    # ---- what P holds on a shard ---------------------------------------------------------
    def scan(self, r: redis.Redis, match: str) -> Iterator[str]:
        for key in r.scan_iter(match=match, count=SCAN_COUNT):
            yield text(key)

    def session_keys_of(self, r: redis.Redis, partition: int, partitions: int) -> list[tuple[str, str]]:
        """(session, key) of every key of P's sessions on `r`."""
        out = []
        for key in self.scan(r, session_key_pattern(self.keys)):
            session = session_of_key(self.keys, key)
            if session is not None and in_partition(session, partition, partitions):
                out.append((session, key))
        return out

    def streams_of(self, r: redis.Redis, partition: int, partitions: int) -> list[str]:
        producers: Any = r.hkeys(self.keys.producers)
        return partition_streams(self.keys, partition, partitions, [text(p) for p in producers or []])

    def members_of(self, r: redis.Redis, partition: int, partitions: int) -> list[Members]:
        """P's members of each shard-wide set on `r`: (key, kind, [(member, score or value)])."""
        out = []
        for shared in shared_sets(self.keys):
            names = list(self.scan(r, shared.name)) if shared.pattern else [shared.name]
            for name in names:
                if shared.holds is Holds.ZSET:
                    items: Iterator[tuple[Any, Any]] = r.zscan_iter(name, count=SCAN_COUNT)
                else:
                    items = r.hscan_iter(name, count=SCAN_COUNT)
                mine = []
                for member, value in items:
                    session = session_of_member(shared.form, text(member))
                    if session is not None and in_partition(session, partition, partitions):
                        mine.append((text(member), value))
                if mine:
                    out.append((name, shared.holds, mine))
        return out

    def stats_of(self, r: redis.Redis, sessions: set[str], anchors: list[Any]) -> tuple[int, int]:
        """P's share of the `held` and `parked` counters on `r`."""
        held = 0
        for session in sorted(sessions):
            core_raw = r.hget(self.keys.meta(session), "core")
            outbox: Any = r.hvals(self.keys.outbox(session))
            core = orjson.loads(core_raw) if core_raw else None
            held += held_of(core, [orjson.loads(v) for v in outbox or []])
        return held, parked_of(int(v) for v in anchors)

    # ---- copy ----------------------------------------------------------------------------
    def copy(self, src: redis.Redis, dst: redis.Redis, partition: int, partitions: int,
             target: int) -> tuple[int, int, int]:
        """P's keys, members and counters from `src` to `dst` (shard `target`), then the
        `copied:P` mark. Returns how many sessions, keys and members it copied."""
        session_keys = self.session_keys_of(src, partition, partitions)
        keys = [k for _s, k in session_keys] + self.streams_of(src, partition, partitions)
        copied = self.restore_keys(src, dst, keys)
        self.copy_producers(src, dst, partition, partitions)
        count, anchors = self.add_members(dst, self.members_of(src, partition, partitions))
        sessions = {s for s, _k in session_keys}
        held, parked = self.stats_of(src, sessions, anchors)
        # the counters and the mark in one MULTI: `repair` flips only a copy that counted
        tx = dst.pipeline(transaction=True)
        if held:
            tx.hincrby(self.keys.stats, "held", held)
        if parked:
            tx.hincrby(self.keys.stats, "parked", parked)
        tx.hset(self.keys.config, copied_field(partition), str(target))
        tx.execute()
        return len(sessions), copied, count

    def restore_keys(self, src: redis.Redis, dst: redis.Redis, keys: list[str]) -> int:
        """Each of `keys` DUMPed on `src` and RESTOREd (REPLACE) on `dst`, with its TTL; a key
        gone meanwhile is skipped. Returns how many it copied."""
        copied = 0
        for key in keys:
            # one MULTI: a key expiring between a DUMP and a PTTL read apart would come back
            # with PTTL -2, and RESTORE 0 would make it persistent on the target
            tx = src.pipeline(transaction=True)
            tx.dump(key)
            tx.pttl(key)
            dumped, ttl = tx.execute()
            if dumped is None or int(ttl) == -2:
                continue
            dst.restore(key, max(int(ttl), 0), dumped, replace=True)
            copied += 1
        return copied

    def add_members(self, dst: redis.Redis, members: list[Members]) -> tuple[int, list[Any]]:
        """`members` added to their sets on `dst`, in one pipeline. Returns how many, and the
        values of the interrupt anchors among them (the `parked` counter's share)."""
        pipe = dst.pipeline(transaction=False)
        anchors: list[Any] = []
        count = 0
        for name, holds, items in members:
            count += len(items)
            if holds is Holds.ZSET:
                pipe.zadd(name, {m: float(score) for m, score in items})
            else:
                pipe.hset(name, mapping={m: v for m, v in items})
                if name == self.keys.interrupt_anchors:
                    anchors = [v for _m, v in items]
        pipe.execute()
        return count, anchors

    def copy_producers(self, src: redis.Redis, dst: redis.Redis, partition: int, partitions: int) -> None:
        """The registration of each producer whose stream of P was copied, on a target that lacks
        it: the target's dispatchers read only the streams of producers registered there."""
        registry: Any = src.hgetall(self.keys.producers)
        for name, registration in (registry or {}).items():
            if src.exists(self.keys.producer_inputs(text(name), partition, partitions)):
                dst.hsetnx(self.keys.producers, name, registration)

    # ---- clean ---------------------------------------------------------------------------
    def clean(self, r: redis.Redis, partition: int, partitions: int, lower_stats: bool) -> int:
        """Delete P's keys and members on `r`; lower its counters by their share when they
        were counted there (the source; a partial copy on a target was never counted). The
        counters go in one MULTI with the metas and anchors that feed them, so a clean stopped
        half way and run again lowers them once. Returns how many keys and members it deleted."""
        session_keys = self.session_keys_of(r, partition, partitions)
        members = self.members_of(r, partition, partitions)
        anchors = next((items for name, _h, items in members if name == self.keys.interrupt_anchors), [])
        sessions = {s for s, _k in session_keys}
        tx = r.pipeline(transaction=True)
        if lower_stats:
            held, parked = self.stats_of(r, sessions, [v for _m, v in anchors])
            if held:
                tx.hincrby(self.keys.stats, "held", -held)
            if parked:
                tx.hincrby(self.keys.stats, "parked", -parked)
        metas = [self.keys.meta(s) for s in sorted(sessions)]
        if metas:
            tx.delete(*metas)
        if anchors:
            tx.hdel(self.keys.interrupt_anchors, *[m for m, _v in anchors])
        tx.execute()
        rest = [k for _s, k in session_keys if k not in metas] + self.streams_of(r, partition, partitions)
        return len(metas) + len(anchors) + self.delete_rest(r, rest, members)

    def delete_rest(self, r: redis.Redis, keys: list[str], members: list[Members]) -> int:
        """`keys` and `members` (but the interrupt anchors, which the clean's MULTI deleted)
        deleted on `r`, in one pipeline. Returns how many."""
        deleted = 0
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.delete(key)
        for name, holds, items in members:
            if name == self.keys.interrupt_anchors:
                continue
            if holds is Holds.ZSET:
                pipe.zrem(name, *[m for m, _v in items])
            else:
                pipe.hdel(name, *[m for m, _v in items])
            deleted += len(items)
        pipe.execute()
        return deleted + len(keys)
