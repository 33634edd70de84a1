"""Redis shell around the core: load a session's state, commit a transition atomically."""

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from parley.dispatcher.core import Effect, Transition, effect_from_dict, effect_to_json
from parley.dispatcher.core.effects import split_effects
from parley.dispatcher.scripts import LUA
from parley.schemas.events import FEED_EVENT_TYPES
from parley.schemas.keys import Keys, partition_of
from parley.schemas.state import SessionState, bodies_wanted
from parley.schemas.tree import Shape

if TYPE_CHECKING:
    from parley.dispatcher.enqueue import JobMaker

IDEMPOTENCY_TTL_S = 24 * 3600
IDEMPOTENCY_WINDOW_MS = IDEMPOTENCY_TTL_S * 1000
DEFAULT_EVENTS_MAXLEN = 10_000
# The feed serves the whole fleet: at a few hundred interrupt and turn events a second this is
# minutes of history for a notifier to catch up on after a restart (docs/operations.md).
DEFAULT_FEED_MAXLEN = 100_000
# An input naming a session that does not exist leaves its refusal (or ignore) readable this
# long, for a client waiting on it, then nothing: bad inputs leave no garbage (docs/protocol.md).
DEFAULT_UNKNOWN_SESSION_TTL_S = 600

COMMITTED, CONFLICT, LEASE_LOST = 1, 0, -1
#: RQ's set of queue keys (rq.Queue.redis_queues_keys), which an enqueue adds its queue to
RQ_QUEUES = "rq:queues"


def evalsha_many(redis: Redis, script: Script, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
    """One script over many (keys, args), in ONE round trip (a pipeline, not a MULTI: each
    call is atomic by itself), its replies in order; an error reply is raised.

    EVALSHA directly, not through the Script object: a Script in a pipeline first asks SCRIPT
    EXISTS, an extra round trip, and a command the dispatcher's login does not have. A NOSCRIPT
    reply (Redis restarted, or its script cache was flushed) ran nothing, so those calls are
    sent again once the script is loaded."""
    if not calls:
        return []

    def send(batch: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        pipe = redis.pipeline(transaction=False)
        for keys, args in batch:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))

    replies = send(calls)
    missing = [i for i, rc in enumerate(replies) if isinstance(rc, NoScriptError)]
    if missing:
        script.sha = redis.script_load(script.script)
        for i, rc in zip(missing, send([calls[i] for i in missing]), strict=True):
            replies[i] = rc
    for rc in replies:
        if isinstance(rc, Exception):
            raise rc
    return replies


def load_script(redis: Redis, name: str) -> Script:
    """A Lua script of dispatcher/lua/ with the libraries it requires, registered once (EVALSHA,
    loaded again if flushed)."""
    return LUA.register(redis, name)


