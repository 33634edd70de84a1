"""The RQ worker Parley runs: non-forking, JSON-only, and limited to Parley's own jobs.

Why `SimpleWorker` (no fork per job): decide and tool jobs are small, and a fork plus
re-import costs more than the job; the app is loaded once; metrics live in one
process. What it gives up: RQ cannot stop a running job in a non-forking worker; Parley
stops a voided model call itself, by interrupting the main thread (workers/stopping.py), and
any other voided job finishes and its result is dropped on arrival.
"""

import logging
import os
import secrets
import socket
import sys
import threading
import time
from datetime import datetime
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import DequeueTimeout
from rq.job import Job
from rq.serializers import JSONSerializer, resolve_serializer
from rq.timeouts import JobTimeoutException
from rq.utils import now, str_to_date
from rq.worker import WorkerStatus

from parley.runtime.metrics import JOBS_REFUSED, Health, start_worker_series
from parley.runtime.replicas import ServerId
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys
from parley.workers import jobs
from parley.workers.jobs import ALLOWED_FUNCS, Finish
from parley.workers.scripts import LUA

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
            JOBS_REFUSED.inc()
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


class ParleyWorker(SimpleWorker):
    """SimpleWorker with a lean path for Parley's own jobs (docs/design.md, bench/README.md).

    A Parley job posts its outcome to a results stream and is tracked by Parley's own records
    (`parley:inflight` from enqueue to outcome, `parley:running` while a worker runs it), so
    RQ's per-job bookkeeping (started registry, execution records, job status and result,
    worker state and counters: about 50 commands and 15 round trips per job) buys nothing
    here. The lean path is one round trip per job: one script posts the outcome of the job just
    run, deletes its hash and both records, then pops the next job, records it as running and
    returns its hash (workers/lua/take_job.lua). Everything else (a job that raises instead of
    posting, a planted job naming a foreign function) goes through RQ's own failure handling,
    as before.
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
        super().__init__(*args, **kwargs)
        self.parley_keys = keys or Keys()
        jobs.set_keys(self.parley_keys)  # the jobs it runs answer and keep their records under it
        self._take = LUA.register(self.connection, "take_job")
        self._give_back = LUA.register(self.connection, "give_back")
        self._beat_at = 0.0
        self._suspension_checked_at = 0.0
        # the job the last finish took (recorded as running here), run by the next dequeue
        self._next: tuple[Job, Queue] | None = None
        # the last finish found every queue empty: the next dequeue goes straight to its wait
        self._drained = False

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

    # ---- the lean path ------------------------------------------------------------------------

    def take(self, token: str, popped: str = "", finish: tuple[Job, Finish] | None = None,
             take_next: bool = True, popped_from: str = "") -> tuple[Job, Queue] | bool | None:
        """Run take_job.lua: (job, queue), None when every queue is empty (or `take_next` is
        False), False when the popped job was cancelled meanwhile or is held by another worker.
        With `finish`, the same call first posts that job's outcome and deletes its hash and
        records. `popped`: a job id the blocking wait popped from the queue `popped_from` (its
        key): the script pops it there again if that server never saw the pop (take_job.lua).
        Call again with the same `token` after a call that got no reply: it returns the job that
        call took, if it took one, and posts nothing again."""
        worker = jobs.worker_id() or ""
        args: list[Any] = [worker, self.job_class.redis_job_namespace_prefix, popped,
                self.parley_keys.running, self.parley_keys.inflight,
                self.parley_keys.last_take(worker), token, "1" if jobs.replicas_enabled() else "0",
                popped_from if popped else ""]
        if finish is not None:
            done, post = finish
            args += [done.id, post.reply_to, post.outcome, self.parley_keys.inflight_order(done.origin),
                     "1" if take_next else "0", getattr(done, "parley_record", None) or ""]
        reply: Any = self._call_take(self.queue_keys(), args)
        if reply is None:
            return None
        raw_id, raw_queue, claimed, fields, record, run_id, replid = reply
        job_id = raw_id.decode()
        queue_key = raw_queue.decode() if raw_queue else ""
        if claimed == -1:
            # popped here by a BLPOP on a server that lost the pop (a failover), and claimed by
            # the worker that popped it on the server reached now: its job, not ours
            self.log.warning("job %s, popped by this worker, is held by another worker (the pop "
                             "was lost in a failover); not taking it", job_id)
            return False
        if not fields:
            if claimed:  # taken by a call that got no reply, cancelled since
                self.release_running(job_id)
            return False
        queue = next((q for q in self._ordered_queues if q.key == queue_key), None)
        job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
        try:
            job.restore(dict(zip(fields[::2], fields[1::2], strict=True)))
        except Exception:
            # A job hash RQ cannot read must not stop the worker: it is skipped (its in-flight
            # record, if any, lets a dispatcher post the loss).
            self.log.exception("skipped job %s: its hash cannot be read", job_id)
            if claimed:
                self.release_running(job_id)
            return False
        if queue is None:  # popped by the blocking wait: its origin names the queue
            queue = next((q for q in self._ordered_queues if q.name == job.origin), self._ordered_queues[0])
        job.parley_claimed = bool(claimed)  # type: ignore[attr-defined]
        # what the take was: its token (the worker's last-take record names it, give_back.lua),
        # the in-flight record it read (its outcome deletes the job's records only while they
        # are still that job's: finish_lib.lua), and the server that took it (confirm_take)
        job.parley_token = token  # type: ignore[attr-defined]
        job.parley_record = record  # type: ignore[attr-defined]
        job.parley_server = ServerId(_text(run_id), _text(replid))  # type: ignore[attr-defined]
        return job, queue

    def _call_take(self, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA of take_job.lua, loading it when Redis does not have it (a fresh or restarted
        server): what redis-py's Script call does, without its per-call import and Pipeline
        protocol check (a job's worth of microseconds, once per job)."""
        try:
            return self.connection.evalsha(self._take.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self._take.sha = self.connection.script_load(self._take.script)
            return self.connection.evalsha(self._take.sha, len(keys), *keys, *args)

    # blocking waits are short, so that a stop request is acted on within a second when idle
    BLOCK_S = 1

    def _shutdown(self) -> None:
        """RQ raises StopRequested from the signal handler when the worker is idle, wherever the
        main thread is: between a take and the job's first line that would leave a job recorded
        as running on a worker that never runs it. The request is only noted here; the dequeue
        loop and RQ's loop act on it between jobs (a job taken is run first)."""
        self._stop_requested = True
        self.set_shutdown_requested_date()

    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """RQ's dequeue loop (outage backoff, idle limit) around take_job.lua. When every queue is
        empty it blocks in BLPOP, then claims what it popped with the same script, naming the
        queue it came from: the script pops it from there again if the server it reaches never
        saw the BLPOP (a failover in between lost it), so that a job the take confirmation
        covers is never still queued. Between the two, the job's in-flight record covers a
        kill -9 (the dispatcher posts the loss)."""
        self.set_state(WorkerStatus.IDLE)
        self.heartbeat()
        outages = 0  # consecutive failed attempts to reach Redis (or to confirm a take), for the backoff
        if self._next is not None:  # taken with the last job's outcome
            (job, queue), self._next = self._next, None
            if self.confirm_take(job, queue):
                return job, queue
            outages = self._unconfirmed(outages)
        idle_since = time.monotonic()
        # Kept until a call gets its answer: the retry of a call that got no reply passes the
        # same token (and the same popped id) and gets what that call took.
        token = secrets.token_hex(8)
        popped = ""  # a job id BLPOP handed us, until take_job.lua has recorded it
        popped_from = ""  # the queue BLPOP popped it from
        while True:
            try:
                if self._stop_requested and not popped:
                    return None
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if self._drained and not popped:
                    taken = None  # the last finish found every queue empty a moment ago
                    self._drained = False
                else:
                    taken = self.take(token, popped, popped_from=popped_from)
                popped = popped_from = ""
                if taken is False:
                    token = secrets.token_hex(8)
                    continue
                if taken is None:
                    wait = timeout
                    if max_idle_time is not None:
                        left = max_idle_time - (time.monotonic() - idle_since)
                        if left <= 0:
                            return None
                        wait = max(1, min(wait or int(left), int(left)))
                    if wait is None:  # burst: nothing queued means done
                        return None
                    reply: Any = self.connection.blpop(self.queue_keys(), min(wait, self.BLOCK_S))
                    if reply is None:
                        self.heartbeat()
                        continue
                    popped_from, popped, token = reply[0].decode(), reply[1].decode(), secrets.token_hex(8)
                    continue
                job, queue = taken  # type: ignore[misc]
                if not self.confirm_take(job, queue):
                    token = secrets.token_hex(8)
                    outages = self._unconfirmed(outages)
                    continue
                if self.log.isEnabledFor(logging.DEBUG):
                    self.log.debug("Worker %s: took job %s from %s", self.name, job.id, queue.name)
                return job, queue
            except DequeueTimeout:
                continue
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as conn_err:
                wait_s = backoff(outages, base=1.0, cap=self.max_connection_wait_time,
                                 growth=self.exponential_backoff_factor)
                outages += 1
                self.log.error("Worker %s: could not connect to Redis instance: %s retrying in %d seconds...",
                               self.name, conn_err, wait_s)
                time.sleep(wait_s)

    def confirm_take(self, job: Job, queue: Queue) -> bool:
        """`--replica-acks K`: a job is run only once K replicas hold its take. Otherwise a
        failover could promote a replica that lacks the transition which enqueued it, whose
        replay enqueues it again: run twice (or, for a model call, run where its messages are
        not, and failed).

        Confirmed only by a WAIT on the server that made the take, asked once: the take's reply
        names that server (its run_id and master_replid), and the probe write and WAIT come
        back with the name of the server that answered them, in one pipeline, so on one
        connection (parley.runtime.replicas, `take_confirmed`). A WAIT answered by any other server (the
        pool reconnected to a promoted replica, or to the same address restarted), or by the
        same process since demoted, resynced and promoted again (another replid), says nothing
        of the take, which that server may never have seen, or lost. Comparing the server
        rather than keeping one connection object holds whatever the pool does: redis-py's
        retries reconnect inside a call, a Sentinel-managed pool hands a connection to the new
        primary, and neither is visible to the caller. Any error (an outage, replicas behind,
        another server) is not retried: the job is given back (give_back.lua, which pushes it
        back only if the server now reached holds the take) and False returned; the dequeue
        loop backs off and takes again."""
        try:
            jobs.confirm_take(self.connection, getattr(job, "parley_server", ServerId()))
            return True
        except redis.exceptions.RedisError as exc:
            self.log.error("Worker %s: replicas never held the take of job %s (%r); not running it",
                           self.name, job.id, exc)
            self.give_back_take(job, queue)
            return False

    def _unconfirmed(self, outages: int) -> int:
        """A take not confirmed: back off as for an outage before taking again."""
        time.sleep(backoff(outages, base=0.1, cap=self.max_connection_wait_time,
                           growth=self.exponential_backoff_factor))
        return outages + 1

    def execute_job(self, job: Job, queue: Queue) -> None:
        if not getattr(job, "parley_claimed", False) or job.func_name not in self.lean_funcs:
            # Not enqueued by a dispatcher (no in-flight record) or not one of Parley's own
            # functions: RQ's full path, its failed registry included.
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

    def give_back(self) -> None:
        """The worker stops (a stop request during its last finish, `--max-jobs`, an error) with
        a job taken and not run: put it back at the head of its queue and delete its running
        record, in one script (give_back.lua), so that another worker runs it; unless a
        dispatcher settled it meanwhile (its in-flight record is gone: its loss posted while this
        worker's heartbeat had lapsed, or cancelled), when it is dropped, or unless the server
        does not hold the take (lost in a failover), when nothing is done. Should the call fail,
        the job stays recorded on this worker, and its loss is posted once the heartbeat lapses."""
        held, self._next = self._next, None
        if held is not None:
            self.give_back_take(*held, stopping=True)

    def give_back_take(self, job: Job, queue: Queue, stopping: bool = False) -> None:
        """give_back.lua, through outages. Should the call fail for good, the job may stay
        recorded on this worker, which must then not live on heartbeating with it: unless it is
        `stopping` anyway, it exits, and the loss is posted once its heartbeat lapses."""
        worker = jobs.worker_id() or ""
        token = getattr(job, "parley_token", "") if worker else ""

        def back() -> None:
            given = self._give_back(keys=[queue.key, job.key],
                                    args=[job.id, self.parley_keys.running, self.parley_keys.inflight,
                                          self.parley_keys.last_take(worker), token,
                                          "1" if getattr(job, "parley_claimed", False) else "0"])
            if given == 0:
                self.log.warning("job %s was settled while this worker held it; not given back", job.id)
            elif given == -1:
                self.log.warning("job %s: the take is not on this server (lost in a failover or a "
                                 "restart); nothing to give back", job.id)

        try:
            jobs.through_outages(back, "give back a job taken and not run")
        except redis.exceptions.RedisError:
            if stopping:
                self.log.exception("could not give back job %s; its loss is posted once this "
                                   "worker's heartbeat lapses", job.id)
                return
            self.log.critical("could not give back job %s; exiting so that a dispatcher sees this "
                              "worker gone and posts the loss", job.id)
            os._exit(75)

    def release_running(self, job_id: str) -> None:
        """Delete a job's running record, through Redis outages; a worker that cannot must not
        live on heartbeating with it, so it exits and its heartbeat lapses (lost-work sweep)."""
        try:
            jobs.through_outages(lambda: self.connection.hdel(self.parley_keys.running, job_id),
                                 "clear the running record of a failed job")
        except redis.exceptions.RedisError:
            self.log.critical("could not clear the running record of job %s; exiting so that a "
                              "dispatcher sees this worker gone and posts the loss", job_id)
            os._exit(75)


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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def worker_id() -> str:
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


def _format(exc_info: Any) -> str:
    import traceback

    return "".join(traceback.format_exception(*exc_info))


def make_worker(queue_names: list[str], connection, name: str | None = None,  # type: ignore[no-untyped-def]
                keys: Keys | None = None) -> ParleyWorker:
    start_worker_series()  # idempotent: the series exist at 0 from the first worker on
    queues = [Queue(q, connection=connection, serializer=JSONSerializer, job_class=ParleyJob)
              for q in queue_names]
    return ParleyWorker(queues, connection=connection, serializer=JSONSerializer, name=name,
                        job_class=ParleyJob, keys=keys)
