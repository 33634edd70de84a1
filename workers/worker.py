"""The RQ worker Parley runs: non-forking, JSON-only, and limited to Parley's own jobs.

Why `SimpleWorker` (no fork per job): decide and tool jobs are small, and a fork plus
re-import costs more than the job; the app is loaded once; metrics live in one
process. What it gives up: RQ cannot stop a running job in a non-forking worker, so
voiding an LLM call is logical (its result is dropped on arrival), never a kill.
"""

import logging

from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from workers.jobs import ALLOWED_FUNCS

log = logging.getLogger("parley.worker")


class RefusedJob(Exception):
    pass


class ParleyJob(Job):
    """RQ imports whatever function a job hash names; the allowlist is checked before that."""

    @property
    def func(self):  # type: ignore[no-untyped-def]
        if self.func_name not in ALLOWED_FUNCS:
            log.error("refused a job naming a function outside Parley's own",
                      extra={"kv": {"job": self.id, "func": self.func_name}})
            raise RefusedJob(f"job {self.id} names {self.func_name!r}, which is not a Parley job")
        return super().func


class ParleyWorker(SimpleWorker):
    job_class = ParleyJob
    queue_class = Queue


def make_worker(queue_names: list[str], connection, name: str | None = None) -> ParleyWorker:  # type: ignore[no-untyped-def]
    queues = [Queue(q, connection=connection, serializer=JSONSerializer, job_class=ParleyJob)
              for q in queue_names]
    return ParleyWorker(queues, connection=connection, serializer=JSONSerializer, name=name,
                        job_class=ParleyJob)
