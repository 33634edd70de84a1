"""The commit script enqueues a transition's jobs itself (docs/design.md, "The enqueue path and
the outbox"): the RQ job hash as RQ's own enqueue writes it, the queue, the in-flight record and
its number, all or nothing with the transition, fenced like it."""

import hashlib
from typing import Any

import orjson
import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.dispatcher.core import Cancel, Enqueue, IndexRemove, Transition
from parley.dispatcher.enqueue import FAILURE_TTL, RESULT_TTL, JobMaker, Outbox
from parley.dispatcher.store import COMMITTED, CONFLICT, LEASE_LOST, Store
from parley.schemas.jobs import JOBS, JobKind, job_id
from parley.schemas.keys import Keys
from parley.schemas.state import Core, SessionState

KEYS = Keys()
S = "s-jobs"
LEASE = KEYS.lease(0)
TOKEN = "dispatcher-a:0001"
# what differs between two enqueues of one job: when each was made
WHEN = {b"created_at", b"enqueued_at"}


@pytest.fixture
def store(r: redis.Redis) -> Store:
    r.set(LEASE, TOKEN)
    return Store(r, KEYS)


def job(seq: int, work: str = "llm-1", attempt: int = 1, kind: JobKind = JobKind.LLM) -> Enqueue:
    return Enqueue(seq=seq, job=kind, work=work, attempt=attempt, timeout=61.5, reply_to="parley:results",
                   app=None, args={"request": {"messages": [{"role": "user", "content": "hi"}]}})


def transition(entry: str, effects: list[Any]) -> Transition:
    return Transition(state=SessionState(core=Core(session=S, created_at=1000, head=None),
                                         applied={"parley:inputs": entry}),
                      new_messages=[], events=[], effects=effects)


def rq_keys(r: redis.Redis) -> list[bytes]:
    return sorted(k for k in r.keys("*") if k.startswith(b"rq:"))


def test_the_commit_writes_the_job_as_rqs_own_enqueue_does(store: Store, r: redis.Redis) -> None:
    assert store.commit(S, "0", transition("1-0", [job(1)]), LEASE, TOKEN, 1) == COMMITTED
    jid = job_id(S, "llm-1", 1)
    ours = r.hgetall(Job.key_for(jid))
    assert r.lrange("rq:queue:llm", 0, -1) == [jid.encode()]
    assert r.smembers("rq:queues") == {b"rq:queue:llm"}
    assert r.hlen(KEYS.outbox(S)) == 0  # jobs never go through the outbox
    record = orjson.loads(r.hget(KEYS.inflight, jid))
    assert {k: v for k, v in record.items() if k != "at"} == {
        "session": S, "work": "llm-1", "attempt": 1, "kind": "llm", "queue": "rq:queue:llm",
        "reply_to": "parley:results",
        # what a worker's take checks the job hash against: the function and arguments issued
        "digest": hashlib.sha1(ours[b"data"]).hexdigest()}
    assert r.zrange(KEYS.inflight_order("llm"), 0, -1, withscores=True) == [(jid.encode(), 1.0)]
    fetched = Job.fetch(jid, connection=r, serializer=JSONSerializer)
    assert fetched.func_name == JOBS[JobKind.LLM].func and fetched.timeout == 62
    assert fetched.args == [{"session": S, "work": "llm-1", "attempt": 1, "reply_to": "parley:results",
                             "app": None, "request": {"messages": [{"role": "user", "content": "hi"}]}}]

    # the same job enqueued by RQ itself, as the outbox did before: the same hash but for its times
    r.delete(Job.key_for(jid), "rq:queue:llm", "rq:queues")
    queue = Queue("llm", connection=r, serializer=JSONSerializer)
    args = fetched.args
    queue.enqueue_job(Job.create(JOBS[JobKind.LLM].func, args=args, id=jid, connection=r,
                                 serializer=JSONSerializer, timeout=62, result_ttl=RESULT_TTL,
                                 failure_ttl=FAILURE_TTL, description=f"llm-1 of {S}"))
    theirs = r.hgetall(Job.key_for(jid))
    assert set(ours) == set(theirs)
    assert ({k: v for k, v in ours.items() if k not in WHEN}
            == {k: v for k, v in theirs.items() if k not in WHEN})
    assert r.ttl(Job.key_for(jid)) == -1  # neither sets a TTL (result_ttl=0 deletes at the end)


def test_a_refused_commit_enqueues_nothing(store: Store, r: redis.Redis) -> None:
    assert store.commit(S, "1", transition("1-0", [job(1)]), LEASE, TOKEN, 1) == CONFLICT
    r.set(LEASE, "someone-else")
    assert store.commit(S, "0", transition("1-0", [job(1)]), LEASE, TOKEN, 1) == LEASE_LOST
    assert rq_keys(r) == [] and not r.exists(KEYS.inflight, KEYS.inflight_order("llm"))


