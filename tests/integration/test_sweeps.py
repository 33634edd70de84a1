"""The unclaimed-work sweep against a real Redis: what it costs with a backlog, and what it finds.

docs/design.md, "Lost work": a job that left its queue but was never recorded as running (its
worker died between the blocking pop and the record) is posted `worker_lost` exactly once; a
queued job is never looked at, however long the queue.
"""

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher import enqueue
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import Cancel, Enqueue
from parley.runtime import metrics
from parley.schemas.jobs import JobKind, job_id
from tests.integration.conftest import KEYS, RESULTS, MakeDispatcher, events, queue_ids, send, tick


def commands_total(r: redis.Redis) -> int:
    """Every command Redis ran, those run inside scripts included."""
    stats = r.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def enqueue_llm_jobs(r: redis.Redis, d: Dispatcher, n: int, monkeypatch: pytest.MonkeyPatch,
                     first: int = 0) -> list[str]:
    """n LLM jobs enqueued by the outbox flush a minute ago (older than the sweep waits for),
    in batches as the dispatcher's settle does; their job ids in queue order."""
    monkeypatch.setattr(enqueue, "time", SimpleNamespace(time=lambda: 1_000_000.0))
    ids = []
    for start in range(first, first + n, 500):
        batch = [(f"b-{i}", [Enqueue(seq=1, job=JobKind.LLM, work="llm-1", attempt=1, timeout=30,
                                     reply_to=RESULTS, app=None, args={"request": {}})])
                 for i in range(start, min(first + n, start + 500))]
        d.outbox.flush_many(batch)
        ids += [job_id(session, "llm-1", 1) for session, _fx in batch]
    monkeypatch.undo()
    return ids


def sweep(d: Dispatcher) -> int:
    """One unclaimed-work sweep, due now; how many losses it posted."""
    before = d.redis.xlen(RESULTS) if d.redis.exists(RESULTS) else 0
    d.sweeps.unclaimed_checked = 0.0
    d.sweeps.find_unclaimed_work()
    return int(d.redis.xlen(RESULTS) if d.redis.exists(RESULTS) else 0) - before


def posted(r: redis.Redis) -> list[tuple[str, str]]:
    return [(o["session"], o["error"]) for o in
            (orjson.loads(f[b"outcome"]) for _i, f in r.xrange(RESULTS))]


@pytest.fixture
def d(make_dispatcher: MakeDispatcher) -> Dispatcher:
    return make_dispatcher()


