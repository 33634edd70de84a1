"""Draining a frozen partition's jobs on its source shard (step 3 of a move).

The move waits until no job of a P session is queued, running or in flight on the source: the
outcomes are then in P's results stream, which travels. Jobs still there at the timeout are
taken off their queue and recorded lost on P's results stream, as the lost-work sweeps would:
the target's dispatcher retries them by the engine's rules; a late outcome of one still
running is dropped (it is of an old attempt).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis
from rq import Queue
from rq.job import Job

from parley.dispatcher.sweeps import lost_outcome
from parley.fleet.copying import text
from parley.schemas.jobs import JOBS
from parley.schemas.keys import Keys
from parley.schemas.moves import in_partition, session_of_job


def jobs_of(r: redis.Redis, keys: Keys, partition: int, partitions: int) -> dict[str, dict[str, Any]]:
    """P's jobs in flight or running: job id -> its record. Both hashes read whole, in one
    MULTI (a take moving a job from one to the other cannot hide it between the reads)."""
    pipe = r.pipeline(transaction=True)
    pipe.hgetall(keys.inflight)
    pipe.hgetall(keys.running)
    found: dict[str, dict[str, Any]] = {}
    for raw in pipe.execute():
        for job, rec in (raw or {}).items():
            session = session_of_job(rec)
            if session is not None and in_partition(session, partition, partitions):
                found.setdefault(text(job), orjson.loads(rec))
    return found


def still_there(r: redis.Redis, keys: Keys, jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Which of `jobs` are still in flight or running, with their records now: two HMGETs of
    those ids, in one MULTI, whatever else the shard runs."""
    ids = list(jobs)
    pipe = r.pipeline(transaction=True)
    pipe.hmget(keys.inflight, ids)
    pipe.hmget(keys.running, ids)
    inflight, running = pipe.execute()
    left: dict[str, dict[str, Any]] = {}
    for job, a, b in zip(ids, inflight, running, strict=True):
        rec = b if b is not None else a
        if rec is not None:
            left[job] = orjson.loads(rec)
    return left


def drain(src: redis.Redis, keys: Keys, partition: int, partitions: int, timeout_s: float,
          poll_s: float) -> int:
    """Wait for P's jobs on `src` to finish; record the rest lost at the timeout. Returns how many.

    The shard's job records are read whole once; then only P's jobs found there are watched.
    No new job of P can appear meanwhile: the partition is frozen and its lease fenced, so
    nobody commits (and enqueues for) its sessions."""
    deadline = time.monotonic() + timeout_s
    jobs = jobs_of(src, keys, partition, partitions)
    while jobs:
        if time.monotonic() >= deadline:
            record_lost(src, keys, jobs, partitions)
            return len(jobs)
        time.sleep(poll_s)
        jobs = still_there(src, keys, jobs)
    return 0


def record_lost(src: redis.Redis, keys: Keys, jobs: dict[str, dict[str, Any]], partitions: int) -> None:
    """Each of `jobs` taken off its queue and its records, its loss posted on P's results
    stream of `src` (which the copy takes to the target), one MULTI a job."""
    names = sorted({keys.queue(spec.queue) for spec in JOBS.values()})
    queue_keys = [Queue.redis_queue_namespace_prefix + name for name in names]
    orders = [keys.inflight_order(name) for name in names]
    running: Any = src.hgetall(keys.running)
    running_ids = {text(j) for j in (running or {})}
    for job, rec in jobs.items():
        pipe = src.pipeline(transaction=True)
        for q in queue_keys:
            pipe.lrem(q, 0, job)
        if job not in running_ids:
            pipe.delete(Job.key_for(job))  # queued or never started: RQ may not run it later
        pipe.delete(keys.job_token(job))  # a queued job's, which no take will read now
        pipe.hdel(keys.inflight, job)
        pipe.hdel(keys.running, job)
        for order in orders:
            pipe.zrem(order, job)
        # P's results stream of the source, which the copy takes to the target
        outcome = lost_outcome(rec).model_dump_json()
        pipe.xadd(keys.results_of(rec["session"], partitions), {"outcome": outcome})
        pipe.execute()
