"""The RQ worker Parley runs: non-forking, JSON-only, and limited to Parley's own jobs.

Why `SimpleWorker` (no fork per job): decide and tool jobs are small, and a fork plus
re-import costs more than the job; the app is loaded once; metrics live in one
process. What it gives up: RQ cannot stop a running job in a non-forking worker; Parley
stops a voided model call itself, by interrupting the main thread (workers/stopping.py), and
any other voided job finishes and its result is dropped on arrival.

How it takes its jobs, confirms a take and gives one back is workers/takes.py (the class this
one extends); its own heartbeat key is workers/heartbeat.py.
"""

import logging
import os
import secrets
import socket
import sys
import time
from datetime import datetime
from typing import Any

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer, resolve_serializer
from rq.timeouts import JobTimeoutException
from rq.utils import now, str_to_date
from rq.worker import WorkerStatus

from parley.runtime.metrics import JOBS_REFUSED, start_worker_series
from parley.schemas.keys import Keys
from parley.workers import jobs
from parley.workers.jobs import ALLOWED_FUNCS, Finish
from parley.workers.takes import TakingWorker

log = logging.getLogger("parley.worker")


class RefusedJob(Exception):
    pass


# the job hash fields RQ's restore turns into datetimes (with str_to_date)
_DATES = frozenset({"created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat"})


def _utc(value: bytes | str) -> datetime:
    text = value.decode() if isinstance(value, bytes) else value
    try:
        parsed = datetime.fromisoformat(text)  # RQ writes 2026-12-01T18:00:00.123456Z
    except ValueError:
        return str_to_date(text)
    return parsed if parsed.tzinfo is not None else str_to_date(text)


class ParleyJob(Job):
    """RQ imports whatever function a job hash names; the allowlist is checked before that."""

    # RQ resolves the serializer for every Job it builds, with an isinstance check against a
    # runtime Protocol (tens of microseconds, a job per take); a worker has one serializer
    _serializers: dict[Any, Any] = {}

    def __init__(self, id: str | None = None, connection: Any = None, serializer: Any = None):
        super().__init__(id, connection=connection)  # RQ's default serializer: no check
        resolved = self._serializers.get(serializer)
        if resolved is None:
            resolved = self._serializers[serializer] = resolve_serializer(serializer)
        self.serializer = resolved

    @property
    def func(self):  # type: ignore[no-untyped-def]
        if self.func_name not in ALLOWED_FUNCS:
            log.error("refused a job naming a function outside Parley's own",
                      extra={"kv": {"job": self.id, "func": self.func_name}})
            JOBS_REFUSED.labels("foreign_function").inc()
            raise RefusedJob(f"job {self.id} names {self.func_name!r}, which is not a Parley job")
        # one of workers/jobs.py's own functions: taken from the module already imported rather
        # than imported by name for every job (RQ's import_attribute)
        return getattr(jobs, self.func_name.rpartition(".")[2])

    def restore(self, raw_data: Any) -> Any:
        """RQ's restore, with its timestamps read by `datetime.fromisoformat` (C) rather than
        `strptime` (Python, about a tenth of a lean job's worker CPU for the two a queued job
        has). Same values: UTC-aware datetimes; any other form is left to RQ's parser."""
        rest: dict[Any, Any] = {}
        dates: dict[str, Any] = {}
        for name, value in raw_data.items():
            key = name.decode() if isinstance(name, bytes) else name
            if key in _DATES and value:
                dates[key] = value
            else:
                rest[name] = value
        super().restore(rest)
        for key, value in dates.items():
            setattr(self, key, _utc(value))

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