def test_a_sweep_costs_the_same_few_commands_whatever_the_backlog(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued jobs are never looked at: 20 or 3,000 queued jobs, one sweep runs the same commands."""
    enqueue_llm_jobs(r, d, 20, monkeypatch)
    sweep(d)  # the first loads the scripts
    before = commands_total(r)
    assert sweep(d) == 0
    small = commands_total(r) - before

    enqueue_llm_jobs(r, d, 3_000, monkeypatch, first=20)
    before = commands_total(r)
    assert sweep(d) == 0
    large = commands_total(r) - before
    assert large == small and large <= 20, (small, large)
    assert r.hlen(KEYS.inflight) == 3_020 and r.llen("rq:queue:llm") == 3_020


def test_a_job_popped_by_a_worker_that_died_is_posted_once_behind_a_large_backlog(
        r: redis.Redis, d: Dispatcher, make_dispatcher: MakeDispatcher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ids = enqueue_llm_jobs(r, d, 2_000, monkeypatch)
    assert r.lpop("rq:queue:llm") == ids[0].encode()  # a worker's BLPOP; it died before recording it
    standby = make_dispatcher(name="d2")
    assert sweep(d) + sweep(standby) + sweep(d) == 1  # every dispatcher sweeps; posted once
    assert posted(r) == [("b-0", "worker_lost")]
    assert not r.hexists(KEYS.inflight, ids[0]) and r.exists(f"rq:job:{ids[0]}") == 0
    assert r.hlen(KEYS.inflight) == 1_999 and queue_ids(r, "llm") == ids[1:]


def test_a_sweep_posts_a_bounded_number_of_losses_and_the_next_ones_carry_on(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work per tick is bounded: 250 jobs lost at once are posted over several sweeps, each once."""
    ids = enqueue_llm_jobs(r, d, 300, monkeypatch)
    for _ in range(250):
        r.lpop("rq:queue:llm")
    counts = [sweep(d) for _ in range(5)]
    assert max(counts) <= d.sweeps.UNCLAIMED_BATCH < 250 and sum(counts) == 250, counts
    assert sorted(s for s, _e in posted(r)) == sorted(f"b-{i}" for i in range(250))
    assert queue_ids(r, "llm") == ids[250:]


def test_running_and_released_jobs_ahead_of_the_queue(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ahead of the queue's head: a job running on a worker is left to the heartbeat sweep; a job
    whose running record was released (it raised instead of posting) is posted; an answered job
    is gone."""
    ids = enqueue_llm_jobs(r, d, 10, monkeypatch)
    running, released, answered = ids[:3]
    for _ in range(3):
        r.lpop("rq:queue:llm")
    record: Any = orjson.loads(r.hget(KEYS.inflight, running))
    r.hset(KEYS.running, running, orjson.dumps({"worker": "w-1", **record}))
    r.hdel(KEYS.inflight, answered)  # its outcome's MULTI
    assert sweep(d) == 1
    assert posted(r) == [("b-1", "worker_lost")]
    assert r.hexists(KEYS.inflight, running) and not r.hexists(KEYS.inflight, released)
    assert sweep(d) == 0


def test_numbers_follow_the_queue_even_when_the_stats_hash_is_deleted(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job is numbered one above its queue's highest, not by a counter: an operator who deletes
    `parley:stats` (its gauges are recounted) cannot make queued jobs look as if they had left."""
    ids = enqueue_llm_jobs(r, d, 10, monkeypatch)
    for job in ids[:5]:  # taken and answered: the outcome's MULTI removes record and number
        assert r.lpop("rq:queue:llm") == job.encode()
        r.hdel(KEYS.inflight, job)
        r.zrem(KEYS.inflight_order("llm"), job)
    r.delete(KEYS.stats)
    later = enqueue_llm_jobs(r, d, 3, monkeypatch, first=10)
    assert sweep(d) == 0
    assert queue_ids(r, "llm") == ids[5:] + later
    assert all(r.exists(f"rq:job:{job}") for job in later)


def test_a_job_cancelled_in_the_middle_of_the_queue_leaves_no_number_and_no_loss(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = enqueue_llm_jobs(r, d, 6, monkeypatch)
    d.outbox.flush_many([("b-3", [Cancel(seq=2, job=JobKind.LLM, work="llm-1", attempt=1)])])
    assert queue_ids(r, "llm") == ids[:3] + ids[4:]
    assert r.zcard(KEYS.inflight_order("llm")) == 5 and not r.hexists(KEYS.inflight, ids[3])
    r.lpop("rq:queue:llm")  # the head's worker dies before recording it
    assert sweep(d) == 1 and posted(r) == [("b-0", "worker_lost")]
    assert sweep(d) == 0
    # what is left: the five queued jobs' records and numbers, nothing else
    assert r.zcard(KEYS.inflight_order("llm")) == r.hlen(KEYS.inflight) == 4


def test_a_number_left_behind_by_the_heartbeat_sweep_is_cleared_by_the_next_walk(
        r: redis.Redis, d: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = enqueue_llm_jobs(r, d, 3, monkeypatch)
    r.lpop("rq:queue:llm")
    r.hdel(KEYS.inflight, ids[0])  # settled by the heartbeat sweep (settle_lost keeps the number)
    assert r.zscore(KEYS.inflight_order("llm"), ids[0]) is not None
    assert sweep(d) == 0
    assert r.zscore(KEYS.inflight_order("llm"), ids[0]) is None
    assert r.zcard(KEYS.inflight_order("llm")) == 2


def test_a_sweep_redis_refuses_does_not_stop_the_dispatcher_applying_inputs(
        r: redis.Redis, d: Dispatcher) -> None:
    """A refused sweep (here a key of the wrong type; after an upgrade, an ACL not yet loaded)
    is counted and logged; the tick goes on to read and apply the partition's inputs."""
    r.set(KEYS.deadlines, "not a sorted set")
    before = metrics.SWEEP_ERRORS.labels("fire_deadlines")._value.get()
    send(r, "s-1", {"type": "message.create", "content": "hello"})
    tick(d)
    assert [e["type"] for e in events(r, "s-1")][:2] == ["session.created", "message.created"]
    assert metrics.SWEEP_ERRORS.labels("fire_deadlines")._value.get() == before + 1
