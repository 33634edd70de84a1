"""Apply prepared entries: waves of distinct sessions, commits fenced by the lease, rejections.

One path for every entry (docs/design.md, "Consuming streams", waves): a wave is one
pipelined load of its sessions, the pure transitions, and one pipeline of commit scripts.
Each commit writes the transition together with the session's "entry applied" marker, so a
replay is a no-op; an entry whose commit met a version conflict goes round again (reload,
recompute, commit) in a smaller wave until it commits; a fenced commit (LEASE_LOST) stops
the batch; an exception computing one transition rejects that entry alone. What a commit
asks the shell to do next (its effects) is handed over, unread, to the tick's `Batch`,
which the settle flushes.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis import Redis
from redis.exceptions import WatchError

from parley.dispatcher.core import Context, Effect, Transition
from parley.dispatcher.core.effects import split_effects
from parley.dispatcher.entries import EntryDecoder, Prepared, Refused, already_applied, poisoned
from parley.dispatcher.leases import LeaseLost, Leases, Partition
from parley.dispatcher.rejected import rejected_copy
from parley.dispatcher.scripts import LUA
from parley.dispatcher.store import COMMITTED, CONFLICT, IDEMPOTENCY_WINDOW_MS, LEASE_LOST, Store, now_ms
from parley.runtime import metrics, telemetry
from parley.runtime.logs import kv
from parley.schemas.codec import session_of
from parley.schemas.codes import InputOutcome
from parley.schemas.keys import Keys
from parley.schemas.producers import Producer
from parley.schemas.state import SessionState

log = logging.getLogger("parley.dispatcher")

REJECTED_MAXLEN = 10_000
# Fairness (docs/design.md, "Consuming streams"): a tick applies at most this many entries of one
# session from one stream; the rest wait, still pending, for the next tick, so a flooded session
# costs every other session at most this many waves a tick.
SESSION_DEPTH = 8
# A pending input admitted by the submit function is done: its producer's count for the session
# goes down by one, and the field goes once it reaches zero (never below). The pending hash is
# the producer's own key: whatever it did to it (another type, a count that cannot go down),
# this must not fail, because it runs inside the MULTI that acknowledges every producer's entries
# (the settle) and an error there is raised again at each replay. A key that is not a hash (or
# is gone) is skipped, and so is a count HINCRBY refuses; the reply is how many were skipped
# (counted in parley_pending_counts_skipped_total, logged).
PENDING_DONE = """
local skipped = 0
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key)['ok'] == 'hash' then
    local n = redis.pcall('HINCRBY', key, ARGV[i], -1)
    if type(n) ~= 'number' then skipped = skipped + 1
    elseif n <= 0 then redis.call('HDEL', key, ARGV[i]) end
  else
    skipped = skipped + 1
  end
