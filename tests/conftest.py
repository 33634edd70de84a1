"""Fixtures: a private real redis-server per test, and Parley processes started like a user would."""

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, stop_processes
from tests import forkserver
from tests.forkserver import start_parley

ROOT = Path(__file__).resolve().parent.parent

# Every dispatcher and worker a test starts (they inherit this environment) blocks 100 ms at a
# time when idle, not 500/1000 ms: a test's teardown stops its fleet with SIGTERM, and an idle
# process acts on it only after its blocking read (docs/operations.md, "Processes"). The chaos
# runs and the bench keep the defaults.
os.environ.setdefault("PARLEY_IDLE_BLOCK_MS", "100")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (free port, temp dir): tests can kill and restart it."""
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def client(r: redis.Redis) -> Client:
    return Client(r)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A PostgreSQL: the machine's when it answers, else a private one (tests/postgres.py)."""
    from tests.postgres import postgres_dsn

    with postgres_dsn() as dsn:
        yield dsn


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A schema of this test's own in `pg_dsn`, dropped with its tables afterwards."""
    from tests.postgres import private_schema

    with private_schema(pg_dsn) as name:
        yield name


@dataclass
class Procs:
    """Start `parley dispatcher` / `parley worker` as processes; all are stopped at teardown."""

    url: str
    logdir: Path
    started: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    # the URL of each kind of process where it is not `url`: a deployed Redis's logins
    urls: dict[str, str] = field(default_factory=dict)

    def env(self, app: str, kind: str = "") -> dict[str, str]:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        return {"PARLEY_REDIS_URL": self.urls.get(kind, self.url), "PARLEY_APP": app, "PYTHONPATH": path,
                "PARLEY_LOG_LEVEL": "INFO"}

    def start(self, kind: str, app: str = "tests.apps.scenarios", *args: str,
              env: dict[str, str] | None = None, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        """`parley KIND ARGS...`; with `crash_at` ("POINT:N"), run through tests/e2e/crash_at.py,
        which makes the process kill -9 itself at that point."""
        log = self.logdir / f"{kind}-{len(self.started)}.log"
        environ = {**self.env(app, kind), **(env or {})}
        if crash_at is None:
            proc = start_parley([kind, *args], environ, log)
        else:
            proc = forkserver.start("tests.e2e.crash_at", [crash_at, kind, *args], {**os.environ, **environ},
                                    stdout=log)
        self.started.append((kind, proc, log))
        return proc

    def dispatcher(self, app: str = "tests.apps.scenarios", *args: str,
                   env: dict[str, str] | None = None, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        return self.start("dispatcher", app, *args, env=env, crash_at=crash_at)

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        """A process the test killed on purpose: not expected to exit 0 at teardown."""
        self.started = [p for p in self.started if p[1] is not proc]

    def worker(self, app: str = "tests.apps.scenarios", *args: str) -> subprocess.Popen[bytes]:
        return self.start("worker", app, *args)

    def logs(self) -> str:
        return "\n".join(f"----- {log.name} -----\n{log.read_text(errors='replace')[-4000:]}"
                         for _kind, _proc, log in self.started if log.exists())


@pytest.fixture
def deployed_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """Redis as shipped (tests/deployed.py): redis.conf, users.acl, producer `app` registered.
    A module whose tests must hold under the shipped deployment makes it its `redis_server`;
    `procs` then starts dispatchers and workers under their own logins, and `r` is the
    harness's admin."""
    from tests.deployed import started_for_producers

    server = started_for_producers(tmp_path / "redis")
    yield server
    server.stop(kill=True)


@pytest.fixture
def producer_client(redis_server: RedisServer) -> Iterator[Client]:
    """What an app writes inputs with under the shipped ACL file: the producer login, through
    the submit function, as producer `app`."""
    from tests.deployed import PRODUCER, PRODUCER_NAME, login

    conn = redis.Redis.from_url(redis_server.url_as(login(PRODUCER)))
    yield Client(conn, producer=PRODUCER_NAME)
    conn.close()


@pytest.fixture
def procs(redis_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    p = Procs(redis_server.url, tmp_path)
    if redis_server.aclfile is not None:  # deployed: each process under its shipped login
        from tests.deployed import DISPATCHER, WORKER, login

        p.urls = {"dispatcher": redis_server.url_as(login(DISPATCHER)),
                  "worker": redis_server.url_as(login(WORKER))}
    yield p
    codes = stop_processes([proc for _kind, proc, _log in p.started])
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(p.logs())
    # SIGTERM must end every process cleanly (exit 0), whatever the test did.
    assert all(code == 0 for code in codes), f"exit codes {codes}\n{p.logs()}"


def wait_for(client: Client, session: str, predicate: Callable[[dict[str, Any]], bool],
             timeout: float = 20) -> list[dict[str, Any]]:
    """All events of `session` up to and including the first one matching `predicate`."""
    seen: list[dict[str, Any]] = []
    for _id, event in client.events(session, block_ms=200, until=time.monotonic() + timeout):
        seen.append(event)
        if predicate(event):
            return seen
    raise AssertionError(f"no matching event within {timeout}s; saw {[e['type'] for e in seen]}")


def all_events(client: Client, session: str) -> list[dict[str, Any]]:
    return [e for _id, e in client.events(session, block_ms=1, until=time.monotonic() + 0.05)]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def eventually(check: Callable[[], bool], timeout: float = 5) -> None:
    """For effects that follow a commit (the outbox flush): poll until `check()` holds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout}s: {check}")
        time.sleep(0.02)


def send(r: redis.Redis, session: str, value: dict[str, Any], **fields: str) -> str:
    """XADD one input to `parley:inputs`, exactly as an outside producer would."""
    entry: Any = r.xadd("parley:inputs", {"session": session, "input": orjson.dumps(value), **fields})
    return str(entry.decode())
