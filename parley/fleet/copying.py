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
from pydantic import ValidationError

from parley.schemas.keys import Keys, partition_of
from parley.schemas.moves import (
    INDEXED_FIELD,
    Candidate,
    Holds,
    by_session_range,
    copied_field,
    held_of,
    in_partition,
    interrupt_candidates,
    interrupts_of,
    listed_candidates,
    parked_of,
    partition_streams,
    session_candidates,
    session_key_pattern,
    session_of_key,
    session_of_member,
    shared_sets,
)
from parley.schemas.state import Core

SCAN_COUNT = 1000
#: keys DUMPed (and RESTOREd) per round trip: few enough that a batch of big message hashes
#: stays a modest reply
RESTORE_BATCH = 64

#: P's members of one shard-wide set: (key, kind, [(member, score or value)])
Members = tuple[str, Holds, list[tuple[str, Any]]]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def core_of(raw: Any) -> Core | None:
    """A session's core as its meta holds it; None when it has none, or one that does not read
    (its listing is then not found by name, but nothing else of it is lost)."""
    if not raw:
        return None
    try:
        return Core.model_validate_json(raw)
    except ValidationError:
        return None


class Copier:
    """Finds, copies and deletes a partition's keys and members under `keys`' prefix."""

    def __init__(self, keys: Keys):
        self.keys = keys
        #: keys, members and list reads this copier has looked at (what a move costs, counted:
        #: a scan counts every key and member it meets)
        self.touched = 0

    # ---- what P holds on a shard ---------------------------------------------------------
    def scan(self, r: redis.Redis, match: str) -> Iterator[str]:
        for key in r.scan_iter(match=match, count=SCAN_COUNT):
            self.touched += 1
            yield text(key)

    def indexed(self, r: redis.Redis) -> bool:
        """Every session of `r` is in its partition's list (schemas/moves.py INDEXED_FIELD)."""
        return text(r.hget(self.keys.config, INDEXED_FIELD) or b"") == "1"

    def listed_sessions(self, r: redis.Redis, partition: int, partitions: int) -> list[str]:
        """P's list, without a session of another partition a producer's stream of P carried
        in (its list is by the stream it came on; its keys are its own partition's)."""
        listed = (text(s) for s in r.zrange(self.keys.partition_sessions(partition), 0, -1))
        return sorted(s for s in listed if in_partition(s, partition, partitions))

    def session_keys_of(self, r: redis.Redis, partition: int, partitions: int) -> list[tuple[str, str]]:
        """(session, key) of every key of P's sessions on `r`: from P's list of sessions when
        the shard is indexed (each session's own keys by name: O(P), whatever else the shard
        holds; a name that holds no key is skipped by the copy), else by scanning the shard."""
        if self.indexed(r):
            self.touched += 1
            return [(session, key) for session in self.listed_sessions(r, partition, partitions)
                    for key in self.keys.session_keys(session)]
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
        """P's members of each shard-wide set on `r`: (key, kind, [(member, score or value)]);
        looked up by P's sessions when the shard is indexed, else found by scanning every set."""
        if self.indexed(r):
            return self.members_of_sessions(r, self.listed_sessions(r, partition, partitions), partition,
                                            partitions)
        return self.scanned_members(r, partition, partitions)

    def members_of_sessions(self, r: redis.Redis, sessions: list[str], partition: int,
                            partitions: int) -> list[Members]:
        """The members of `sessions` (P's) in every shard-wide set, by exact lookups in three
        round trips (schemas/moves.py names the candidates): each session's by-session members
        and core, then what they name (its interrupts' entries, its listing under every status,
        its sub-agent timers, expiring, idle), then what each interrupt's details name (its
        listing by time, reason and principal, its anchor). The producers' pending counts are
        read whole (they hold only inputs admitted and not yet applied). O(P's members)."""
        pipe = r.pipeline(transaction=False)
        for session in sessions:
            low, high = by_session_range(session)
            pipe.zrange(self.keys.interrupts_by_session, low, high, bylex=True)
            pipe.hget(self.keys.meta(session), "core")
        replies = pipe.execute()
        self.touched += 2 * len(sessions)
        first: list[Candidate] = []
        raised_of: dict[str, str] = {}  # an interrupt's details member -> its raise time
        for n, session in enumerate(sessions):
            core = core_of(replies[2 * n + 1])
            first += session_candidates(self.keys, session, core)
            for interrupt_id, raised in interrupts_of(core, [text(m) for m in replies[2 * n] or []]).items():
                first += interrupt_candidates(self.keys, session, interrupt_id, raised)
                raised_of[Keys.index_member(session, interrupt_id)] = raised
        found_first = self.looked_up(r, first)
        later: list[Candidate] = []
        for candidate, value in found_first:
            if candidate.key == self.keys.interrupt_info:
                info = orjson.loads(value)
                if isinstance(info, dict):
                    later += listed_candidates(self.keys, info, raised_of[candidate.member])
        unique = list(dict.fromkeys(later))  # interrupts at one anchor name one anchors field
        grouped: dict[str, tuple[Holds, list[tuple[str, Any]]]] = {}
        for candidate, value in [*found_first, *self.looked_up(r, unique)]:
            grouped.setdefault(candidate.key, (candidate.holds, []))[1].append((candidate.member, value))
        members = [(key, holds, items) for key, (holds, items) in grouped.items()]
        return members + self.pending_of(r, partition, partitions)

    def pending_of(self, r: redis.Redis, partition: int, partitions: int) -> list[Members]:
        """P's sessions' pending counts, from each registered producer's pending hash read whole:
        it holds only the inputs admitted and not yet applied (a session not created yet among
        them), so it stays small whatever the shard holds."""
        out: list[Members] = []
        for producer in sorted(text(p) for p in (r.hkeys(self.keys.producers) or [])):
            mine = []
            for member, value in r.hscan_iter(self.keys.pending(producer), count=SCAN_COUNT):
                self.touched += 1
                if in_partition(text(member), partition, partitions):
                    mine.append((text(member), value))
            if mine:
                out.append((self.keys.pending(producer), Holds.HASH, mine))
        return out

    def looked_up(self, r: redis.Redis, candidates: list[Candidate]) -> list[tuple[Candidate, Any]]:
        """The candidates that are there, with their score (a sorted set's) or value (a hash's):
        one round trip."""
        if not candidates:
            return []
        pipe = r.pipeline(transaction=False)
        for c in candidates:
            if c.holds is Holds.ZSET:
                pipe.zscore(c.key, c.member)
            else:
                pipe.hget(c.key, c.member)
        self.touched += len(candidates)
        return [(c, v) for c, v in zip(candidates, pipe.execute(), strict=True) if v is not None]

    def scanned_members(self, r: redis.Redis, partition: int, partitions: int) -> list[Members]:
        """P's members of each shard-wide set on `r`, found by scanning every set (a shard not
        indexed: schemas/moves.py INDEXED_FIELD)."""
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
                    self.touched += 1
                    session = session_of_member(shared.form, text(member))
                    if session is not None and in_partition(session, partition, partitions):
                        mine.append((text(member), value))
                if mine:
                    out.append((name, shared.holds, mine))
        return out

    def stats_of(self, r: redis.Redis, sessions: set[str], anchors: list[Any]) -> tuple[int, int, set[str]]:
        """P's share of the `held` and `parked` counters on `r`, and which of `sessions` exist
        (their meta holds a core): one round trip, the partition being frozen meanwhile."""
        ordered = sorted(sessions)
        pipe = r.pipeline(transaction=False)
        for session in ordered:
            pipe.hget(self.keys.meta(session), "core")
            pipe.hvals(self.keys.outbox(session))
        replies = pipe.execute()
        held, existing = 0, set()
        for n, session in enumerate(ordered):
            core_raw, outbox = replies[2 * n], replies[2 * n + 1]
            if core_raw:
                existing.add(session)
            core = orjson.loads(core_raw) if core_raw else None
            held += held_of(core, [orjson.loads(v) for v in outbox or []])
        return held, parked_of(int(v) for v in anchors), existing

    # ---- the lists of sessions of a shard of an older release ------------------------------
    def index(self, r: redis.Redis, partitions: int, batch: int = 500, only: int | None = None) -> int:
        """Every session of `r` into its partition's list, then the shard marked indexed (so a
        move finds P's sessions in P's list from then on). One scan of the shard; safe while
        the deployment runs (each session is listed only if it still exists, in one step with
        the check), and again (nothing is listed twice). Returns how many it added. With
        `only`: that partition's sessions, and the mark is left as it is (a move's check, before
        its freeze, that P's list misses none)."""
        from parley.dispatcher.store import load_script  # the fleet's one Lua, kept with the rest
        script = load_script(r, "index_partition_sessions")
        added = 0
        pending: list[str] = []

        def flush() -> int:
            keys = [k for session in pending
                    for k in (self.keys.meta(session),
                              self.keys.partition_sessions(partition_of(session, partitions)))]
            done = int(script(keys=keys, args=pending)) if pending else 0
            pending.clear()
            return done

        for key in self.scan(r, f"{self.keys.prefix}:{{*}}:meta"):
            session = session_of_key(self.keys, key)
            if session is not None and (only is None or in_partition(session, only, partitions)):
                pending.append(session)
            if len(pending) >= batch:
                added += flush()
        added += flush()
        if only is None:
            r.hset(self.keys.config, INDEXED_FIELD, "1")
        return added

    # ---- copy ----------------------------------------------------------------------------
    def copy(self, src: redis.Redis, dst: redis.Redis, partition: int, partitions: int,
             target: int) -> tuple[int, int, int]:
        """P's keys, members and counters from `src` to `dst` (shard `target`), then the
        `copied:P` mark. Returns how many sessions, keys and members it copied."""
        session_keys = self.session_keys_of(src, partition, partitions)
        sessions = {s for s, _k in session_keys}
        listed = self.keys.partition_sessions(partition)
        # P's list on the target names every session before any of its keys is there: a copy
        # stopped half way is undone by cleaning the target by that list (`repair`), so nothing
        # it restored stays behind. Written here rather than copied, it is whole on the target
        # even from a source that is not indexed.
        if sessions:
            dst.zadd(listed, dict.fromkeys(sorted(sessions), 0))
        keys = [k for _s, k in session_keys] + self.streams_of(src, partition, partitions)
        copied = self.restore_keys(src, dst, keys)
        self.copy_producers(src, dst, partition, partitions)
        count, anchors = self.add_members(dst, self.members_of(src, partition, partitions))
        # names that hold no session (an input's refusal, kept for a while, names no session)
        # leave the list; the source's cores are the target's, P being frozen
        held, parked, existing = self.stats_of(src, sessions, anchors)
        # the list, the counters and the mark in one MULTI: `repair` flips only a whole copy
        tx = dst.pipeline(transaction=True)
        if sessions - existing:
            tx.zrem(listed, *sorted(sessions - existing))
        if held:
            tx.hincrby(self.keys.stats, "held", held)
        if parked:
            tx.hincrby(self.keys.stats, "parked", parked)
        tx.hset(self.keys.config, copied_field(partition), str(target))
        tx.execute()
        return len(sessions), copied, count

    def restore_keys(self, src: redis.Redis, dst: redis.Redis, keys: list[str]) -> int:
        """Each of `keys` DUMPed on `src` and RESTOREd (REPLACE) on `dst`, with its TTL; a key
        gone meanwhile is skipped. Returns how many it copied. RESTORE_BATCH keys a round trip
        each way (the partition is frozen meanwhile: round trips per key would be its freeze)."""
        copied = 0
        for start in range(0, len(keys), RESTORE_BATCH):
            batch = keys[start:start + RESTORE_BATCH]
            # one MULTI: a key expiring between a DUMP and a PTTL read apart would come back
            # with PTTL -2, and RESTORE 0 would make it persistent on the target
            tx = src.pipeline(transaction=True)
            for key in batch:
                tx.dump(key)
                tx.pttl(key)
            read = tx.execute()
            pipe = dst.pipeline(transaction=False)
            for n, key in enumerate(batch):
                dumped, ttl = read[2 * n], read[2 * n + 1]
                if dumped is None or int(ttl) == -2:
                    continue
                pipe.restore(key, max(int(ttl), 0), dumped, replace=True)
                copied += 1
            pipe.execute()
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
            held, parked, _existing = self.stats_of(r, sessions, [v for _m, v in anchors])
            if held:
                tx.hincrby(self.keys.stats, "held", -held)
            if parked:
                tx.hincrby(self.keys.stats, "parked", -parked)
        metas = [self.keys.meta(s) for s in sorted(sessions)]
        if metas:
            tx.delete(*metas)
        # every member in the same MULTI as the metas: they are found from the sessions' cores,
        # which a clean run again after a stop would no longer have
        removed = 0
        for name, holds, items in members:
            if holds is Holds.ZSET:
                tx.zrem(name, *[m for m, _v in items])
            else:
                tx.hdel(name, *[m for m, _v in items])
            removed += len(items)
        tx.execute()
        deleted_metas = set(metas)  # a set: a partition's keys are many
        rest = [k for _s, k in session_keys if k not in deleted_metas]
        rest += self.streams_of(r, partition, partitions)
        rest.append(self.keys.partition_sessions(partition))  # last: a clean run again still finds them
        return len(metas) + removed + self.delete_rest(r, rest)

    def delete_rest(self, r: redis.Redis, keys: list[str]) -> int:
        """`keys` deleted on `r`, in one pipeline, in order. Returns how many were there."""
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.delete(key)
        return sum(int(n) for n in pipe.execute())