def test_jobs_are_numbered_in_push_order_above_the_highest_queued(store: Store, r: redis.Redis) -> None:
    # a job an older dispatcher numbered 7 is still queued: the next ones number above it
    r.zadd(KEYS.inflight_order("llm"), {"parley-older": 7})
    tr = transition("1-0", [job(1, "llm-1"), IndexRemove(seq=2, interrupt_id="int-1"), job(3, "llm-2"),
                            job(4, "tool-1", kind=JobKind.TOOL)])
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    assert r.zrange(KEYS.inflight_order("llm"), 0, -1, withscores=True) == [
        (b"parley-older", 7.0), (job_id(S, "llm-1", 1).encode(), 8.0), (job_id(S, "llm-2", 1).encode(), 9.0)]
    assert r.zrange(KEYS.inflight_order("tools"), 0, -1, withscores=True) == [
        (job_id(S, "tool-1", 1).encode(), 1.0)]
    assert r.lrange("rq:queue:llm", 0, -1) == [job_id(S, "llm-1", 1).encode(), job_id(S, "llm-2", 1).encode()]
    assert r.hkeys(KEYS.outbox(S)) == [b"2"]  # the other effect keeps the outbox path


def test_a_cancel_in_a_later_transition_finds_the_job(store: Store, r: redis.Redis) -> None:
    assert store.commit(S, "0", transition("1-0", [job(1)]), LEASE, TOKEN, 1) == COMMITTED
    assert store.commit(S, "1", transition("2-0", [Cancel(seq=2, job=JobKind.LLM, work="llm-1", attempt=1)]),
                        LEASE, TOKEN, 1) == COMMITTED
    Outbox(r, KEYS).flush_many([(S, store.pending_effects(S))])
    jid = job_id(S, "llm-1", 1)
    assert not r.exists(Job.key_for(jid)) and r.llen("rq:queue:llm") == 0
    assert not r.hexists(KEYS.inflight, jid) and r.zcard(KEYS.inflight_order("llm")) == 0
    assert r.hlen(KEYS.outbox(S)) == 0


def test_a_job_cancelled_in_its_own_transition_is_never_enqueued(store: Store, r: redis.Redis) -> None:
    tr = transition("1-0", [job(1), Cancel(seq=2, job=JobKind.LLM, work="llm-1", attempt=1)])
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    assert rq_keys(r) == [] and r.hlen(KEYS.outbox(S)) == 0 and not r.exists(KEYS.inflight)


def test_the_outbox_enqueues_an_older_dispatchers_job_the_same_way(store: Store, r: redis.Redis) -> None:
    """An outbox an older dispatcher left (it enqueued in the settle): the flush writes what the
    commit would have written."""
    assert store.commit(S, "0", transition("1-0", [job(1)]), LEASE, TOKEN, 1) == COMMITTED
    jid = job_id(S, "llm-1", 1)
    committed = {k: v for k, v in r.hgetall(Job.key_for(jid)).items() if k not in WHEN}
    r.delete(Job.key_for(jid), "rq:queue:llm", "rq:queues", KEYS.inflight, KEYS.inflight_order("llm"))
    Outbox(r, KEYS, jobs=JobMaker(r, KEYS)).flush_many([(S, [job(1)])])
    assert {k: v for k, v in r.hgetall(Job.key_for(jid)).items() if k not in WHEN} == committed
    assert r.lrange("rq:queue:llm", 0, -1) == [jid.encode()] and r.smembers("rq:queues") == {b"rq:queue:llm"}
    assert r.zscore(KEYS.inflight_order("llm"), jid) == 1 and r.hexists(KEYS.inflight, jid)


@pytest.mark.parametrize("kind", list(JobKind))
def test_a_prepared_job_is_rqs_own_but_for_its_times(r: redis.Redis, kind: JobKind) -> None:
    """JobMaker fills a template RQ made; every field but the times is what RQ writes for the job."""
    maker = JobMaker(r, KEYS)
    fx = Enqueue(seq=3, job=kind, work="w-9", attempt=3, timeout=0.2, reply_to="parley:results:3",
                 app="pkg.mod:agent", args={"name": "lookup", "arguments": {"q": "é", "n": [1, 2.5, None]}})
    prepared = maker.prepare("tenant/s-9", fx)
    ours = dict(zip(prepared.fields[::2], prepared.fields[1::2], strict=True))
    theirs = maker.rq_prepare("tenant/s-9", fx)
    assert ours.keys() == theirs.keys()
    assert {k: v for k, v in ours.items() if k not in {"created_at", "enqueued_at"}} == {
        k: v for k, v in theirs.items() if k not in {"created_at", "enqueued_at"}}
    assert prepared.job_key == Job.key_for(prepared.job_id)


def test_an_rq_whose_job_hash_changed_shape_is_refused(r: redis.Redis,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    maker = JobMaker(r, KEYS)
    real = JobMaker.rq_prepare
    calls = iter(range(100))

    def with_a_field_more(self: JobMaker, session: str, fx: Enqueue, queue: Any = None) -> dict[Any, Any]:
        return {**real(self, session, fx, queue), "new_field": next(calls)}  # differs from job to job

    monkeypatch.setattr(JobMaker, "rq_prepare", with_a_field_more)
    with pytest.raises(RuntimeError, match=r"changed shape.*new_field"):
        maker.prepare(S, job(1))


def test_the_recorder_refuses_a_write_commit_lua_would_not_make(r: redis.Redis,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def push_elsewhere(self: Queue, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        pipeline.rpush("rq:queue:other", job_id)

    monkeypatch.setattr(Queue, "push_job_id", push_elsewhere)
    with pytest.raises(ValueError, match=r"pushed on 'rq:queue:other'"):
        JobMaker(r, KEYS).rq_prepare(S, job(1))
