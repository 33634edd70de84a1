"""Helpers for the integration tests: a Dispatcher driven by hand against the private Redis.

The dispatcher's loop is never started here: a test builds a `Dispatcher`, sets its
partition count and calls `tick(d)` (or `d.leases.maintain()` then `d.apply_entries(...)`)
itself, so every step is deterministic.
"""

import signal
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis
from rq import Queue

from parley.dispatcher.apply import Replies
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import AppInfo, Enqueue, ToolInfo
from parley.dispatcher.enqueue import Outbox
from parley.schemas.jobs import JobKind, job_id
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome

KEYS = Keys()
INPUTS = "parley:inputs"
RESULTS = "parley:results"

# An app shape with no `decide`: every trigger takes `proposed` at once, so a message goes
# straight to an LLM job and a tool call straight to a tool job.
NO_DECIDE = AppInfo(has_decide=False, tools={
    "lookup": ToolInfo(),
    "slow": ToolInfo(timeout_s=1),
    "add": ToolInfo(),
    "later": ToolInfo(deferred=True),
})

MakeDispatcher = Callable[..., Dispatcher]


@pytest.fixture
def make_dispatcher(r: redis.Redis) -> MakeDispatcher:
    """`make(app=NO_DECIDE, name=None, partitions=1, **kwargs)`: a Dispatcher on the test's Redis."""

    def make(app: AppInfo = NO_DECIDE, name: str | None = None, partitions: int = 1,
             **kwargs: Any) -> Dispatcher:
        kwargs.setdefault("block_ms", 5)
        d = Dispatcher(r, Keys(), app, name=name, **kwargs)
        d.leases.partitions = partitions
        return d

    return make


