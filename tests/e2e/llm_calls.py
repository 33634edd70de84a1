"""Helpers for the e2e tests that stop a model call in flight (I4, budget stops, close).

Those tests are about a call a worker is *running*: the dispatcher's `llm.started` only says
the job was enqueued. On a loaded machine the `llm` worker may not have taken it yet, and a
park or a close then takes it off its queue before it runs: nothing is stopped and the test
would wait for a stop that never comes. So each test waits for the job's running record.
"""

import urllib.error

import redis

from parley.runtime.procs import free_port
from parley.schemas.jobs import job_id
from tests.conftest import Procs, eventually
from tests.e2e.test_metrics import scrape

STOPPED = ("parley_jobs_total", (("kind", "llm"), ("outcome", "stopped")))
OK = ("parley_jobs_total", (("kind", "llm"), ("outcome", "ok")))


def metrics_or_none(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return None  # the worker's metrics server is not up yet


def start_llm_worker(procs: Procs, timeout: float = 30) -> int:
    """A worker serving the `llm` queue only, with a metrics port; returned once it serves
    metrics (its process is up), so that a test's later scrape does not race its start."""
    port = free_port()
    procs.worker("tests.apps.scenarios", "--queues", "llm", "--metrics-port", str(port))
    eventually(lambda: metrics_or_none(port) is not None, timeout=timeout)
    return port


def wait_running(r: redis.Redis, session: str, call_id: str, attempt: int = 1, timeout: float = 15) -> None:
    """Until a worker has taken the model call `call_id` and runs it (its running record)."""
    eventually(lambda: bool(r.hexists("parley:running", job_id(session, call_id, attempt))), timeout=timeout)


def llm_call_ended(port: int) -> bool:
    """The worker counted a model call as stopped, or as run to its end (a call whose void came
    after its last byte): waited for by its outcome, not by the clock. Series start at 0 when a
    worker starts: this waits for a count, not for the series."""
    counts = metrics_or_none(port)
    return counts is not None and (counts.get(STOPPED, 0) >= 1 or counts.get(OK, 0) >= 1)
