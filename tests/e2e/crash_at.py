"""Fault injection for tests: a `parley` process that kills itself (SIGKILL) at a chosen point.

    python -m tests.e2e.crash_at POINT:N dispatcher [parley dispatcher options...]

runs `parley dispatcher ...` exactly as a user would, except that the process kill -9s
itself the N-th time a transition reaches POINT:

- `before_commit`: transitions computed, about to be committed;
- `after_commit`: transitions committed, their jobs with them (the commit script enqueues
  them), their outbox not flushed yet;
- `after_flush`: a batch's settle done (effects flushed, entries acknowledged);

or `parley worker ...`, the N-th time it reaches:

- `before_finish`: a job run, its outcome not posted (ParleyWorker.finish not called);
- `after_finish`: a job's outcome posted by a finish that also took the next job, not yet run.

Why here and not in the dispatcher: production modules carry no test hooks. Every
transition passes through two seams that the tests can wrap from outside, `Store.commit_many`
(each wave's commits, one at a time included) and `Outbox.flush_many` (each settle's MULTI),
so this module patches those two methods in its own process before starting the CLI; the
dispatcher's code is the one users run. A worker's seam is `ParleyWorker.finish`.
tests/e2e/test_crash_points.py uses it.
"""

import os
import signal
import sys
from typing import Any

from parley.cli import main
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.store import COMMITTED, Store
from parley.workers.worker import ParleyWorker

POINTS = ("before_commit", "after_commit", "after_flush", "before_finish", "after_finish")


class CrashAt:
    def __init__(self, spec: str):
        point, _, n = spec.partition(":")
        if point not in POINTS:
            raise SystemExit(f"crash_at: unknown point {point!r} (one of {', '.join(POINTS)})")
        self.point = point
        self.remaining = int(n or 1)

    def reached(self, point: str, times: int = 1) -> None:
        if point != self.point or times <= 0:
            return
        self.remaining -= times
        if self.remaining <= 0:
            print(f"crash_at: {point} reached, killing this process", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        crash = self
        commit_many, flush_many = Store.commit_many, Outbox.flush_many

        def crashing_commit_many(store: Store, batch: Any, *args: Any, **kwargs: Any) -> list[int]:
            crash.reached("before_commit", len(batch))
            rcs = commit_many(store, batch, *args, **kwargs)
            crash.reached("after_commit", sum(rc == COMMITTED for rc in rcs))
            return rcs

        def crashing_flush_many(outbox: Outbox, *args: Any, **kwargs: Any) -> Any:
            replies = flush_many(outbox, *args, **kwargs)
            crash.reached("after_flush")
            return replies

        Store.commit_many = crashing_commit_many  # type: ignore[method-assign]
        Outbox.flush_many = crashing_flush_many  # type: ignore[method-assign]

        finish = ParleyWorker.finish

        def crashing_finish(worker: ParleyWorker, *args: Any, **kwargs: Any) -> None:
            crash.reached("before_finish")
            finish(worker, *args, **kwargs)
            crash.reached("after_finish", int(worker._next is not None))  # only when it took a job

        ParleyWorker.finish = crashing_finish  # type: ignore[method-assign]


if __name__ == "__main__":
    CrashAt(sys.argv[1]).install()
    sys.argv = ["parley", *sys.argv[2:]]
    main()
