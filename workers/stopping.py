"""Stopping a model call the dispatcher voided while a worker runs it.

A park voids the session's model calls in flight (`llm.voided`); the dispatcher's cancel then
takes the job off its queue and deletes its in-flight record (`parley:inflight[job]`,
dispatcher/enqueue.py). A job whose in-flight record is gone while it runs has nobody waiting for
its result: it was voided, or a dispatcher already posted its loss and retried it.

While a model call runs, one watcher thread per worker process reads that record every
`POLL_S` (one HGET; nothing while no model call runs). When it is gone, the watcher interrupts the
main thread with SIGUSR1, whose handler raises `CallVoided` where the call is: the way RQ's time
limit (SIGALRM) stops a job in a non-forking worker. Raised inside a blocking socket read, it makes
httpx close the connection, so the provider sees the client leave and stops generating; raised in
a retry's wait, it ends the retries. Any `llm` is stopped this way, plain Python included.

Only model calls are stopped: a voided decide keeps running and its decision is dropped when it
arrives (interrupting an app's `decide` buys little: it is short and spends no tokens).
"""

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("parley.worker")

POLL_S = 0.25
SIGNAL = signal.SIGUSR1


class CallVoided(BaseException):
    """Raised inside a model call whose job was voided. A BaseException, like KeyboardInterrupt,
    so that an `except Exception` in an app's own code does not swallow it and carry on."""


@dataclass(frozen=True, slots=True)
class Watched:
    """The job whose in-flight record the watcher reads."""

    connection: Any  # redis.Redis (thread-safe: the watcher's reads take their own connection)
    inflight: str
    job_id: str


class VoidWatch:
    """Watches the one model call a worker's main thread runs at a time (see the module's doc)."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._changed = threading.Condition()
        # Written by the main thread only; read by the watcher and by the signal handler (which
        # runs in the main thread). A handler that finds another job, or none, does nothing.
        self._watched: Watched | None = None
        self._voided: str | None = None  # the job id the watcher found voided
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, watched: Watched) -> Iterator[None]:
        """Run the body as the watched call: CallVoided is raised in it if its job is voided.
        Outside the main thread (no signals there) the body just runs."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._start()
        with self._changed:
            self._watched = watched
            self._changed.notify_all()
        try:
            yield
        finally:
            # First, and without the lock: from here on a signal finds no call to stop.
            self._watched = None
            with self._changed:
                self._changed.notify_all()

    # ---- inside ----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None:
            return
        # Installed once, for the life of the process: a signal that arrives late (the call ended
        # meanwhile) must meet this handler, never SIGUSR1's default, which ends the process.
        signal.signal(SIGNAL, self._on_signal)
        self._thread = threading.Thread(target=self._run, name="parley-void-watch", daemon=True)
        self._thread.start()

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        watched = self._watched
        if watched is not None and self._voided == watched.job_id:
            raise CallVoided(watched.job_id)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._watched is not None)
                watched = self._watched
            # a first look after one period: most calls are over before it
            if watched is None or self._ended(watched, self.poll_s):
                continue
            if self._is_voided(watched):
                self._stop(watched)

    def _ended(self, watched: Watched, within: float | None) -> bool:
        """True once the main thread has left the call to `watched` (waiting up to `within` s)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._watched is not watched, timeout=within)

    @staticmethod
    def _is_voided(watched: Watched) -> bool:
        try:
            return watched.connection.hget(watched.inflight, watched.job_id) is None
        except RedisError:
            return False  # Redis away: let the call run (its outcome is dropped if it was voided)

    def _stop(self, watched: Watched) -> None:
        with self._changed:
            if self._watched is not watched:
                return
            self._voided = watched.job_id
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, SIGNAL)
        self._ended(watched, None)  # one signal per call: wait for the main thread to leave it


# one per process: the worker runs one job at a time, in its main thread
void_watch = VoidWatch()
