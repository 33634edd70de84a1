"""Taking jobs: the lean take, its confirmation, and giving back a job taken and not run.

A take is one call of take_job.lua: it posts the outcome of the job just run (when there is
one), pops the next job, records it as running on this worker and returns its hash. With
`--replica-acks K` a job is run only once K replicas hold its take (`confirm_take`); one not
confirmed, or taken by a worker that stops before it runs it, is given back (give_back.lua:
its unrun outcome, signed with its token, makes a dispatcher issue it again).
The worker itself (what runs a job, and RQ's bookkeeping it skips) is workers/worker.py.
"""

import logging
import os
import secrets
import time
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import DequeueTimeout
from rq.job import Job
from rq.worker import WorkerStatus

from parley.runtime import metrics
from parley.runtime.replicas import ServerId
from parley.runtime.retry import backoff
from parley.schemas.keys import Keys
from parley.workers import jobs
from parley.workers.jobs import Finish
from parley.workers.scripts import LUA

#: take_job.lua's codes for a job dropped unrun: the reason it is counted under, and why
NOT_ISSUED = {
    -2: ("not_issued", "no dispatcher issued it (it has no in-flight record): made up by someone who may "
                       "write RQ's keys, such as another worker"),
    -3: ("changed", "its function or arguments are not what the dispatcher issued (its hash was "
                    "changed since)"),
}