end
return skipped
"""


def pending_skipped(reply: Any, keys: list[str]) -> None:
    """Count and log what PENDING_DONE could not take off (its reply: how many it skipped)."""
    if isinstance(reply, int) and reply > 0:
        metrics.PENDING_SKIPPED.inc(reply)
        log.error("pending counts not taken off: a producer's pending hash is not a hash, or a count "
                  "not an integer (the producer may have written it); delete the key to reset it",
                  extra=kv(skipped=reply, keys=",".join(sorted(set(keys)))))
# What XREADGROUP answers: [(stream, [(entry id, fields), ...]), ...]
Replies = list[tuple[Any, list[Any]]]


@dataclass
class Stats:
    applied: int = 0
    replays: int = 0
    rejected: int = 0
    dropped: int = 0
    conflicts: int = 0
    # waves of distinct sessions (a conflicted entry's extra rounds are not counted again)
    waves: int = 0
    counts: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class Batch:
    """What one tick did, held until its settle: one settle (one MULTI) flushes `effects` and
    acknowledges `acks`, and may read the next tick's entries into `ahead`. A fresh Batch per
    tick means a tick that failed before its settle leaves nothing behind: its entries stay
    pending and are replayed."""

    # stream -> ids of its entries applied, replayed or rejected
    acks: dict[str, list[str]] = field(default_factory=dict)
    # (session, effects) of every commit, and what replays found still in an outbox
    effects: list[tuple[str, list[Effect]]] = field(default_factory=list)
    # the next entries, read by the settle's MULTI
    ahead: Replies | None = None
    # stream -> (pending-count key, session) of its acknowledged entries that the submit function
    # admitted: decremented in the MULTI that acknowledges them, so exactly once
    done: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def ack(self, stream: str, entry_id: str) -> None:
        self.acks.setdefault(stream, []).append(entry_id)


@dataclass(slots=True)
class Held:
    """An entry read and checked (Prepared or Refused), with the session it belongs to (None for
    an entry that names no valid session): what fairness orders by; and its size in bytes."""

    entry_id: str
    fields: dict[Any, Any]
    prep: Any  # Prepared | Refused
    session: str | None
    # the entry's size (schemas/codec.py entry_bytes): what the backlog's byte bound counts
    size: int = 0


def take_fair(held: list[Held], depth: int = SESSION_DEPTH) -> tuple[list[Held], list[Held]]:
    """Split entries (in stream order) into those a tick applies and those left for the next:
    at most `depth` of each session now. Once one of a session's entries waits, every later one
    of that session waits too, so each session's order holds; an entry with no session does not
    wait. Pure, so the rule is tested without Redis."""
    now: list[Held] = []
    later: list[Held] = []
    taken: dict[str, int] = {}
    for h in held:
        if h.session is None:
            now.append(h)
            continue
        n = taken.get(h.session, 0)
        if n >= depth:
            later.append(h)
            continue
        taken[h.session] = n + 1
        now.append(h)
    return now, later


def waves(queued: list[Prepared]) -> list[list[Prepared]]:
    """Entries in stream order, split so that each session appears at most once a wave: a
    session's n-th entry goes to wave n. Sessions are independent of each other (a transition
    reads and writes its own session only), so only their own order must be kept."""
    out: list[list[Prepared]] = []
    depth: dict[str, int] = {}
    for prep in queued:
        n = depth.get(prep.session, 0)
        depth[prep.session] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(prep)
    return out


@dataclass(slots=True)
class Ready:
    """A transition computed from a loaded version, waiting for its commit."""

    prep: Prepared
    version: str
    tr: Transition


class Applier:
    def __init__(self, redis: Redis, keys: Keys, store: Store, leases: Leases, decoder: EntryDecoder,
                 stats: Stats):
        self.redis = redis
        self.keys = keys
        self.store = store
        self.leases = leases
        self.decoder = decoder
        self.stats = stats
        # the producer whose stream this is (None: the engine's own streams)
        self.producer_of: Callable[[str], Producer | None] = lambda _stream: None

    def apply(self, p: Partition, stream: str, queued: list[Prepared], batch: Batch) -> None:
        """Apply entries of one stream of p, in waves; raise LeaseLost when p is no longer ours."""
        for wave in waves(queued):
            self.leases.check(p)
            self.stats.waves += 1
            while wave:
                wave = self._round(p, stream, wave, batch)

    def _round(self, p: Partition, stream: str, wave: list[Prepared], batch: Batch) -> list[Prepared]:
        """Distinct sessions: one round trip loads them all, the transitions are computed, one
        round trip commits them all (a pipeline of EVALSHAs, each atomic and fenced by itself).
        Returns the entries that met a version conflict, to go round again."""
        started, started_ns = time.perf_counter(), time.time_ns()
        loaded = self.store.load_many([(prep.session, prep.idem) for prep in wave])
        ctx = self.decoder.context(p.streams[1])
        ready = [r for prep, (state, version) in zip(wave, loaded, strict=True)
                 if (r := self._compute(p, stream, prep, state, version, ctx, batch)) is not None]
        if not ready:
            return []
        rcs = self.store.commit_many([(r.prep.session, r.version, r.tr) for r in ready],
                                     self.keys.lease(p.n), p.token, self.leases.partitions)
        lost = False
        conflicted: list[Prepared] = []
        for r, rc in zip(ready, rcs, strict=True):
            if rc == COMMITTED:
                self._committed(stream, r, started, batch)
                if telemetry.enabled():
                    self._traced(stream, r, started_ns)
            elif rc == LEASE_LOST:
                lost = True  # those committed before it are recorded (flushed, acknowledged)
            else:
                assert rc == CONFLICT
                # another writer moved the session on between our load and commit
                self.stats.conflicts += 1
                conflicted.append(r.prep)
        if lost:
            raise LeaseLost()
        return conflicted

    def _compute(self, p: Partition, stream: str, prep: Prepared, state: SessionState, version: str,
                 ctx: Context, batch: Batch) -> Ready | None:
        """The entry's transition, or None when there is nothing to commit: a replay (its effects
        still in the outbox go to the batch) or a poison entry (rejected; the wave goes on)."""
        if already_applied(state.applied.get(stream), prep.entry_id):
            self.stats.replays += 1
            metrics.REPLAYS.inc()
            batch.effects.append((prep.session, self.store.pending_effects(prep.session)))
            batch.ack(stream, prep.entry_id)
            self._done(stream, prep.fields, prep.session, batch)
            return None
        try:
            tr = prep.compute(state, ctx)
        except Exception as exc:  # nothing of it is committed
            refused = poisoned(stream, prep.entry_id, exc)
            refused.uses_key = prep.idem  # verified and decoded: its key counts as used
            self.reject(p, stream, prep.entry_id, prep.fields, refused, batch)
            return None
        tr.state.applied[stream] = prep.entry_id
        return Ready(prep, version, tr)

    def _committed(self, stream: str, r: Ready, started: float, batch: Batch) -> None:
        session, tr = r.prep.session, r.tr
        self.stats.applied += 1
        if tr.dropped:
            self.stats.dropped += 1
            log.info("outcome dropped", extra=kv(session=session, entry=r.prep.entry_id, why=tr.dropped))
        for key, n in tr.counts.items():
            self.stats.counts[key] = self.stats.counts.get(key, 0) + n
        # its jobs were enqueued by the commit itself; the rest is in its outbox, for the settle
        batch.effects.append((session, split_effects(tr.effects)[1]))
        batch.ack(stream, r.prep.entry_id)
        self._done(stream, r.prep.fields, session, batch)
        metrics.record_transition(tr, time.perf_counter() - started)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("applied", extra=kv(session=session, stream=stream, entry=r.prep.entry_id,
                                          events=len(tr.events), effects=len(tr.effects)))

    def _traced(self, stream: str, r: Ready, started_ns: int) -> None:
        """The transition's span, in the trace of the turn it touched, and the core's spans."""
        tr, prep = r.tr, r.prep
        attributes: dict[str, str | int] = {"parley.session": prep.session, "parley.entry": prep.entry_id,
                                            "parley.stream": stream, "parley.events": len(tr.events)}
        if tr.input_outcome is not None:
            attributes["parley.input.type"], attributes["parley.input.outcome"] = \
                tr.input_outcome[0], str(tr.input_outcome[1])
        if tr.dropped is not None:
            attributes["parley.outcome.dropped"] = str(tr.dropped)
        telemetry.transition(tr.trace, started_ns, time.time_ns(), dict(attributes), tr.spans)

    def pending_done(self, stream: str, fields: dict[Any, Any],
                     session: str | None) -> tuple[str, str] | None:
        """The pending count an entry's acknowledgement takes one off: (key, session) for an entry
        of a producer's stream that the submit function admitted (field `admitted` = 1)."""
        if session is None or fields.get(b"admitted", fields.get("admitted")) not in (b"1", "1"):
            return None
        producer = self.producer_of(stream)
        return None if producer is None else (self.keys.pending(producer.name), session)

    def _done(self, stream: str, fields: dict[Any, Any], session: str, batch: Batch) -> None:
        if (done := self.pending_done(stream, fields, session)) is not None:
            batch.done.setdefault(stream, []).append(done)

    def reject(self, p: Partition, stream: str, entry_id: str, fields: dict[Any, Any], refused: Refused,
               batch: Batch) -> None:
        """Bad entries are never lost: copied with the error to the rejected stream (docs/protocol.md,
        "Rejected entries": cut to a bounded size), reported on their session (`input.refused`)
        and acknowledged, in one MULTI. A session that does not exist keeps that report only
        for the unknown-session TTL (reject.lua). An entry of a producer naming a session it may
        not write (another tenant's) is not reported there: a producer cannot write even a
        refusal into another tenant's events.

        Fenced by p's lease, as the settle is: the lease key is WATCHed and its token checked,
        so during a handover only the holder rejects an entry (once: one refusal, one pending
        count taken off); LeaseLost otherwise, and the entry stays pending for the holder."""
        exc, code = refused.error, refused.code
        pipe = self.redis.pipeline(transaction=True)
        try:
            self._reject(pipe, p, stream, entry_id, fields, refused)
        except WatchError:
            raise LeaseLost() from None
        finally:
            pipe.reset()
        self.stats.rejected += 1
        metrics.INPUTS.labels(exc.input_type or "unknown", InputOutcome.REJECTED, code).inc()
        batch.ack(stream, entry_id)
        log.info("entry rejected", extra=kv(stream=stream, entry=entry_id, session=session_of(fields),
                                            error=str(exc)[:200]))

    def _reject(self, pipe: Any, p: Partition, stream: str, entry_id: str, fields: dict[Any, Any],
                refused: Refused) -> None:
        exc, code = refused.error, refused.code
        lease = self.keys.lease(p.n)
        pipe.watch(lease)
        token = pipe.get(lease)
        if (token.decode() if isinstance(token, bytes) else token) != p.token:
            raise LeaseLost()
        pipe.multi()
        pipe.xadd(self.keys.rejected, rejected_copy(fields, str(exc), stream, entry_id),
                  maxlen=REJECTED_MAXLEN, approximate=True)
        session = session_of(fields)
        producer = self.producer_of(stream)
        if session is not None and (producer is None or producer.allows(session)):
            event = {"type": "input.refused", "at": int(time.time() * 1000),
                     "input": {"entry": entry_id, "type": exc.input_type, **exc.ids},
                     "code": code, "message": str(exc)}
            # docs/protocol.md, "Writing inputs": a key counts as used whatever became of its
            # entry, but only a verified entry's key (`uses_key` is None for any other)
            now = now_ms()
            # EVAL, not EVALSHA: inside a MULTI a NOSCRIPT could not be retried (Redis keeps it cached)
            pipe.eval(_REJECT_SCRIPT, 3, self.keys.meta(session), self.keys.events(session),
                      self.keys.idempotency_keys(session), orjson.dumps(event), self.store.events_maxlen,
                      refused.uses_key or "", now + IDEMPOTENCY_WINDOW_MS, now,
                      self.store.unknown_session_ttl_ms)
        if (done := self.pending_done(stream, fields, session)) is not None:
            pipe.eval(PENDING_DONE, 1, done[0], done[1])
        pipe.xack(stream, self.keys.GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        replies = pipe.execute()
        if done is not None:
            pending_skipped(replies[-3], [done[0]])


_REJECT_SCRIPT = LUA.source("reject")
