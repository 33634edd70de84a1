"""Scenario 2, the floor: after each scenario-1 row, on the same redis-server (its Parley
processes stopped), no-op RQ jobs with the options Parley's outbox uses, run by as many floor
worker processes (bench/noop.py) as the row used: once on RQ's own path, once on Parley's lean
path. `engine/floor` = the row's engine jobs/s ÷ the floor's jobs/s."""

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import orjson
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from bench.common import ROOT, Usage, log
from bench.fleet import Fleet
from bench.noop import GO_KEY, NOOP, NOOP_LEAN, READY_KEY
from parley.dispatcher.engine_key import EngineKey
from parley.dispatcher.enqueue import JOB_TOKEN_TTL_MS, RECORD_INFLIGHT, job_digest
from parley.schemas.keys import Keys
from parley.schemas.signing import job_token

FLOOR_QUEUE = "bench-floor"


def add_floors(fleet: Fleet, row: dict[str, Any], args: argparse.Namespace) -> None:
    """Scenario 2 for one scenario-1 row: `row["floor"]` (RQ's own path, at most
    `--floor-rq-jobs` jobs) and `row["floor_lean"]` (as many jobs as the row ran), each with its
    `ratio`, engine jobs/s ÷ floor jobs/s."""
    # RQ's own path at up to --floor-rq-jobs jobs: a rate of no-op jobs, the same at 2,000
    # as at 8,000, and at ~200 jobs/s on this VM the whole count took 40 s of the run
    row["floor"] = floor_jobs(fleet.url, min(row["jobs"], args.floor_rq_jobs), args.workers, args.timeout,
                              fleet)
    row["floor"]["ratio"] = round(row["jobs_per_s"] / row["floor"]["jobs_per_s"], 3)
    row["floor_lean"] = floor_jobs(fleet.url, row["jobs"], args.workers, args.timeout, fleet, lean=True)
    row["floor_lean"]["ratio"] = round(row["jobs_per_s"] / row["floor_lean"]["jobs_per_s"], 3)
    log(f"  floor (RQ's path) {row['floor']['jobs_per_s']} jobs/s, engine/floor = "
        f"{row['floor']['ratio']}; floor (lean path) {row['floor_lean']['jobs_per_s']} jobs/s, "
        f"engine/floor = {row['floor_lean']['ratio']}")


def enqueue_noops(r: redis.Redis, q: Queue, jobs: int, lean: bool) -> list[str]:
    """`jobs` no-op jobs, 500 per MULTI, with the options Parley's outbox gives its jobs
    (dispatcher/enqueue.py), each with its in-flight record as the outbox writes it (a worker
    runs no job a dispatcher did not issue, with the digest of its function and arguments, and
    none without its token).
    The `lean` floor's workers have an id and take the lean path; the other floor's have none,
    claim nothing and run each job on RQ's own path. Returns the jobs' ids."""
    keys = Keys()
    engine_key = EngineKey(r, keys).load()  # each job's token, as the outbox writes it
    ids: list[str] = []
    for i in range(0, jobs, 500):
        pipe = r.pipeline()
        pipe.multi()
        for j in range(i, min(jobs, i + 500)):
            job = Job.create(NOOP_LEAN if lean else NOOP, args=[{"n": j}], connection=r,
                             serializer=JSONSerializer, timeout=30, result_ttl=0,
                             failure_ttl=24 * 3600, description=f"noop {j}")
            q.enqueue_job(job, pipeline=pipe)
            ids.append(job.id)
            # the in-flight record, numbered in its queue, as the outbox writes it
            pipe.eval(RECORD_INFLIGHT, 2, keys.inflight, keys.inflight_order(q.name), job.id, orjson.dumps({
                          "session": f"floor-{j}", "work": f"noop-{j}", "attempt": 1, "kind": "tool",
                          "queue": q.key, "reply_to": keys.results(), "at": int(time.time() * 1000),
                          "digest": job_digest(job.to_dict()["data"])}))
            pipe.set(keys.job_token(job.id), job_token(engine_key, job.id), px=JOB_TOKEN_TTL_MS)
        pipe.execute()
    return ids


def start_floor_workers(r: redis.Redis, url: str, workers: int, lean: bool) -> list[subprocess.Popen[bytes]]:
    """`workers` floor worker processes (bench/noop.py), returned once each has said it is ready
    (imported, waiting for the go signal)."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.noop", url, FLOOR_QUEUE,
                               *([f"floor-worker-{n}"] if lean else [])], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
             for n in range(workers)]
    deadline = time.monotonic() + 60
    while int(r.llen(READY_KEY)) < workers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError("floor workers did not start")
        time.sleep(0.05)
    return procs


def floor_jobs(url: str, jobs: int, workers: int, timeout: float, fleet: Fleet | None = None,
               lean: bool = False) -> dict[str, Any]:
    """Scenario 2 on the same redis-server: `jobs` no-op jobs, `workers` floor worker processes.
    `lean`: enqueued with an in-flight record, as Parley's outbox does, and run by workers with
    a worker id, so that ParleyWorker's lean path takes them (bench/noop.py)."""
    r = redis.Redis.from_url(url)
    q = Queue(FLOOR_QUEUE, connection=r, serializer=JSONSerializer)
    keys = Keys()
    r.delete(READY_KEY, GO_KEY)
    ids = enqueue_noops(r, q, jobs, lean)
    procs = start_floor_workers(r, url, workers, lean)
    usage = Usage(fleet)  # the fleet's redis-server (its Parley processes are stopped by now)
    r.rpush(GO_KEY, *[1] * workers)
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        reports.append(orjson.loads(out.splitlines()[-1]))
    used = usage.stop()
    failed = int(r.zcard(f"rq:failed:{FLOOR_QUEUE}"))
    left = int(r.hlen(keys.inflight)) + int(r.hlen(keys.running)) if lean else 0
    if not lean:  # RQ's own path leaves the records the lean path's finish deletes
        for i in range(0, len(ids), 500):
            r.hdel(keys.inflight, *ids[i:i + 500])
            r.zrem(keys.inflight_order(q.name), *ids[i:i + 500])
    r.close()
    seconds = max(x["end"] for x in reports) - min(x["start"] for x in reports)
    ran = sum(x["jobs"] for x in reports)
    return {"jobs": jobs, "ran": ran, "failed": failed, "records_left": left, "workers": workers,
            "path": "lean" if lean else "rq", "wall_s": round(seconds, 2),
            "jobs_per_s": round(ran / seconds, 1), "usage": used}