class TakingWorker(SimpleWorker):
    """RQ's non-forking worker, taking its jobs with take_job.lua rather than RQ's dequeue."""

    def __init__(self, *args: Any, keys: Keys | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.parley_keys = keys or Keys()
        jobs.set_keys(self.parley_keys)  # the jobs it runs answer and keep their records under it
        self._take = LUA.register(self.connection, "take_job")
        self._give_back = LUA.register(self.connection, "give_back")
        # the job the last finish took (recorded as running here), run by the next dequeue
        self._next: tuple[Job, Queue] | None = None
        # the last finish found every queue empty: the next dequeue goes straight to its wait
        self._drained = False

    def take(self, token: str, popped: str = "", finish: tuple[Job, Finish] | None = None,
             take_next: bool = True, popped_from: str = "") -> tuple[Job, Queue] | bool | None:
        """Run take_job.lua: (job, queue), None when every queue is empty (or `take_next` is
        False), False when the popped job was cancelled meanwhile or is held by another worker.
        With `finish`, the same call first posts that job's outcome and deletes its hash and
        records. `popped`: a job id the blocking wait popped from the queue `popped_from` (its
        key): the script pops it there again if that server never saw the pop (take_job.lua).
        `token` is the take's secret (`new_take_secret`). Call again with the same one after a
        call that got no reply: it returns the job that call took (its job token included), if
        it took one, and posts nothing again."""
        worker = jobs.worker_id() or ""
        args: list[Any] = [worker, self.job_class.redis_job_namespace_prefix, popped,
                self.parley_keys.running, self.parley_keys.inflight,
                self.parley_keys.last_take(worker), token, "1" if jobs.replicas_enabled() else "0",
                popped_from if popped else ""]
        if finish is not None:
            done, post = finish
            args += [done.id, post.reply_to, post.outcome, self.parley_keys.inflight_order(done.origin),
                     "1" if take_next else "0", getattr(done, "parley_record", None) or "",
                     self.parley_keys.job_token(""), post.sig]
        else:
            args += ["", "", "", "", "1", "", self.parley_keys.job_token(""), ""]
        reply: Any = self._call_take(self.queue_keys(), args)
        if reply is None:
            return None
        raw_id, raw_queue, claimed, fields, record, run_id, replid, job_token = reply
        job_id = raw_id.decode()
        queue_key = raw_queue.decode() if raw_queue else ""
        if claimed == -1:
            # popped here by a BLPOP on a server that lost the pop (a failover), and claimed by
            # the worker that popped it on the server reached now: its job, not ours
            self.log.warning("job %s, popped by this worker, is held by another worker (the pop "
                             "was lost in a failover); not taking it", job_id)
            return False
        if claimed in NOT_ISSUED:
            # no dispatcher issued this job as it is (take_job.lua dropped it unrun): made up, or
            # changed since, by someone who may write RQ's keys
            reason, why = NOT_ISSUED[claimed]
            metrics.JOBS_REFUSED.labels(reason).inc()
            self.log.error("dropped job %s unrun: %s", job_id, why)
            return False
        if not fields:
            if claimed:  # taken by a call that got no reply, cancelled since
                self.release_running(job_id)
            return False
        if not job_token:
            # No token: another worker's take read it first (one that took the job off a queue
            # by hand), or the token's wait expired, or no dispatcher wrote one. Its outcome
            # could not be proven to be ours, so it is not run; its in-flight record lets a
            # dispatcher hand it back as lost (retried when that is safe).
            metrics.JOBS_REFUSED.labels("no_token").inc()
            self.log.warning("not running job %s: its take found no token (read by another take, or "
                             "waited past the token's time); a dispatcher hands it back", job_id)
            if claimed:
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
        job.parley_job_token = _text(job_token)  # type: ignore[attr-defined]
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
    # (`parley worker --idle-block-ms` sets it per worker)
    block_s: float = 1.0

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
        # same secret (and the same popped id) and gets what that call took.
        token = new_take_secret()
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
                    token = new_take_secret()
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
                    reply: Any = self.connection.blpop(self.queue_keys(), min(wait, self.block_s))
                    if reply is None:
                        self.heartbeat()
                        continue
                    popped_from, popped, token = reply[0].decode(), reply[1].decode(), new_take_secret()
                    continue
                job, queue = taken  # type: ignore[misc]
                if not self.confirm_take(job, queue):
                    token = new_take_secret()
                    outages = self._unconfirmed(outages)
                    continue
                if self.log.isEnabledFor(logging.DEBUG):
                    self.log.debug("Worker %s: took job %s from %s", self.name, job.id, queue.name)
                return job, queue
            except DequeueTimeout:
                continue
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as conn_err:
                wait_s = backoff(outages, base=1.0, cap=self.max_connection_wait_time,
                                 growth=self.exponential_backoff_factor, jitter=True)
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
        another server) is not retried: the job is given back (give_back.lua, which posts its
        unrun outcome only if the server now reached holds the take) and False returned; the
        dequeue loop backs off and takes again."""
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
                           growth=self.exponential_backoff_factor, jitter=True))
        return outages + 1

    def give_back(self) -> None:
        """The worker stops (a stop request during its last finish, `--max-jobs`, an error) with
        a job taken and not run: post its unrun outcome, signed with its token, and delete its
        records, in one script (give_back.lua), so that a dispatcher issues it again for
        another worker; unless a dispatcher settled it meanwhile (its in-flight record is gone:
        its loss posted while this worker's heartbeat had lapsed, or cancelled), when it is
        dropped, or unless the server does not hold the take (lost in a failover), when
        nothing is done. Should the call fail, the job stays recorded on this worker, and its
        loss is posted once the heartbeat lapses."""
        held, self._next = self._next, None
        if held is not None:
            self.give_back_take(*held, stopping=True)

    def give_back_take(self, job: Job, queue: Queue, stopping: bool = False) -> None:
        """give_back.lua, through outages. Should the call fail for good, the job may stay
        recorded on this worker, which must then not live on heartbeating with it: unless it is
        `stopping` anyway, it exits, and the loss is posted once its heartbeat lapses."""
        worker = jobs.worker_id() or ""
        token = getattr(job, "parley_token", "") if worker else ""
        unrun = jobs.unrun_outcome(job)

        def back() -> None:
            given = self._give_back(keys=[job.key],
                                    args=[job.id, self.parley_keys.running, self.parley_keys.inflight,
                                          self.parley_keys.last_take(worker), token,
                                          "1" if getattr(job, "parley_claimed", False) else "0",
                                          # its unrun outcome, signed with its token: the
                                          # dispatcher issues it again (give_back.lua)
                                          unrun.reply_to, unrun.outcome, unrun.sig,
                                          self.parley_keys.inflight_order(job.origin),
                                          getattr(job, "parley_record", None) or ""])
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


def new_take_secret() -> str:
    """A take's secret: the last-take record keeps only its hash and masks the job's token with
    it, so it must not be guessable (128 random bits; take_job.lua)."""
    return secrets.token_hex(16)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
