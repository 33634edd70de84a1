"""The floor (scenario 2): no-op RQ jobs through Parley's worker class, serializer and Redis.

`ParleyJob` refuses every function but Parley's own, so the floor's workers run a subclass
of `ParleyWorker` whose job class lets exactly one more name through: `bench.noop.noop`.
Everything else (RQ `SimpleWorker`, `JSONSerializer`, `result_ttl=0`, one process per
worker) is what `parley worker` runs.

    python -m bench.noop REDIS_URL QUEUE     (started by bench.run, one process per worker)

The process connects, announces itself on `bench:floor:ready`, waits for `bench:floor:go`,
then works the queue in burst mode and prints one JSON line: its start and end (Unix s)
and the jobs it ran.
"""

import sys
import time
from typing import Any

import orjson
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from workers.worker import ParleyJob, ParleyWorker

NOOP = "bench.noop.noop"
READY_KEY = "bench:floor:ready"
GO_KEY = "bench:floor:go"


RAN = [0]


def noop(payload: Any = None) -> None:
    """The job: nothing but a count. Its argument mirrors Parley's jobs (one JSON payload)."""
    RAN[0] += 1


class FloorJob(ParleyJob):
    @property
    def func(self):  # type: ignore[no-untyped-def]
        if self.func_name == NOOP:
            return noop
        return super().func


class FloorWorker(ParleyWorker):
    job_class = FloorJob


def main() -> int:
    url, queue_name = sys.argv[1], sys.argv[2]
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