@pytest.fixture
def restore_signals() -> Iterator[None]:
    """An in-process RQ worker installs SIGINT/SIGTERM handlers and resets SIGALRM: undo that."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def send(r: redis.Redis, session: str, value: dict[str, Any], stream: str = INPUTS,
         **extra: Any) -> str:
    """XADD one input like a producer; returns the entry id."""
    entry = r.xadd(stream, {"session": session, "input": orjson.dumps(value), **extra})
    return entry.decode()  # type: ignore[union-attr]


def post_outcome(r: redis.Redis, stream: str = RESULTS, **fields: Any) -> str:
    """XADD one work outcome like the worker that took its job (signed with the job's token,
    which the test derives from the engine's key); returns the entry id."""
    outcome = WorkOutcome(**fields)
    entry = r.xadd(stream, taker_signed(r, outcome))
    return entry.decode()  # type: ignore[union-attr]


def taker_signed(r: redis.Redis, outcome: WorkOutcome, keys: Keys = KEYS) -> dict[str, bytes | str]:
    """The fields of a results entry as the worker that took the outcome's job posts them (the
    job's token consumed, as its take does)."""
    from parley.dispatcher.engine_key import EngineKey
    from parley.schemas.signing import JOB_SIG_FIELD, job_outcome_signature, job_token

    raw = outcome.model_dump_json().encode()
    jid = job_id(outcome.session, outcome.work, outcome.attempt)
    r.getdel(keys.job_token(jid))  # its take read the token (and it is gone, as after a take)
    token = job_token(EngineKey(r, keys).load(), jid)
    return {"outcome": raw, JOB_SIG_FIELD: job_outcome_signature(token, raw)}


def events(r: redis.Redis, session: str) -> list[dict[str, Any]]:
    return [orjson.loads(f[b"event"]) for _id, f in r.xrange(KEYS.events(session))]


def types(r: redis.Redis, session: str) -> list[str]:
    return [e["type"] for e in events(r, session)]


# What each dispatcher's last tick read ahead, as `Dispatcher.run` keeps it between ticks.
_ahead: "weakref.WeakKeyDictionary[Dispatcher, Replies | None]" = weakref.WeakKeyDictionary()


def tick(d: Dispatcher, n: int = 3) -> Replies | None:
    """n ticks of `d`, each given what the previous one read ahead, as its loop would; returns
    what the last one read ahead (entries delivered to `d`, not yet applied)."""
    for _ in range(n):
        _ahead[d] = d.tick(_ahead.get(d))
    return _ahead.get(d)


def pending_count(r: redis.Redis, stream: str) -> int:
    if not r.exists(stream):
        return 0
    return int(r.xpending(stream, Keys.GROUP)["pending"])


def queue_ids(r: redis.Redis, kind: str) -> list[str]:
    return [i.decode() for i in r.lrange(f"rq:queue:{kind}", 0, -1)]


def enqueue_tool_job(conn: redis.Redis, session: str, work: str, name: str, arguments: dict[str, Any], *,
                     reply_to: str = RESULTS, queue: str = "tools", timeout: int = 30, seq: int = 1,
                     approval: str | None = None, attempt: int = 1) -> str:
    """A tool job enqueued exactly as the dispatcher's outbox flush does it (in-flight record
    included, so ParleyWorker takes it on its lean path); its RQ job id. `approval`: the digest
    an approved call of a gated tool carries."""
    args: dict[str, Any] = {"name": name, "arguments": arguments}
    if approval is not None:
        args["approval"] = approval
    job = Enqueue(seq=seq, job=JobKind.TOOL, work=work, attempt=attempt, timeout=timeout, reply_to=reply_to,
                  app=None, args=args)
    _OnQueue(conn, KEYS, queue).flush_many([(session, [job])])
    return job_id(session, work, attempt)


class _OnQueue(Outbox):
    """The outbox flush, with its jobs put on one given queue (tests run tool jobs from every
    queue, to check what a worker may read)."""

    def __init__(self, conn: redis.Redis, keys: Keys, name: str):
        super().__init__(conn, keys)
        self.name = name

    def queue(self, name: str) -> Queue:
        return super().queue(self.name)


def issue(r: redis.Redis, job: Any, keys: Keys = KEYS) -> Any:
    """Write the in-flight record a dispatcher writes with a job it enqueues (commit.lua), for a
    job a test enqueued with RQ itself: a worker runs only a job a dispatcher issued, with the
    digest of its function and arguments (take_job.lua)."""
    from parley.dispatcher.enqueue import RECORD_INFLIGHT, job_digest

    args = job.args[0] if job.args else {}
    args = args if isinstance(args, dict) else {}
    record = {"session": args.get("session"), "work": args.get("work"), "attempt": args.get("attempt"),
              "kind": job.func_name.rpartition("_")[2],
              "queue": Queue.redis_queue_namespace_prefix + job.origin,
              "reply_to": args.get("reply_to"), "at": 1, "digest": job_digest(r.hget(job.key, "data") or b"")}
    r.eval(RECORD_INFLIGHT, 2, keys.inflight, keys.inflight_order(job.origin), job.id, orjson.dumps(record))
    give_token(r, job.id, keys)
    return job


def give_token(r: redis.Redis, jid: str, keys: Keys = KEYS) -> None:
    """The job's token, as its dispatcher writes it with the job (dispatcher/enqueue.py)."""
    from parley.dispatcher.engine_key import EngineKey
    from parley.dispatcher.enqueue import JOB_TOKEN_TTL_MS
    from parley.schemas.signing import job_token

    r.set(keys.job_token(jid), job_token(EngineKey(r, keys).load(), jid), px=JOB_TOKEN_TTL_MS)


def rewrite_job(conn: redis.Redis, jid: str, **changes: Any) -> str:
    """Rewrite a queued job's hash to run `run_tool` with its argument changed by `changes`, as
    anyone who may write RQ's keys could (a worker login may): its `data` no longer matches the
    digest its dispatcher recorded. Returns the job hash's key."""
    from rq.job import Job
    from rq.serializers import JSONSerializer

    honest = Job.fetch(jid, connection=conn, serializer=JSONSerializer)
    forged = Job.create("parley.workers.jobs.run_tool", args=[{**honest.args[0], **changes}], id=jid,
                        connection=conn, serializer=JSONSerializer)
    conn.hset(honest.key, "data", forged.to_dict()["data"])
    return str(honest.key)
