"""The RQ worker Parley runs: non-forking, JSON-only, and limited to Parley's own jobs.

Why `SimpleWorker` (no fork per job): decide and tool jobs are small, and a fork plus
re-import costs more than the job; the app is loaded once; metrics live in one
process. What it gives up: RQ cannot stop a running job in a non-forking worker, so
voiding an LLM call is logical (its result is dropped on arrival), never a kill.
"""

import logging
import secrets
import socket
import threading

from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from parley.metrics import JOBS_REFUSED, Health
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
            JOBS_REFUSED.inc()
            raise RefusedJob(f"job {self.id} names {self.func_name!r}, which is not a Parley job")
        return super().func

    # RQ also imports and calls the callbacks a job hash names. Parley's jobs never have any:
    # a planted name is ignored, never imported.
    def _refuse_callback(self, name: str | None) -> None:
        if name:
            log.error("ignored a callback named in a job hash",
                      extra={"kv": {"job": self.id, "callback": name}})

    @property
    def success_callback(self):  # type: ignore[no-untyped-def]
        self._refuse_callback(self._success_callback_name)
        return None

    @property
    def failure_callback(self):  # type: ignore[no-untyped-def]
        self._refuse_callback(self._failure_callback_name)
        return None

    @property
    def stopped_callback(self):  # type: ignore[no-untyped-def]
        self._refuse_callback(self._stopped_callback_name)
        return None


class ParleyWorker(SimpleWorker):
    job_class = ParleyJob
    queue_class = Queue


class Heartbeat(threading.Thread):
    """Keeps `parley:worker:<id>` alive while this process lives, so that a dispatcher
    notices within seconds when a worker dies holding a job (RQ notices much later)."""

    INTERVAL_S = 1.0
    TTL_MS = 5000

    def __init__(self, connection, key: str, health: Health | None = None):  # type: ignore[no-untyped-def]
        super().__init__(name="parley-heartbeat", daemon=True)
        self.connection = connection
        self.key = key
        self.health = health
        self.stopped = threading.Event()

    def beat(self) -> None:
        self.connection.set(self.key, 1, px=self.TTL_MS)
        if self.health is not None:
            self.health.beat()

    def run(self) -> None:
        while not self.stopped.wait(self.INTERVAL_S):
            try:
                self.beat()
            except Exception as exc:  # Redis away: keep trying; the worker itself reconnects
                log.warning("heartbeat failed", extra={"kv": {"error": repr(exc)}})

    def stop(self) -> None:
        self.stopped.set()
        try:
            self.connection.delete(self.key)
        except Exception:
            log.warning("could not clear the heartbeat on exit")


def worker_id() -> str:
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


def make_worker(queue_names: list[str], connection, name: str | None = None) -> ParleyWorker:  # type: ignore[no-untyped-def]
    queues = [Queue(q, connection=connection, serializer=JSONSerializer, job_class=ParleyJob)
              for q in queue_names]
    return ParleyWorker(queues, connection=connection, serializer=JSONSerializer, name=name,
                        job_class=ParleyJob)