class Store:
    def __init__(self, redis: Redis, keys: Keys, events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
                 feed_maxlen: int = DEFAULT_FEED_MAXLEN,
                 unknown_session_ttl_ms: int = DEFAULT_UNKNOWN_SESSION_TTL_S * 1000,
                 jobs: "JobMaker | None" = None):
        self.redis = redis
        self.keys = keys
        if jobs is None:
            # enqueue.py imports this module (load_script): imported here, once both are loaded
            from parley.dispatcher.enqueue import JobMaker
            jobs = JobMaker(redis, keys)
        #: prepares the RQ jobs a commit enqueues itself (docs/design.md, "The enqueue path")
        self.jobs = jobs
        self.events_maxlen = events_maxlen
        self.feed_maxlen = feed_maxlen
        self.unknown_session_ttl_ms = unknown_session_ttl_ms
        # the in-flight numbering is shared with record_inflight.lua (both require inflight_lib)
        self._commit = LUA.register(redis, "commit")

    def load(self, session: str, idempotency_key: str | None = None) -> tuple[SessionState, str]:
        """`load_many` of one session."""
        return self.load_many([(session, idempotency_key)])[0]

    def load_many(self, wanted: Sequence[tuple[str, str | None]]) -> list[tuple[SessionState, str]]:
        """Each session's version, core, markers and tree shape (its meta hash, whole), and whether
        its idempotency key was used, for several distinct sessions (session, idempotency key),
        in ONE round trip. Never its messages: a second round trip reads the few bodies a
        transition may need (`bodies_wanted`: a sub-agent's child about to report), or, once, all
        of them for a session stored before its shape was kept."""
        pipe = self.redis.pipeline(transaction=False)
        for session, idempotency_key in wanted:
            self._queue_load(pipe, session, idempotency_key)
        replies = pipe.execute()
        out: list[tuple[SessionState, str]] = []
        i = 0
        for _session, idempotency_key in wanted:
            n = 1 if idempotency_key is None else 2
            out.append(self._loaded(replies[i:i + n], idempotency_key is not None))
            i += n
        self._load_bodies([session for session, _ in wanted], [state for state, _ in out])
        return out

    def _queue_load(self, pipe: Any, session: str, idempotency_key: str | None) -> None:
        pipe.hgetall(self.keys.meta(session))
        if idempotency_key is not None:
            pipe.zscore(self.keys.idempotency_keys(session), idempotency_key)

    @staticmethod
    def _loaded(replies: list[Any], has_key: bool) -> tuple[SessionState, str]:
        meta: dict[bytes, bytes] = replies[0]
        core = meta.get(b"core")
        shape = Shape.from_fields(meta) if core else None
        state = SessionState.from_records(core, {}, meta.get(b"applied"),
                                          duplicate=has_key and is_used(replies[1], now_ms()),
                                          tree=shape.flat if shape is not None else None)
        if shape is not None and state.core is not None and state.core.n_msgs != len(shape):
            # Messages were added by a dispatcher that does not keep the shape (an older one,
            # after a downgrade or during a mixed rolling restart): the shape is stale. Read the
            # messages whole, as for a session that never had one; the commit writes it anew.
            state.tree = None
        ver = meta.get(b"ver")
        return state, ver.decode() if ver else "0"

    def _load_bodies(self, sessions: Sequence[str], states: Sequence[SessionState]) -> None:
        """The bodies the transitions may read (one round trip for all, none when none is needed)."""
        asked: list[tuple[SessionState, list[str] | None]] = []
        pipe = self.redis.pipeline(transaction=False)
        for session, state in zip(sessions, states, strict=True):
            if state.core is None:
                continue
            if state.tree is None:  # stored before the shape was kept: read whole, once
                pipe.hgetall(self.keys.messages(session))
                asked.append((state, None))
            elif wanted := bodies_wanted(state.core):
                pipe.hmget(self.keys.messages(session), wanted)
                asked.append((state, wanted))
        if not asked:
            return
        for (state, ids), reply in zip(asked, pipe.execute(), strict=True):
            raw = reply if ids is None else {mid.encode(): v for mid, v in zip(ids, reply, strict=True) if v}
            state.messages = {k.decode(): orjson.loads(v) for k, v in raw.items()}

    def commit(self, session: str, version: str, tr: Transition, lease_key: str,
               lease_token: str, partitions: int) -> int:
        """Commit `tr` of `session` at `version`, fenced by the lease; `partitions`: N, which
        names the session's partition's list of sessions (by the session, whatever stream the
        input came on)."""
        keys, argv = self._commit_args(session, version, tr, lease_key, lease_token, partitions)
        return int(self._commit(keys=keys, args=argv))

    def commit_many(self, batch: Sequence[tuple[str, str, Transition]], lease_key: str,
                    lease_token: str, partitions: int) -> list[int]:
        """`commit` of several (session, version, transition) in ONE round trip: a pipeline,
        not a MULTI; each EVALSHA is atomic by itself and answers for its own transition
        (COMMITTED, CONFLICT or LEASE_LOST), in order."""
        if len(batch) == 1:
            return [self.commit(*batch[0], lease_key, lease_token, partitions)]
        calls = [self._commit_args(session, version, tr, lease_key, lease_token, partitions)
                 for session, version, tr in batch]
        return [int(rc) for rc in evalsha_many(self.redis, self._commit, calls)]

    def _commit_args(self, session: str, version: str, tr: Transition, lease_key: str,
                     lease_token: str, partitions: int) -> tuple[list[str], list[Any]]:
        k = self.keys
        core = tr.state.core
        argv: list[Any] = [
            version, lease_token, core.to_json() if core is not None else "",
            orjson.dumps(tr.state.applied), self.events_maxlen,
            tr.idempotency_key or "",
            self.feed_maxlen, session]
        now = now_ms()
        argv += [now + IDEMPOTENCY_WINDOW_MS, now,
                 core.n_msgs if core is not None else 0, core.n_branches if core is not None else 0,
                 self.unknown_session_ttl_ms, "1" if tr.created else "0", len(tr.new_messages)]
        for m in tr.new_messages:
            argv += [m["id"], orjson.dumps(m)]
        argv.append(len(tr.tree_fields))
        for name, value in tr.tree_fields.items():
            argv += [name, value]
        argv.append(len(tr.events))
        for e in tr.events:
            # the feed copies the event whole: fields added to an event later flow through
            argv += [_feed_type(e), orjson.dumps(e)]
        # The transition's jobs are enqueued by the script itself (split_effects); the other
        # effects go to the outbox, for the settle.
        jobs, outboxed = split_effects(tr.effects)
        argv.append(len(outboxed))
        for fx in outboxed:
            argv += [fx.seq, effect_to_json(fx)]
        keys = [k.meta(session), k.messages(session), k.events(session), k.outbox(session),
                k.idempotency_keys(session), lease_key, k.feed, RQ_QUEUES, k.inflight]
        argv.append(len(jobs))
        for fx in jobs:
            job = self.jobs.prepare(session, fx)
            keys += [job.job_key, job.queue_key, job.order_key, job.token_key]
            argv += [job.job_id, job.record, job.token, len(job.fields) // 2, *job.fields]
        # last: commit.lua reads it as KEYS[#KEYS]. By the session's own partition: a producer's
        # stream of P may carry a session of another (its keys are that partition's)
        keys.append(k.partition_sessions(partition_of(session, partitions)))
        return keys, argv

    def pending_effects(self, session: str) -> list[Effect]:
        """What the session's outbox still holds (a crash came between commit and flush),
        in the order the transitions asked for it."""
        raw = self.redis.hgetall(self.keys.outbox(session))
        return sorted((effect_from_dict(orjson.loads(v)) for v in raw.values()), key=lambda fx: fx.seq)


def now_ms() -> int:
    return int(time.time() * 1000)


def is_used(score: float | None, now: int) -> bool:
    """An idempotency key's score (Unix ms until which it counts) says it was used, within the
    window: an expired member not yet dropped by a commit counts as unused."""
    return score is not None and score > now


def _feed_type(event: dict[str, Any]) -> str:
    """The event's type when the feed carries it, else '' (it stays in its session's stream)."""
    kind = event.get("type")
    return kind if isinstance(kind, str) and kind in FEED_EVENT_TYPES else ""
