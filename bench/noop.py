"""The floor (scenario 2): no-op RQ jobs through Parley's worker class, serializer and Redis.

`ParleyJob` refuses every function but Parley's own, so the floor's workers run a subclass
of `ParleyWorker` whose job class lets two more names through: `bench.noop.noop` and
`bench.noop.noop_lean`. Everything else (RQ `SimpleWorker`, `JSONSerializer`, `result_ttl=0`,
one process per worker) is what `parley worker` runs.

Two floors: **RQ's own path** (`noop`, enqueued the plain RQ way: the worker runs it with RQ's
full bookkeeping) and **the lean path** (`noop_lean`, enqueued with an in-flight record as
Parley's outbox does, taken by take_job.lua; the worker deletes its hash and records and takes
the next job in one take_job.lua call, what a Parley job's finish does minus the outcome).

    python -m bench.noop REDIS_URL QUEUE [WORKER_ID]   (started by bench/scenarios/rq_floor.py,
                                                        one per worker; WORKER_ID turns on
                                                        the lean path)

The process connects, announces itself on `bench:floor:ready`, waits for `bench:floor:go`,
then works the queue in burst mode and prints one JSON line: its start and end (Unix s)
and the jobs it ran.
"""

import sys
import time
from typing import Any

import orjson
import redis
from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from parley.workers import jobs
from parley.workers.jobs import Finish
from parley.workers.worker import ParleyJob, ParleyWorker

NOOP = "bench.noop.noop"
NOOP_LEAN = "bench.noop.noop_lean"
READY_KEY = "bench:floor:ready"
GO_KEY = "bench:floor:go"


RAN = [0]


def noop(payload: Any = None) -> None:
    """The job: nothing but a count. Its argument mirrors Parley's jobs (one JSON payload)."""
    RAN[0] += 1


def noop_lean(payload: Any = None) -> None:
    """A count, leaving its finish to the worker as a Parley job does (workers/jobs.py `_post`),
    with no outcome: the worker deletes the job's hash and records and takes the next job in one
    take_job.lua call, the engine's jobs' round trip minus the XADD."""
    job = get_current_job()
    assert job is not None
    job.parley_finish = Finish(reply_to="", outcome="")  # type: ignore[attr-defined]
    RAN[0] += 1


class FloorJob(ParleyJob):
    @property
    def func(self):  # type: ignore[no-untyped-def]
        if self.func_name == NOOP:
            return noop
        if self.func_name == NOOP_LEAN:
            return noop_lean
        return super().func


class FloorWorker(ParleyWorker):
    job_class = FloorJob
    lean_funcs = ParleyWorker.lean_funcs | {NOOP_LEAN}


def main() -> int:
    url, queue_name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        jobs.set_worker_id(sys.argv[3])
    connection = redis.Redis.from_url(url)
    queue = Queue(queue_name, connection=connection, serializer=JSONSerializer, job_class=FloorJob)
    worker = FloorWorker([queue], connection=connection, serializer=JSONSerializer, job_class=FloorJob)
    connection.rpush(READY_KEY, 1)
    connection.blpop([GO_KEY], timeout=120)
    started = time.time()
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    ended = time.time()
    print(orjson.dumps({"start": started, "end": ended,
                        "jobs": RAN[0]}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