class ParleyWorker(TakingWorker):
    """SimpleWorker with a lean path for Parley's own jobs (docs/design.md, bench/README.md).

    A Parley job posts its outcome to a results stream and is tracked by Parley's own records
    (`parley:inflight` from enqueue to outcome, `parley:running` while a worker runs it), so
    RQ's per-job bookkeeping (started registry, execution records, job status and result,
    worker state and counters: about 50 commands and 15 round trips per job) buys nothing
    here. The lean path is one round trip per job: one script posts the outcome of the job just
    run, deletes its hash and both records, then pops the next job, records it as running and
    returns its hash (workers/lua/take_job.lua, called by workers/takes.py). Everything else
    (a job that raises instead of posting, a planted job naming a foreign function) goes
    through RQ's own failure handling, as before.
    """

    job_class = ParleyJob
    queue_class = Queue
    # functions that post their own outcome and clean up after themselves (workers/jobs.py)
    lean_funcs: frozenset[str] = ALLOWED_FUNCS
    # RQ refreshes the worker's key (and checks `rq suspend`) around every job; a worker's key
    # lives worker_ttl + 60 s, so refreshing it every few seconds keeps `rq info` true.
    HEARTBEAT_EVERY_S = 5.0
    SUSPENSION_CHECK_EVERY_S = 1.0

    def __init__(self, *args: Any, keys: Keys | None = None, **kwargs: Any):
        super().__init__(*args, keys=keys, **kwargs)
        self._beat_at = 0.0
        self._suspension_checked_at = 0.0

    # ---- fewer writes around each job ---------------------------------------------------------

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        if timeout is None and time.monotonic() - self._beat_at < self.HEARTBEAT_EVERY_S:
            return
        pipe = self.connection.pipeline(transaction=False)
        super().heartbeat(timeout, pipeline=pipe)
        pipe.hset(self.key, "state", self.get_state())
        pipe.execute()
        self._beat_at = time.monotonic()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        # Busy/idle flips on every job; the state is kept here (warm shutdown reads it) and
        # written with the next heartbeat.
        if pipeline is not None or state not in (WorkerStatus.BUSY, WorkerStatus.IDLE):
            super().set_state(state, pipeline=pipeline)
        else:
            self._state = state

    def check_for_suspension(self, burst: bool) -> None:
        if self._next is not None:  # a job taken is run first; the next loop checks
            return
        if time.monotonic() - self._suspension_checked_at < self.SUSPENSION_CHECK_EVERY_S:
            return
        super().check_for_suspension(burst)
        self._suspension_checked_at = time.monotonic()

    # ---- RQ's command channel -------------------------------------------------------------------

    #: how long the thread reading RQ's command channel (`rq` shutdown / kill-horse commands)
    #: waits per read; RQ's own 60 s would hold a stop up to that long (see `subscribe`)
    PUBSUB_WAKE_S = 1.0

    def subscribe(self) -> None:
        """RQ's subscribe, with the channel's reader waking every `PUBSUB_WAKE_S` instead of 60 s.
        On SIGTERM, RQ stops that thread, and redis-py 8.2 waits for it to end without a
        timeout (`PubSubWorkerThread.stop` joins it), where RQ meant to wait one second: a
        reader asleep in a 60 s read held the worker's exit for up to a minute, past a
        Kubernetes grace period (30 s), and the worker was then killed mid-teardown."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ's annotation
            sleep_time=self.PUBSUB_WAKE_S, daemon=True, exception_handler=self._pubsub_exception_handler)

    # ---- running a job ------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """RQ raises StopRequested from the signal handler when the worker is idle, wherever the
        main thread is: between a take and the job's first line that would leave a job recorded
        as running on a worker that never runs it. The request is only noted here; the dequeue
        loop and RQ's loop act on it between jobs (a job taken is run first)."""
        self._stop_requested = True
        self.set_shutdown_requested_date()

    def execute_job(self, job: Job, queue: Queue) -> None:
        if not getattr(job, "parley_claimed", False) or job.func_name not in self.lean_funcs:
            # Not claimed (a worker with no id records nothing) or not one of Parley's own
            # functions: RQ's full path, its failed registry included. A job no dispatcher
            # issued never gets here: take_job.lua drops it.
            super().execute_job(job, queue)
            return
        self.set_state(WorkerStatus.BUSY)
        job.started_at = now()
        job.parley_defer = True  # type: ignore[attr-defined]  # its outcome is posted with the next take
        try:
            timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
            try:
                with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                    # leaves its outcome in job.parley_finish (or, with --replica-acks, posts it
                    # and deletes the job hash itself: workers/jobs.py)
                    job.perform()
            except Exception:
                # The time limit may strike after the job left its outcome, before the block
                # is left: the work is done and its outcome stands (it is posted below).
                if getattr(job, "parley_finish", None) is None:
                    raise
            finish: Finish | None = getattr(job, "parley_finish", None)
            if finish is not None:
                self.finish(job, finish)
        except Exception:
            # The job raised instead of posting an outcome (it could not reach Redis for
            # minutes, or its payload was malformed). Its running record must go, so that the
            # in-flight record lets a dispatcher post the loss: a record left on this worker,
            # which keeps heartbeating, would hold its session forever.
            exc_info = sys.exc_info()
            job.ended_at = now()
            self.release_running(job.id)
            self.handle_exception(job, *exc_info)
            self.handle_job_failure(job, queue, exc_string=_format(exc_info))  # RQ's failed registry
        finally:
            self.set_state(WorkerStatus.IDLE)

    def finish(self, job: Job, finish: Finish) -> None:
        """Post a job's outcome, delete its hash and records, and take the next job: one call
        of take_job.lua, retried through Redis outages with the same token (a retry of a call
        that ran returns what it took and posts nothing again). The job taken is run by the next
        dequeue. None is taken once a stop was requested: the worker stops after this job.

        Outside the job's time limit: an outcome is the only trace of work done, and it rides
        out a Redis restart as long as any post does (jobs.OUTAGE_PATIENCE_S). Past that, the
        worker cannot know whether its last call ran (and took a job it does not know of): it
        exits, its heartbeat lapses, and a dispatcher posts the loss of every job recorded on it."""
        token = secrets.token_hex(8)
        take_next = not self._stop_requested
        taken: tuple[Job, Queue] | bool | None = None

        def call() -> None:
            nonlocal taken
            taken = self.take(token, finish=(job, finish), take_next=take_next)

        try:
            jobs.through_outages(call, "post an outcome")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self.log.critical("could not post the outcome of job %s; exiting so that a dispatcher "
                              "sees this worker gone and posts the loss", job.id)
            os._exit(75)
        if finish.done is not None:
            finish.done()
        if isinstance(taken, tuple):
            self._next = taken
        self._drained = taken is None and take_next

    def teardown(self) -> None:
        self.give_back()
        super().teardown()


def worker_id() -> str:
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


def _format(exc_info: Any) -> str:
    import traceback

    return "".join(traceback.format_exception(*exc_info))


def make_worker(queue_names: list[str], connection, name: str | None = None,  # type: ignore[no-untyped-def]
                keys: Keys | None = None, block_s: float = ParleyWorker.block_s) -> ParleyWorker:
    start_worker_series()  # idempotent: the series exist at 0 from the first worker on
    queues = [Queue(q, connection=connection, serializer=JSONSerializer, job_class=ParleyJob)
              for q in queue_names]
    worker = ParleyWorker(queues, connection=connection, serializer=JSONSerializer, name=name,
                          job_class=ParleyJob, keys=keys)
    worker.block_s = block_s
    return worker
