"""deploy/redis/users.acl on a real redis-server: each Parley user can do its job, and is refused
the rest (deploy/README.md, Redis ACL users; docs/design.md, One writer, one transition, one
script: producers write inputs, workers post results and never write session state, dispatchers
are the only writers of session state).

Every connection is made with `redis.Redis.from_url("redis://user:password@host:port/0")`, as the
CLI, dispatchers and workers do with `--redis-url` / PARLEY_REDIS_URL. The server loads a temp
copy of the file plus one test-only admin user, used to set the stage and to read `ACL LOG`: the
happy paths must leave the log empty, because RQ swallows some refusals (INFO, CLIENT SETNAME)
and would otherwise degrade silently.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.retry import Retry
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from examples.archive_postgres import ArchiveConfig, ArchiveConsumer
from parley.cli.appinfo import app_info
from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.client.shards import Shards, connect, read_view
from parley.dispatcher import enqueue
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import AdmissionLimits, AppInfo, Cancel, Enqueue, IndexAdd, Lifecycle, Stat
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.functions import Functions
from parley.dispatcher.keyprints import KeyprintsPublisher
from parley.dispatcher.leases import get_partitions
from parley.dispatcher.limits_config import publish_limits
from parley.dispatcher.replicas import ReplicaPolicy, Replicas, ReplicasBehind
from parley.fleet.notify import Forwarder, NotifyConfig
from parley.runtime.metrics import Health, RedisStateCollector
from parley.runtime.procs import free_port, stop_processes
from parley.schemas.deltas import TTL_S as DELTAS_TTL_S
from parley.schemas.deltas import Delta
from parley.schemas.jobs import KIND_OF_QUEUE, JobKind, job_id
from parley.schemas.keys import Keys, partition_of
from parley.schemas.results import WorkOutcome
from parley.workers import jobs
from parley.workers.app import load_app
from parley.workers.heartbeat import Heartbeat
from parley.workers.streaming import redis_writer
from parley.workers.worker import make_worker
from tests.forkserver import run_parley, start_parley
from tests.integration.conftest import enqueue_tool_job, tick
from tests.integration.test_notify import SECRET as NOTIFY_SECRET
from tests.integration.test_notify import Receiver

pytestmark = pytest.mark.usefixtures("restore_signals")

ROOT = Path(__file__).resolve().parents[2]
ACL_FILE = ROOT / "deploy" / "redis" / "users.acl"
KEYS = Keys()
SCENARIOS = "tests.apps.scenarios"
SEED = "Email bob@example.com: the launch moved to Friday."

PRODUCER, WORKER = "parley-producer", "parley-worker"
DISPATCHER, READER = "parley-dispatcher", "parley-reader"
NOTIFIER = "parley-notifier"
ARCHIVER = "parley-archiver"
# a producer and a reader scoped to the sessions of tenant `acme` (tests/integration/test_tenants.py)
ACME_PRODUCER, ACME_READER = "parley-producer-acme", "parley-reader-acme"
# the inbox page's login (tests/integration/test_deploy.py runs the page under it)
INBOX = "parley-inbox"
# the AG-UI endpoint's login (tests/e2e/test_agui.py runs the endpoint under it)
AGUI = "parley-agui"
# a Sentinel-managed shard's: its replicas' link to the primary, its sentinels' to every node
REPLICA, SENTINEL = "parley-replica", "parley-sentinel"
# the placeholders shipped in the file (deploy/README.md: replace them before deploying)
PASSWORDS = {PRODUCER: "change-me-producer", WORKER: "change-me-worker",
             DISPATCHER: "change-me-dispatcher", READER: "change-me-reader",
             NOTIFIER: "change-me-notifier", ARCHIVER: "change-me-archiver",
             ACME_PRODUCER: "change-me-producer-acme", ACME_READER: "change-me-reader-acme",
             INBOX: "change-me-inbox", AGUI: "change-me-agui", REPLICA: "change-me-replica",
             SENTINEL: "change-me-sentinel"}
ADMIN, ADMIN_PASSWORD = "parley-test-admin", "test-admin-password"
#: the registered producer whose streams the file's producer login writes
APP = "app"


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class AclRedis:
    """A private redis-server started with `--aclfile` (a temp copy of deploy/redis/users.acl)."""

    def __init__(self, directory: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        directory.mkdir(parents=True, exist_ok=True)
        self.acl = directory / "users.acl"
        self.acl.write_text(ACL_FILE.read_text()
                            + f"user {ADMIN} on >{ADMIN_PASSWORD} ~* &* +@all\n")
        self.port = free_port()
        self.log = directory / "redis.log"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--aclfile", str(self.acl), "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.clients: list[redis.Redis] = []
        self.admin = self.connect(ADMIN, ADMIN_PASSWORD)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.admin.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text()[-2000:] if self.log.exists() else ""
                    raise RuntimeError(f"redis-server did not start with the ACL file:\n{log}") from None
                time.sleep(0.02)

    def url(self, user: str, password: str | None = None) -> str:
        return f"redis://{user}:{password or PASSWORDS[user]}@127.0.0.1:{self.port}/0"

    def connect(self, user: str, password: str | None = None) -> redis.Redis:
        client = redis.Redis.from_url(self.url(user, password))
        self.clients.append(client)
        return client

    def denials(self) -> list[tuple[str, str, str]]:
        """(user, reason, object) of every refusal since the last reset."""
        return [(text(e["username"]), text(e["reason"]), text(e["object"])) for e in self.admin.acl_log()]

    def reset_denials(self) -> None:
        self.admin.acl_log_reset()

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def acl(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path / "redis")
    # as a dispatcher's start does (under its own login), and as an operator registers `app`
    Functions(server.connect(DISPATCHER)).ensure()
    register(server.admin)
    yield server
    server.stop()


@pytest.fixture
def producer(acl: AclRedis) -> redis.Redis:
    return acl.connect(PRODUCER)


@pytest.fixture
def worker(acl: AclRedis) -> redis.Redis:
    return acl.connect(WORKER)


@pytest.fixture
def dispatcher(acl: AclRedis) -> redis.Redis:
    return acl.connect(DISPATCHER)


@pytest.fixture
def reader(acl: AclRedis) -> redis.Redis:
    return acl.connect(READER)


@pytest.fixture
def worker_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process worker's app and heartbeat id (so jobs record themselves in parley:running)."""
    monkeypatch.setattr(jobs, "_app", load_app(SCENARIOS))
    monkeypatch.setattr(jobs, "_worker_id", "acl-worker")


def register(conn: redis.Redis, producer: str = APP, tenant: str | None = None) -> None:
    """Register a producer (docs/operations.md, "Producers") as an operator does."""
    conn.hset(KEYS.producers, producer, orjson.dumps({"tenant": tenant}))


def make_dispatcher(conn: redis.Redis) -> Dispatcher:
    d = Dispatcher(conn, Keys(), app_info(load_app(SCENARIOS)), block_ms=5)
    d.leases.partitions = get_partitions(conn, KEYS)
    return d


def as_producer(conn: redis.Redis, producer: str = APP) -> Client:
    """The client a producer uses under users.acl: it submits through the submit function."""
    return Client(conn, producer=producer)


def run_worker(conn: redis.Redis, *queues: str, name: str = "acl-worker", **work: Any) -> None:
    """One in-process RQ worker run, as `parley worker` does it: heartbeat, then `work()`."""
    heartbeat = Heartbeat(conn, KEYS.worker_alive(name))
    heartbeat.beat()
    try:
        make_worker(list(queues or ("decide", "llm", "tools")), conn, name=name).work(
            **({"burst": True} | work), with_scheduler=False)
    finally:
        heartbeat.stop()


def types(client: Client, session: str) -> list[str]:
    return [e["type"] for _id, e in client.events(session, block_ms=1, until=time.monotonic() + 0.05)]


def drive(d: Dispatcher, worker_conn: redis.Redis, client: Client, session: str, until: str,
          rounds: int = 12) -> list[str]:
    """Dispatcher ticks and worker bursts, in turn, until the producer sees an `until` event."""
    for _ in range(rounds):
        tick(d, 8)
        seen = types(client, session)
        if until in seen:
            return seen
        run_worker(worker_conn)
    raise AssertionError(f"no {until} event; saw {types(client, session)}")


def enqueue_tool(conn: redis.Redis, session: str, work: str, arguments: dict[str, Any],
                 reply_to: str = "parley:results", queue: str = "tools", seq: int = 1) -> str:
    return enqueue_tool_job(conn, session, work, "add", arguments, reply_to=reply_to, queue=queue, seq=seq)


def outcomes(admin: redis.Redis, stream: str = "parley:results") -> list[WorkOutcome]:
    entries: Any = admin.xrange(stream)
    return [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in entries]


REFUSAL = re.compile(r"no permissions|user executing the script can't (access|run)")


def refused(call: Callable[[], Any]) -> None:
    """`call` is refused by the ACL: NOPERM (inside a script, Redis words it differently)."""
    with pytest.raises(ResponseError) as info:
        call()
    assert isinstance(info.value, NoPermissionError) or REFUSAL.search(str(info.value)), repr(info.value)


# ---- the file itself ---------------------------------------------------------------------------


def test_the_file_loads_and_defines_each_role(acl: AclRedis) -> None:
    users = {line.split()[1]: line for line in (text(u) for u in acl.admin.acl_list())}
    roles = (PRODUCER, WORKER, DISPATCHER, READER, NOTIFIER, ARCHIVER, ACME_PRODUCER, ACME_READER, INBOX,
             AGUI, REPLICA, SENTINEL)
    assert set(users) == {"default", ADMIN, *roles}
    assert " off " in users["default"] and "nopass" not in users["default"]
    for user in roles:
        assert " on " in users[user]
        assert "~*" not in users[user] and "&*" not in users[user] and "+@all" not in users[user]
    # ACL files accept no comments: the operator's notes live in deploy/README.md
    assert all(line.startswith("user ") for line in ACL_FILE.read_text().splitlines())


def raw(port: int, *commands: bytes) -> list[bytes]:
    """The first reply line to each command, on one plain RESP2 connection (no HELLO, no AUTH)."""
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as out:
        for command in commands:
            sock.sendall(command + b"\r\n")
            replies.append(out.readline().rstrip())
    return replies


def test_nobody_gets_in_without_credentials(acl: AclRedis) -> None:
    # `default` is off: an unauthenticated connection can run nothing at all
    replies = raw(acl.port, b"PING", b"XADD parley:inputs * session s input {}", b"HGET parley:config x",
                  b"AUTH default anything", b"AUTH parley-producer wrong", b"PING")
    assert [r.split()[0] for r in replies] == [b"-NOAUTH", b"-NOAUTH", b"-NOAUTH", b"-WRONGPASS",
                                               b"-WRONGPASS", b"-NOAUTH"]
    no_retry = Retry(NoBackoff(), 0)
    with pytest.raises(AuthenticationError):
        redis.Redis(host="127.0.0.1", port=acl.port, retry=no_retry).ping()
    with pytest.raises(AuthenticationError):
        redis.Redis(host="127.0.0.1", port=acl.port, username="default", password="", retry=no_retry).ping()
    with pytest.raises(AuthenticationError):
        redis.Redis.from_url(acl.url(PRODUCER, "not-the-password"), retry=no_retry).ping()
    assert acl.admin.exists("parley:inputs") == 0


# ---- a whole turn, each part under its own user -------------------------------------------------


def test_a_whole_turn_runs_under_the_three_users(acl: AclRedis, producer: redis.Redis,
                                                  worker: redis.Redis, dispatcher: redis.Redis,
                                                  reader: redis.Redis, worker_app: None) -> None:
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("acl-1", {"type": "message.create", "content": SEED})
    seen = drive(d, worker, client, "acl-1", "interrupt.raised")
    assert "llm.completed" in seen and seen[-1] == "interrupt.raised"  # decide, LLM, decide jobs ran
    assert [(i["session"], i["interrupt_id"]) for i in Client(reader).interrupts()] == [("acl-1", "int-1")]
    view = Client(reader).show("acl-1")
    assert view is not None and view["parked"] is True

    client.send("acl-1", {"type": "interrupt.resume", "interrupt_id": "int-1",
                          "payload": {"approved": True}})
    seen = drive(d, worker, client, "acl-1", "turn.completed")
    assert {"interrupt.resumed", "tool.completed"} <= set(seen) and seen[-1] == "turn.completed"
    view = Client(reader).show("acl-1")
    assert view is not None and view["parked"] is False and view["interrupts"] == []
    assert [m["content"] for m in view["messages"]][-1] == "Done. send_email: sent"
    assert Client(reader).interrupts() == []
    # RQ's own bookkeeping went through too: nothing queued, nothing running, nothing failed
    assert acl.admin.llen("rq:queue:decide") == acl.admin.llen("rq:queue:llm") == 0
    assert acl.admin.hlen("parley:running") == 0
    assert acl.admin.zcard("rq:failed:tools") == acl.admin.zcard("rq:failed:decide") == 0
    assert acl.denials() == []


# ---- the producer -------------------------------------------------------------------------------


def test_producer_writes_inputs_and_reads_events(acl: AclRedis, producer: redis.Redis,
                                                 dispatcher: redis.Redis) -> None:
    client = as_producer(producer)
    assert client.send("acl-p", {"type": "session.create"}, idempotency_key="k-1")
    d = make_dispatcher(dispatcher)
    tick(d)
    assert types(client, "acl-p") == ["session.created"]
    assert producer.xrange(KEYS.events("acl-p"))  # XRANGE and XREVRANGE too, for catching up
    assert producer.xrevrange(KEYS.events("acl-p"), count=1)

    # with N partitions published, the producer writes its parley:in:app:<crc32 mod N>
    acl.admin.hset(KEYS.config, "partitions", 4)
    client = as_producer(producer)
    client.send("acl-q", {"type": "session.create"})
    n = partition_of("acl-q", 4)
    assert acl.admin.xlen(KEYS.producer_inputs(APP, n, 4)) == 1
    assert acl.admin.hget(KEYS.pending(APP), "acl-q") == b"1"
    assert producer.hget(KEYS.pending(APP), "acl-q") == b"1"  # its own pending counts, readable
    # its own streams it may also write directly (skipping only the submit-time refusals)
    producer.xadd(KEYS.producer_inputs(APP, 1023, 1024), {"session": "s", "input": "{}"})
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: Client(r).show("acl-p"), id="show-reads-session-state"),
    pytest.param(lambda r: r.hgetall(KEYS.meta("acl-p")), id="read-meta"),
    pytest.param(lambda r: r.hset(KEYS.meta("acl-p"), "ver", 99), id="write-meta"),
    pytest.param(lambda r: r.delete(KEYS.meta("acl-p")), id="delete-meta"),
    pytest.param(lambda r: r.hset(KEYS.messages("acl-p"), "msg-9", "{}"), id="write-msgs"),
    pytest.param(lambda r: r.xadd(KEYS.events("acl-p"), {"event": "{}"}), id="forge-an-event"),
    pytest.param(lambda r: r.xadd(KEYS.deltas("acl-p"), DELTA), id="forge-a-streamed-piece"),
    pytest.param(lambda r: r.delete(KEYS.deltas("acl-p")), id="delete-the-streamed-pieces"),
    pytest.param(lambda r: r.xadd("parley:results", {"outcome": "{}"}), id="post-a-result"),
    pytest.param(lambda r: r.xadd("parley:results:0", {"outcome": "{}"}), id="post-a-result-partition"),
    pytest.param(lambda r: r.xadd("parley:inputs:rejected", {"x": "1"}), id="write-rejected"),
    pytest.param(lambda r: r.xadd("parley:inputs:x", {"x": "1"}), id="non-partition-stream"),
    pytest.param(lambda r: r.xadd("parley:inputs:10000", {"x": "1"}), id="partition-out-of-range"),
    pytest.param(lambda r: r.xrange("parley:inputs"), id="read-others-inputs"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}),
                 id="write-shared-inputs"),
    pytest.param(lambda r: r.xadd("parley:inputs:0", {"session": "s", "input": "{}"}),
                 id="write-shared-inputs-partition"),
    pytest.param(lambda r: r.xadd(KEYS.producer_inputs("other"), {"session": "s", "input": "{}"}),
                 id="write-another-producers-stream"),
    pytest.param(lambda r: r.xrange(KEYS.producer_inputs(APP)), id="read-its-own-stream"),
    pytest.param(lambda r: r.hset(KEYS.pending(APP), "s", 0), id="reset-its-pending-counts"),
    pytest.param(lambda r: r.hget(KEYS.pending("other"), "s"), id="read-another-producers-pending"),
    pytest.param(lambda r: r.hset(KEYS.producers, APP, "{}"), id="change-its-registration"),
    pytest.param(lambda r: r.function_load("#!lua name=mine\nredis.register_function('f', function() end)",
                                           replace=True), id="load-a-function"),
    pytest.param(lambda r: r.function_flush(), id="flush-the-functions"),
    pytest.param(lambda r: r.xreadgroup(Keys.GROUP, "c", {"parley:inputs": ">"}), id="consume-inputs"),
    pytest.param(lambda r: r.xdel("parley:inputs", "0-1"), id="delete-inputs"),
    pytest.param(lambda r: r.delete("parley:inputs"), id="drop-the-stream"),
    pytest.param(lambda r: r.hset(KEYS.config, "partitions", 8), id="change-partitions"),
    pytest.param(lambda r: r.zrange(KEYS.interrupt_index, 0, -1), id="read-interrupt-index"),
    pytest.param(lambda r: Queue("tools", connection=r, serializer=JSONSerializer).enqueue_job(
        Job.create("parley.workers.jobs.run_tool", args=[{}], id="parley-p", connection=r,
                   serializer=JSONSerializer)), id="enqueue-an-rq-job"),
    pytest.param(lambda r: r.rpush("rq:queue:tools", "x"), id="push-to-a-queue"),
    pytest.param(lambda r: r.publish("rq:pubsub:w", "{}"), id="command-a-worker"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.scan(0), id="scan"),
    pytest.param(lambda r: r.flushall(), id="flushall"),
    pytest.param(lambda r: r.config_get("*"), id="config"),
])
def test_producer_is_refused_the_rest(acl: AclRedis, producer: redis.Redis,
                                      attempt: Callable[[redis.Redis], Any]) -> None:
    acl.admin.hset(KEYS.meta("acl-p"), "ver", 1)
    refused(lambda: attempt(producer))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {PRODUCER}


# ---- the worker ---------------------------------------------------------------------------------


def test_worker_runs_jobs_and_posts_to_the_results_stream(acl: AclRedis, worker: redis.Redis,
                                                          dispatcher: redis.Redis, worker_app: None) -> None:
    jid = enqueue_tool(dispatcher, "acl-w", "call-1", {"a": 2, "b": 40})
    jid3 = enqueue_tool(dispatcher, "acl-w", "call-2", {"a": 1, "b": 2}, reply_to="parley:results:3", seq=2)
    run_worker(worker, "tools")
    assert outcomes(acl.admin) == [WorkOutcome(session="acl-w", work="call-1", attempt=1, kind="tool",
                                               ok=True, value=42)]
    assert [o.value for o in outcomes(acl.admin, "parley:results:3")] == [3]
    assert acl.admin.exists(Job.key_for(jid), Job.key_for(jid3)) == 0  # nothing left behind
    assert acl.admin.hlen("parley:running") == 0 and acl.admin.exists(KEYS.worker_alive("acl-worker")) == 0

    # the same worker name again within a minute (a restart): RQ checks the old one's death
    enqueue_tool(dispatcher, "acl-w", "call-3", {"a": 0, "b": 0}, queue="decide", seq=3)
    # not burst: one queue uses BLMOVE through RQ's intermediate list, several use BLPOP
    run_worker(worker, "decide", burst=False, max_jobs=1)
    enqueue_tool(dispatcher, "acl-w", "call-4", {"a": 0, "b": 1}, queue="llm", seq=4)
    run_worker(worker, "decide", "llm", "tools", burst=False, max_jobs=1)
    assert [o.work for o in outcomes(acl.admin)] == ["call-1", "call-3", "call-4"]
    assert acl.denials() == []


def test_worker_failure_and_recovery_paths(acl: AclRedis, worker: redis.Redis, dispatcher: redis.Redis,
                                           worker_app: None) -> None:
    # a job hash naming a foreign function, with no in-flight record: dropped unrun at the take
    # (no dispatcher's commit issued it; the allowlist behind that: tests/integration/test_worker.py)
    planted = Queue("decide", connection=dispatcher, serializer=JSONSerializer).enqueue_call("os.getcwd")
    # a job abandoned by a dead worker (RQ's started registry, expired) ...
    ghost = Job.create("parley.workers.jobs.run_tool", args=[{}], id="parley-ghost", connection=acl.admin,
                       serializer=JSONSerializer)
    ghost.set_status(JobStatus.STARTED)
    ghost.save()
    acl.admin.zadd("rq:wip:decide", {"parley-ghost:dead-execution": 1})
    # ... and one stuck in RQ's intermediate list for over a minute (popped, never started)
    stuck = Job.create("parley.workers.jobs.run_tool", args=[{}], id="parley-stuck", connection=acl.admin,
                       serializer=JSONSerializer, origin="decide")
    stuck.save()
    acl.admin.rpush("rq:queue:decide:intermediate", "parley-stuck")
    acl.admin.set("rq:queue:decide:intermediate:first_seen:parley-stuck", time.time() - 120)

    run_worker(worker, "decide")
    fetch = lambda jid: Job.fetch(jid, connection=acl.admin, serializer=JSONSerializer)  # noqa: E731
    assert not acl.admin.exists(planted.key)
    assert fetch("parley-ghost").get_status() == JobStatus.FAILED
    assert fetch("parley-stuck").get_status() == JobStatus.FAILED
    assert acl.admin.llen("rq:queue:decide:intermediate") == 0
    assert acl.admin.exists("parley:results") == 0
    assert acl.denials() == []


def test_worker_takes_a_popped_job_and_names_its_server_under_its_login(
        acl: AclRedis, worker: redis.Redis, dispatcher: redis.Redis, worker_app: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """take_job.lua's paths of the review of issue 29, under the worker's login: the claim of a
    job BLPOP popped reads parley:running (held by another worker?) and pops the job again from
    its queue (LREM) when the server never saw the pop; with --replica-acks it names the server
    (INFO server and replication); give_back.lua of a job it took (its unrun outcome posted). No refusal."""
    monkeypatch.setattr(jobs, "_replicas", ReplicaPolicy(acks=1, timeout_ms=100))
    jid = enqueue_tool(dispatcher, "acl-t", "call-1", {"a": 1, "b": 1})
    w = make_worker(["tools"], worker, name="acl-worker")
    reply = worker.blpop(["rq:queue:tools"], 1)
    assert reply is not None
    acl.admin.lpush(reply[0], reply[1])  # a pop the server never saw
    taken = w.take("token-1", reply[1].decode(), popped_from=reply[0].decode())
    assert isinstance(taken, tuple) and taken[0].parley_claimed
    assert taken[0].parley_server.run_id and taken[0].parley_server.replid
    assert acl.admin.llen("rq:queue:tools") == 0
    monkeypatch.setattr(jobs, "_worker_id", "acl-other")  # another worker that popped it too
    assert make_worker(["tools"], worker, name="acl-other").take(
        "token-2", reply[1].decode(), popped_from=reply[0].decode()) is False
    monkeypatch.setattr(jobs, "_worker_id", "acl-worker")
    w.give_back_take(*taken)
    assert acl.admin.lrange("rq:queue:tools", 0, -1) == []
    [(_id, fields)] = acl.admin.xrange("parley:results")
    assert WorkOutcome.model_validate_json(fields[b"outcome"]).unrun and fields[b"job_sig"]
    assert not acl.admin.hexists("parley:inflight", jid) and not acl.admin.exists(f"rq:job:{jid}")
    assert acl.denials() == []


def test_the_unclaimed_work_sweep_posts_a_lost_job_under_the_dispatchers_login(
        acl: AclRedis, dispatcher: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job a worker popped and died with, found by the sweep run as the dispatcher's user:
    its script is sent by EVALSHA (a Script in a pipeline would ask SCRIPT EXISTS, refused)."""
    d = make_dispatcher(dispatcher)
    monkeypatch.setattr(enqueue, "time", SimpleNamespace(time=lambda: 1_000_000.0))  # a minute ago
    d.outbox.flush_many([("acl-lost", [Enqueue(seq=1, job=JobKind.LLM, work="llm-1", attempt=1,
                                               timeout=30, reply_to="parley:results", app=None,
                                               args={"request": {}})])])
    monkeypatch.undo()
    assert acl.admin.lpop("rq:queue:llm") == job_id("acl-lost", "llm-1", 1).encode()  # its worker died
    token_key = KEYS.job_token(job_id("acl-lost", "llm-1", 1))
    assert acl.admin.exists(token_key)  # (its take never ran)
    d.sweeps.unclaimed_checked = 0.0
    d.sweeps.find_unclaimed_work()
    posted = [orjson.loads(f[b"outcome"]) for _i, f in acl.admin.xrange("parley:results")]
    assert [(o["session"], o["error"]) for o in posted] == [("acl-lost", "worker_lost")]
    assert not acl.admin.exists(token_key)  # no token waits out its 7 days for a take that won't come
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.hset(KEYS.meta("acl-w"), "ver", 99), id="write-meta"),
    pytest.param(lambda r: r.hget(KEYS.meta("acl-w"), "core"), id="read-meta"),
    pytest.param(lambda r: r.hgetall(KEYS.messages("acl-w")), id="read-msgs"),
    # an LLM job may HMGET the bodies it names, and nothing else of a session
    pytest.param(lambda r: r.hmget(KEYS.meta("acl-w"), "core"), id="hmget-meta"),
    pytest.param(lambda r: r.hmget(KEYS.events("acl-w"), "x"), id="hmget-events"),
    pytest.param(lambda r: r.hset(KEYS.messages("acl-w"), "msg-9", "{}"), id="write-msgs"),
    pytest.param(lambda r: r.hset(KEYS.outbox("acl-w"), "1", "{}"), id="write-outbox"),
    pytest.param(lambda r: r.xadd(KEYS.events("acl-w"), {"event": "{}"}), id="forge-an-event"),
    pytest.param(lambda r: r.xread({KEYS.events("acl-w"): "0-0"}), id="read-events"),
    # it streams a reply's pieces (XADD, EXPIRE), and does nothing else with them
    pytest.param(lambda r: r.xread({KEYS.deltas("acl-w"): "0-0"}), id="read-streamed-pieces"),
    pytest.param(lambda r: r.delete(KEYS.deltas("acl-w")), id="delete-streamed-pieces"),
    pytest.param(lambda r: r.xtrim(KEYS.deltas("acl-w"), maxlen=0), id="trim-streamed-pieces"),
    pytest.param(lambda r: r.expire(KEYS.events("acl-w"), 1), id="expire-the-events"),
    pytest.param(lambda r: r.xadd("parley:acl-w:deltas", DELTA), id="deltas-key-outside-a-session"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="write-inputs"),
    pytest.param(lambda r: r.xadd("parley:inputs:0", {"session": "s", "input": "{}"}), id="write-partition"),
    pytest.param(lambda r: r.xadd("parley:inputs:rejected", {"x": "1"}), id="write-rejected"),
    pytest.param(lambda r: r.xrange("parley:results"), id="read-results"),
    pytest.param(lambda r: r.xreadgroup(Keys.GROUP, "c", {"parley:results": ">"}), id="consume-results"),
    pytest.param(lambda r: r.xack("parley:results", Keys.GROUP, "0-1"), id="ack-results"),
    pytest.param(lambda r: r.hgetall(KEYS.running), id="read-running"),
    pytest.param(lambda r: r.get(KEYS.worker_alive("other")), id="read-heartbeats"),
    pytest.param(lambda r: r.set(KEYS.lease(0), "stolen"), id="take-a-lease"),
    pytest.param(lambda r: r.zadd(KEYS.deadlines, {"s\x1fint-1": 0}), id="plant-a-deadline"),
    pytest.param(lambda r: r.zadd(KEYS.interrupt_index, {"s\x1fint-1": 0}), id="write-interrupt-index"),
    pytest.param(lambda r: r.hset(KEYS.config, "partitions", 8), id="change-partitions"),
    pytest.param(lambda r: r.publish("rq:pubsub:other", "{}"), id="command-a-worker"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval"),
    # the worker may load and run scripts (take_job.lua), but a script can do only what the
    # worker could do command by command
    pytest.param(lambda r: r.register_script("return redis.call('HSET', KEYS[1], 'ver', 99)")(
        keys=[KEYS.meta("acl-w")]), id="script-on-session-state"),
    pytest.param(lambda r: r.register_script("return redis.call('HSET', ARGV[1], 'ver', 99)")(
        keys=["rq:queue:tools"], args=[KEYS.meta("acl-w")]), id="script-undeclared-session-state"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.scan(0), id="scan"),
    pytest.param(lambda r: r.set("other:key", 1), id="key-outside-its-patterns"),
    pytest.param(lambda r: r.flushall(), id="flushall"),
    pytest.param(lambda r: r.config_set("appendonly", "no"), id="config-set"),
    pytest.param(lambda r: r.client_list(), id="client-list"),
])
def test_worker_is_refused_the_rest(acl: AclRedis, worker: redis.Redis,
                                    attempt: Callable[[redis.Redis], Any]) -> None:
    acl.admin.hset(KEYS.meta("acl-w"), "ver", 1)
    refused(lambda: attempt(worker))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {WORKER}


# ---- the dispatcher -----------------------------------------------------------------------------


def test_dispatcher_archives_closes_and_expires_sessions(acl: AclRedis, producer: redis.Redis,
                                                         dispatcher: redis.Redis) -> None:
    """The whole end of a session under the dispatcher's login: its idle close, the archive
    entry (built with XRANGE inside the retire script), the expiry's deletes. An app without
    `decide`: a decision in flight (no worker runs here) would keep the session awake."""
    d = Dispatcher(dispatcher, Keys(), AppInfo(), block_ms=5,
                   lifecycle=Lifecycle(retention_ms=0, idle_timeout_ms=1))
    d.leases.partitions = get_partitions(dispatcher, KEYS)
    as_producer(producer).send("acl-e", {"type": "session.create"}, idempotency_key="k-1")
    tick(d)
    time.sleep(0.01)
    d.sweeps.idle_checked = 0.0
    d.sweeps.close_idle_sessions()
    tick(d)
    [(_id, entry)] = acl.admin.xrange(KEYS.archive)
    assert orjson.loads(entry[b"document"])["events"][-1]["event"]["type"] == "session.closed"
    d.sweeps.expire_checked = 0.0
    d.sweeps.expire_sessions()
    assert not acl.admin.exists(*KEYS.session_keys("acl-e"), KEYS.expiring, KEYS.idle)
    assert acl.denials() == []


def test_dispatcher_applies_inputs_and_enqueues(acl: AclRedis, producer: redis.Redis,
                                                dispatcher: redis.Redis) -> None:
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    client.send("acl-d", {"type": "message.create", "content": "hello"})
    tick(d)
    assert acl.admin.hget(KEYS.meta("acl-d"), "ver") == b"1"  # session state written
    queued = {q: text(j) for q in ("decide", "llm") for j in acl.admin.lrange(f"rq:queue:{q}", 0, -1)}
    assert len(queued) == 1  # and its first job enqueued
    [(queue, jid)] = queued.items()
    assert acl.admin.exists(Job.key_for(jid))
    assert "message.created" in types(client, "acl-d")

    # a bad entry: copied to parley:inputs:rejected, reported on the session, its key kept
    producer.xadd(KEYS.producer_inputs(APP), {"session": "acl-d", "input": "{not json", "id": "bad-1"})
    tick(d)
    assert acl.admin.xlen("parley:inputs:rejected") == 1
    assert types(client, "acl-d")[-1] == "input.refused"
    assert acl.admin.zscore(KEYS.idempotency_keys("acl-d"), "bad-1")

    # a cancel (voided work): the queued job is removed
    args = Job.fetch(jid, connection=acl.admin, serializer=JSONSerializer).args[0]
    assert job_id("acl-d", args["work"], args["attempt"]) == jid
    cancel = Cancel(seq=99, job=KIND_OF_QUEUE[queue], work=args["work"], attempt=args["attempt"])
    Outbox(dispatcher, KEYS).flush_many([("acl-d", [cancel])])
    assert acl.admin.exists(Job.key_for(jid)) == 0 and acl.admin.llen(f"rq:queue:{queue}") == 0
    # the fleet-wide gauges kept through the outbox (held decisions)
    Outbox(dispatcher, KEYS).flush_many([("acl-d", [Stat(seq=100, field="held", delta=1)])])
    assert acl.admin.hget(KEYS.stats, "held") == b"1"

    # a due deadline is handed to the results stream; a dead worker's job is posted as lost
    dispatcher.zadd(KEYS.deadlines, {KEYS.index_member("acl-x", "int-1"): 1})
    dispatcher.hset(KEYS.running, "parley-lost", orjson.dumps({
        "worker": "dead-worker", "session": "acl-y", "work": "call-1", "attempt": 1, "kind": "tool",
        "reply_to": "parley:results"}))
    d.sweeps.deadlines_checked = d.sweeps.lost_checked = 0.0
    d.sweeps.fire_deadlines()
    d.sweeps.find_lost_work()
    posted = outcomes(acl.admin)
    assert [(o.session, o.kind) for o in posted] == [("acl-x", "deadline"), ("acl-y", "tool")]
    assert posted[1].lost is True and acl.admin.hlen(KEYS.running) == 0
    tick(d)  # applies them (both are for sessions that do not exist: dropped)
    assert acl.admin.xlen("parley:results") == 0

    d.leases.release_all()
    assert acl.admin.exists(KEYS.lease(0)) == 0
    assert acl.denials() == []


def test_dispatcher_expires_and_keeps_the_keys_of_sessions_that_did_not_exist(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis) -> None:
    """docs/protocol.md, "Limits" and inputs naming no session: the TTL (PEXPIRE), the keys
    kept once the session is created (PERSIST), the rejection's script (EVAL), the limits
    published in parley:config, all under the dispatcher's login."""
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    publish_limits(dispatcher, KEYS, AdmissionLimits())
    client.send("acl-ghost", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": 1})
    # a bad entry written straight to its own stream (the submit function would pass it on too)
    producer.xadd(KEYS.producer_inputs(APP), {"session": "acl-bad", "input": "{not json", "id": "bad-1"})
    tick(d)
    assert acl.admin.pttl(KEYS.meta("acl-ghost")) > 0 and acl.admin.pttl(KEYS.events("acl-bad")) > 0
    client.send("acl-ghost", {"type": "message.create", "content": "now"})
    tick(d)
    assert acl.admin.pttl(KEYS.meta("acl-ghost")) == -1 == acl.admin.pttl(KEYS.events("acl-ghost"))
    assert acl.admin.hget(KEYS.config, "limit_messages") == b"10000"
    assert acl.denials() == []


def test_metrics_and_health_read_what_they_need(acl: AclRedis, worker: redis.Redis,
                                                dispatcher: redis.Redis) -> None:
    make_dispatcher(dispatcher).leases.maintain()  # creates the streams' consumer groups
    for conn in (worker, dispatcher):
        families = {m.name: m for m in RedisStateCollector(conn, KEYS).collect()}
        assert {"parley_open_interrupts", "parley_queue_depth", "parley_stream_lag"} <= set(families)
        assert families["parley_stream_lag"].samples  # XINFO GROUPS on the streams answered
        assert Health(conn).ready() == (True, "ok")
    assert acl.denials() == []


SCRIPT_ELSEWHERE = "return redis.call('SET', KEYS[1], '1')"


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.set("other:key", 1), id="write-outside-its-patterns"),
    pytest.param(lambda r: r.get("session:42"), id="read-outside-its-patterns"),
    pytest.param(lambda r: r.hset("rq:worker:w1", "state", "dead"), id="rq-worker-registrations"),
    pytest.param(lambda r: r.delete("rq:wip:tools"), id="rq-registries"),
    pytest.param(lambda r: r.eval(SCRIPT_ELSEWHERE, 1, "other:key"), id="script-outside-its-patterns"),
    pytest.param(lambda r: r.eval("return redis.call('FLUSHALL')", 0), id="script-flushall"),
    pytest.param(lambda r: r.flushall(), id="flushall"),
    pytest.param(lambda r: r.flushdb(), id="flushdb"),
    pytest.param(lambda r: r.config_set("appendonly", "no"), id="config-set"),
    pytest.param(lambda r: r.config_get("requirepass"), id="config-get"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.scan(0), id="scan"),
    pytest.param(lambda r: r.script_flush(), id="script-flush"),
    pytest.param(lambda r: r.acl_setuser("mallory", enabled=True), id="acl-setuser"),
    pytest.param(lambda r: r.acl_list(), id="acl-list"),
    pytest.param(lambda r: r.client_kill_filter(user=WORKER), id="client-kill"),
    pytest.param(lambda r: r.shutdown(nosave=True), id="shutdown"),
    pytest.param(lambda r: r.bgrewriteaof(), id="bgrewriteaof"),
    pytest.param(lambda r: r.publish("rq:pubsub:w", "{}"), id="publish"),
    pytest.param(lambda r: r.swapdb(0, 1), id="swapdb"),
    pytest.param(lambda r: r.execute_command("MONITOR"), id="monitor"),
])
def test_dispatcher_is_refused_the_rest(acl: AclRedis, dispatcher: redis.Redis,
                                        attempt: Callable[[redis.Redis], Any]) -> None:
    refused(lambda: attempt(dispatcher))
    assert acl.admin.ping() and acl.admin.exists("other:key") == 0
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {DISPATCHER}


# ---- the reader (parley show / watch / interrupts) ----------------------------------------------


def test_reader_reads_sessions(acl: AclRedis, reader: redis.Redis, producer: redis.Redis,
                               dispatcher: redis.Redis) -> None:
    as_producer(producer).send("acl-r", {"type": "message.create", "content": "hi"})
    for _ in range(3):
        tick(make_dispatcher(dispatcher), 1)
    view = Client(reader).show("acl-r")
    assert view is not None and view["messages"][0]["content"] == "hi"
    assert "message.created" in types(Client(reader), "acl-r")
    # the export's script runs read-only (EVAL_RO) on the keys the reader may read
    assert Client(reader).export("acl-r").messages[0]["content"] == "hi"
    assert Client(reader).interrupts() == []
    assert acl.denials() == []


def test_reader_lists_interrupts_with_every_filter(acl: AclRedis, reader: redis.Redis,
                                                   dispatcher: redis.Redis) -> None:
    Outbox(dispatcher, KEYS).flush_many([("acl-i", [IndexAdd(
        seq=1, interrupt_id="int-1", reason="confirm", anchor=None, raised_at=1_000, deadline=None,
        parent=None, resumable_by=["alice"])])])
    where = InterruptFilter(reason="confirm", principal="alice", raised_before=2_000)
    assert [i.session for i in Client(reader).interrupt_page(where).items] == ["acl-i"]
    assert [i.session for i in Client(reader).interrupt_page(InterruptFilter(session_prefix="acl-")).items] \
        == ["acl-i"]
    assert Client(reader).interrupt_page(InterruptFilter(principal="bob")).items == []
    newest = [InterruptFilter(reason="confirm", principal="alice", raised_before=2_000, newest_first=True),
              InterruptFilter(session_prefix="acl-", newest_first=True)]  # ZRANGE ... BYLEX REV
    assert [[i.session for i in Client(reader).interrupt_page(w).items] for w in newest] == [["acl-i"]] * 2
    assert acl.denials() == []


def test_reader_lists_sessions_with_every_filter(acl: AclRedis, reader: redis.Redis, producer: redis.Redis,
                                                 dispatcher: redis.Redis) -> None:
    as_producer(producer).send("acl-l", {"type": "session.create", "metadata": {"team": "a"}})
    for _ in range(3):
        tick(make_dispatcher(dispatcher), 1)
    client = Client(reader)
    assert [row.session for row in client.sessions().items] == ["acl-l"]
    active = client.sessions("active", {"team": "a"}, created_after=0)
    assert [row.session for row in active.items] == ["acl-l"]
    assert client.sessions("closed").items == []
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="write-inputs"),
    pytest.param(lambda r: r.hset(KEYS.meta("acl-r"), "ver", 9), id="write-meta"),
    pytest.param(lambda r: r.xadd(KEYS.deltas("acl-r"), DELTA), id="forge-a-streamed-piece"),
    pytest.param(lambda r: r.hgetall(KEYS.outbox("acl-r")), id="read-outbox"),
    pytest.param(lambda r: r.zrange(KEYS.idempotency_keys("acl-r"), 0, -1), id="read-idempotency-keys"),
    pytest.param(lambda r: r.get(KEYS.lease(0)), id="read-a-lease-token"),
    pytest.param(lambda r: r.xrange("parley:inputs"), id="read-inputs"),
    pytest.param(lambda r: r.hgetall("rq:job:x"), id="read-rq"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval-a-script-that-may-write"),
    pytest.param(lambda r: r.eval_ro("return redis.call('HGETALL', KEYS[1])", 1, KEYS.outbox("acl-r")),
                 id="read-the-outbox-from-a-read-only-script"),
])
def test_reader_is_refused_the_rest(acl: AclRedis, reader: redis.Redis,
                                    attempt: Callable[[redis.Redis], Any]) -> None:
    refused(lambda: attempt(reader))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {READER}


# ---- streamed replies (parley:{S}:deltas) ---------------------------------------------------------

#: a streamed piece's fields, as a worker writes them (schemas/deltas.py)
DELTA = {"call": "llm-1", "attempt": "1", "seq": "1", "text": "forged"}


def test_a_worker_streams_pieces_that_producers_and_readers_watch(acl: AclRedis, worker: redis.Redis,
                                                                  producer: redis.Redis,
                                                                  reader: redis.Redis) -> None:
    """What a worker writes while a model streams (redis_writer: a capped XADD and EXPIRE in
    one pipeline) goes through under its login, and `watch(..., deltas=True)` reads it under the
    producer's and the reader's."""
    redis_writer(worker, KEYS.deltas("acl-d"))([Delta(call_id="llm-1", attempt=1, seq=1, text="Hel"),
                                                 Delta(call_id="llm-1", attempt=1, seq=2, text="lo")])
    assert 0 < acl.admin.ttl(KEYS.deltas("acl-d")) <= DELTAS_TTL_S
    for login in (producer, reader):
        seen = [event for _id, event in Client(login).watch("acl-d", deltas=True, block_ms=10,
                                                            until=time.monotonic() + 0.5)]
        assert [d.text for d in seen if isinstance(d, Delta)] == ["Hel", "lo"]
    assert acl.denials() == []


def test_the_inbox_login_does_not_read_streamed_pieces(acl: AclRedis) -> None:
    """The inbox page shows questions and transcripts, never a reply being generated: it was
    not given the deltas streams."""
    acl.admin.xadd(KEYS.deltas("acl-i"), DELTA)
    refused(lambda: acl.connect(INBOX).xread({KEYS.deltas("acl-i"): "0-0"}))
    assert {u for u, _why, _obj in acl.denials()} == {INBOX}


# ---- the notifier (parley notify) and the feed -------------------------------------------------


def test_the_feed_is_written_by_dispatchers_read_by_readers_forwarded_by_notifiers(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, dispatcher: redis.Redis,
        reader: redis.Redis, worker_app: None) -> None:
    client = as_producer(producer)
    d = make_dispatcher(dispatcher)
    notifier = acl.connect(NOTIFIER)
    rec = Receiver(lambda n: 500 if n == 0 else 200)  # the first entry is dead-lettered
    config = NotifyConfig(url=rec.url, secret=NOTIFY_SECRET.encode(), max_attempts=1, block_ms=100)
    forwarder = Forwarder(notifier, KEYS, config)
    forwarder.ensure_group()
    client.send("acl-f", {"type": "message.create", "content": SEED})
    drive(d, worker, client, "acl-f", "interrupt.raised")
    client.send("acl-f", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})
    drive(d, worker, client, "acl-f", "turn.completed")
    feed_types = [f[b"type"] for _id, f in reader.xrange(KEYS.feed)]
    assert feed_types == [b"interrupt.raised", b"interrupt.resumed", b"turn.completed"]
    stop = threading.Event()
    for entry_id, fields in forwarder.read():
        forwarder.forward(entry_id, fields, stop)
    assert forwarder.reclaim() == []
    assert [a["type"] for a in rec.accepted] == ["interrupt.resumed", "turn.completed"]
    assert [f[b"type"] for _id, f in acl.admin.xrange(KEYS.feed_dead)] == [b"interrupt.raised"]
    rec.server.shutdown()
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.xrange(KEYS.events("acl-f")), id="read-session-events"),
    pytest.param(lambda r: r.hgetall(KEYS.meta("acl-f")), id="read-meta"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="write-inputs"),
    pytest.param(lambda r: r.xadd(KEYS.feed, {"type": "forged"}), id="write-the-feed"),
    pytest.param(lambda r: r.xrange(KEYS.feed_dead), id="read-dead-letters"),
    pytest.param(lambda r: r.get(KEYS.lease(0)), id="read-a-lease-token"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
])
def test_notifier_is_refused_the_rest(acl: AclRedis, attempt: Callable[[redis.Redis], Any]) -> None:
    refused(lambda: attempt(acl.connect(NOTIFIER)))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {NOTIFIER}


def test_reader_reads_the_feed_but_joins_no_group(acl: AclRedis, reader: redis.Redis) -> None:
    acl.admin.xgroup_create(KEYS.feed, "parley-notify", id="0", mkstream=True)
    assert reader.xrange(KEYS.feed) == []
    refused(lambda: reader.xreadgroup("parley-notify", "me", {KEYS.feed: ">"}))
    refused(lambda: reader.xadd(KEYS.feed, {"type": "forged"}))


# ---- the archiver (examples/archive_postgres.py) -------------------------------------------------


def test_the_archiver_consumes_the_archive_and_touches_nothing_else(acl: AclRedis) -> None:
    archiver = acl.connect(ARCHIVER)
    acl.admin.xadd(KEYS.archive, {"session": "s-a", "closed_at": "1", "document": "{}"})
    gone = ArchiveConsumer(archiver, KEYS, ArchiveConfig(dsn="", consumer="dead", claim_idle_ms=1))
    gone.ensure_group()
    assert [f[b"session"] for _i, f in gone.read()] == [b"s-a"]  # then it died
    heir = ArchiveConsumer(archiver, KEYS, ArchiveConfig(dsn="", consumer="heir", claim_idle_ms=1))
    time.sleep(0.01)
    batch = heir.reclaim()
    assert [f[b"session"] for _i, f in batch] == [b"s-a"]
    heir.forget([i for i, _f in batch])  # stored: acknowledged and deleted
    assert acl.admin.xlen(KEYS.archive) == 0 and acl.denials() == []
    for attempt in (lambda: archiver.xadd(KEYS.archive, {"session": "forged"}),
                    lambda: archiver.hgetall(KEYS.meta("s-a")),
                    lambda: archiver.xrange(KEYS.events("s-a")),
                    lambda: archiver.xrange(KEYS.feed),
                    lambda: archiver.xadd("parley:inputs", {"session": "s", "input": "{}"})):
        refused(attempt)
    assert {u for u, _why, _obj in acl.denials()} == {ARCHIVER}


# ---- a Sentinel-managed shard: its replicas and sentinels ---------------------------------------


@pytest.mark.e2e
def test_replicas_and_sentinels_do_their_job_under_their_logins(tmp_path: Path) -> None:
    """tests/replica_set.py as deployed: every node with the shipped files, each replica linked
    under parley-replica (masteruser/masterauth), each sentinel under parley-sentinel (auth-user/
    auth-pass). A write replicates, a killed primary is replaced, the old one rejoins as a
    replica and syncs: and no node refused the replicas or sentinels anything (ACL LOG)."""
    from tests.replica_set import ReplicaSet

    rs = ReplicaSet(tmp_path / "rs", deployed=True).start()
    try:
        primary = connect(rs.url_as(f"{DISPATCHER}:{PASSWORDS[DISPATCHER]}"))
        primary.set("parley:acl-probe", "1")
        assert int(primary.execute_command("WAIT", 1, 2000)) == 1
        old = rs.kill_primary()
        new = rs.wait_promoted(old)
        rs.rejoin(old, new)
        for node in rs.servers:
            admin = redis.Redis.from_url(node.url)
            assert admin.get("parley:acl-probe") == b"1"
            assert [(text(e["username"]), text(e["object"])) for e in admin.acl_log()] == []
            admin.close()
        assert rs.critical_lines() == []
    finally:
        rs.stop()


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.hgetall(KEYS.meta("acl-x")), id="read-meta"),
    pytest.param(lambda r: r.get(KEYS.lease(0)), id="read-a-lease-token"),
    pytest.param(lambda r: r.get(KEYS.engine_key), id="read-the-engines-key"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="write-inputs"),
    pytest.param(lambda r: r.set("parley:x", "1"), id="write-a-key"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.info(), id="info"),
    pytest.param(lambda r: r.config_get("*"), id="config-get"),
    pytest.param(lambda r: r.execute_command("SLAVEOF", "NO", "ONE"), id="promote-itself-elsewhere"),
    pytest.param(lambda r: r.publish("rq:pubsub:w", "{}"), id="publish"),
    pytest.param(lambda r: r.flushall(), id="flushall"),
])
def test_the_replica_login_is_refused_all_but_the_replication_link(
        acl: AclRedis, attempt: Callable[[redis.Redis], Any]) -> None:
    """parley-replica: PSYNC, REPLCONF and PING, nothing else (what it syncs is the whole
    dataset, which is why its password is the admin's to keep: deploy/README.md)."""
    replica = acl.connect(REPLICA)
    assert replica.ping()
    refused(lambda: attempt(replica))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {REPLICA}


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.hgetall(KEYS.meta("acl-x")), id="read-meta"),
    pytest.param(lambda r: r.xrange(KEYS.events("acl-x")), id="read-events"),
    pytest.param(lambda r: r.get(KEYS.lease(0)), id="read-a-lease-token"),
    pytest.param(lambda r: r.get(KEYS.engine_key), id="read-the-engines-key"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="write-inputs"),
    pytest.param(lambda r: r.set("parley:x", "1"), id="write-a-key"),
    pytest.param(lambda r: r.delete("parley:config"), id="delete-a-key"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.scan(0), id="scan"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval"),
    pytest.param(lambda r: r.flushall(), id="flushall"),
    pytest.param(lambda r: r.config_set("appendonly", "no"), id="config-set"),
    pytest.param(lambda r: r.config_get("*"), id="config-get"),
    pytest.param(lambda r: r.acl_list(), id="acl"),
    pytest.param(lambda r: r.publish("rq:pubsub:w", '{"command": "shutdown"}'), id="publish-to-rq-workers"),
    pytest.param(lambda r: r.execute_command("SUBSCRIBE", "rq:pubsub:w"), id="subscribe-to-rq-workers"),
    pytest.param(lambda r: r.execute_command("PSYNC", "?", "-1"), id="psync-the-data"),
    pytest.param(lambda r: r.client_list(), id="client-list"),
    pytest.param(lambda r: r.execute_command("SHUTDOWN", "NOSAVE"), id="shutdown"),
])
def test_the_sentinel_login_is_refused_the_data_and_other_channels(
        acl: AclRedis, attempt: Callable[[redis.Redis], Any]) -> None:
    """parley-sentinel: what a sentinel runs (INFO, ROLE, PING, its hello channel, SLAVEOF,
    CONFIG REWRITE, CLIENT KILL, SCRIPT KILL, MULTI/EXEC); no key, no other channel (not RQ's
    worker commands), no CONFIG SET, no ACL, no data by PSYNC."""
    sentinel = acl.connect(SENTINEL)
    assert sentinel.ping() and sentinel.execute_command("ROLE")[0] == b"master"
    assert sentinel.publish("__sentinel__:hello", "x") == 0
    refused(lambda: attempt(sentinel))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {SENTINEL}


# ---- the real processes: credentials come from the URL ------------------------------------------


@pytest.mark.e2e
def test_cli_dispatcher_and_worker_processes_take_credentials_from_the_url(acl: AclRedis,
                                                                          tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PARLEY_LOG_LEVEL": "INFO", "PARLEY_APP": "examples.seed_app"}
    started = [
        start_parley(["dispatcher"], {**env, "PARLEY_REDIS_URL": acl.url(DISPATCHER)},
                     tmp_path / "dispatcher.log"),
        start_parley(["worker"], {**env, "PARLEY_REDIS_URL": acl.url(WORKER)}, tmp_path / "worker.log"),
    ]

    def cli(user: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = run_parley(["--redis-url", acl.url(user), *args],
                              text=True, timeout=60, env={**os.environ, **env})
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in tmp_path.glob("*.log"))

    try:
        cli(PRODUCER, "--producer", APP, "send", "acl-cli", SEED)
        watched = cli(PRODUCER, "watch", "acl-cli", "--until", "interrupt.raised", "--timeout", "30")
        assert '"interrupt.raised"' in watched.stdout.splitlines()[-1], logs()
        deadline = time.monotonic() + 10
        while not orjson.loads(cli(READER, "interrupts", "--json").stdout or "[]"):
            assert time.monotonic() < deadline, logs()
            time.sleep(0.1)
        cli(PRODUCER, "--producer", APP, "resume", "acl-cli", "int-1", '{"approved": true}')
        watched = cli(PRODUCER, "watch", "acl-cli", "--until", "turn.completed", "--timeout", "30")
        assert '"turn.completed"' in watched.stdout.splitlines()[-1], logs()
        view = orjson.loads(cli(READER, "show", "acl-cli", "--json").stdout)
        assert view["messages"][-1]["content"] == "Done. send_email: sent"
    finally:
        codes = stop_processes(started)
    assert codes == [0, 0], logs()  # a clean stop: the dispatcher released its lease (a script)
    assert acl.admin.exists(KEYS.lease(0)) == 0
    assert acl.denials() == [], logs()

    # the producer cannot `show`: session state is not its to read; one line, exit 77
    shown = cli(PRODUCER, "show", "acl-cli", check=False)
    assert shown.returncode == 77 and shown.stdout == ""
    [line] = shown.stderr.splitlines()
    assert line.startswith("parley: the Redis login of redis://parley-producer:***@")
    assert "no permissions" in line
    # nor may the inbox's login watch a reply being streamed
    streamed = cli(INBOX, "watch", "acl-cli", "--deltas", "--timeout", "1", check=False)
    assert streamed.returncode == 77 and len(streamed.stderr.splitlines()) == 1



# ---- the engine's key (the dispatchers' own signed inputs) --------------------------------------


def test_only_dispatchers_hold_the_engines_key(acl: AclRedis, producer: redis.Redis, worker: redis.Redis,
                                               reader: redis.Redis, dispatcher: redis.Redis) -> None:
    """The key that signs a dispatcher's own inputs (a sub-agent's child, its close) is made by
    the first dispatcher and read by the others; whoever could read it could forge them."""
    key = Outbox(dispatcher, KEYS).engine_key.load()
    assert len(key) >= 32 and Outbox(dispatcher, KEYS).engine_key.load() == key  # made once, then shared
    assert acl.denials() == []
    for user, conn in ((PRODUCER, producer), (WORKER, worker), (READER, reader)):
        refused(lambda conn=conn: conn.get(KEYS.engine_key))  # type: ignore[misc]
        refused(lambda conn=conn: conn.set(KEYS.engine_key, "mine"))  # type: ignore[misc]
        assert {u for u, _why, _obj in acl.denials()} == {user}
        acl.reset_denials()
    assert acl.admin.get(KEYS.engine_key) == key.encode()


# ---- the fingerprints of the dispatchers' keys (parley:keyprints) --------------------------------


def test_only_dispatchers_write_the_key_fingerprints_and_the_signers_only_read_them(
        acl: AclRedis, producer: redis.Redis, worker: redis.Redis, reader: redis.Redis,
        dispatcher: redis.Redis) -> None:
    """What the inbox (and `parley agui`) check their keys against at start (dispatcher/keyprints.py):
    whoever could write it could hide from them that the dispatchers lack their key, or make them
    warn of a mismatch that is not there."""
    KeyprintsPublisher(dispatcher, KEYS, "d-acl").maintain({"alice": ("alice-signing-key-0123456789",)})
    published = acl.admin.hgetall(KEYS.keyprints)
    assert set(published) == {b"d-acl"} and acl.denials() == []  # type: ignore[arg-type]
    for user in (INBOX, AGUI):
        assert acl.connect(user).hgetall(KEYS.keyprints) == published
    assert acl.denials() == []
    for user, conn in ((INBOX, acl.connect(INBOX)), (AGUI, acl.connect(AGUI)), (PRODUCER, producer),
                       (WORKER, worker), (READER, reader)):
        refused(lambda conn=conn: conn.hset(KEYS.keyprints, "d-acl", "{}"))  # type: ignore[misc]
        refused(lambda conn=conn: conn.hset(KEYS.keyprints, "forged", "{}"))  # type: ignore[misc]
        refused(lambda conn=conn: conn.hdel(KEYS.keyprints, "d-acl"))  # type: ignore[misc]
        refused(lambda conn=conn: conn.delete(KEYS.keyprints))  # type: ignore[misc]
        assert {u for u, _why, _obj in acl.denials()} == {user}
        acl.reset_denials()
    assert acl.admin.hgetall(KEYS.keyprints) == published


# ---- two shards, each loading the file (docs/operations.md, "Shards") ----------------------------


@pytest.fixture
def two_acl(tmp_path: Path) -> Iterator[list[AclRedis]]:
    servers = [AclRedis(tmp_path / f"shard{i}") for i in range(2)]
    for server in servers:
        Functions(server.connect(DISPATCHER)).ensure()
        register(server.admin)
    yield servers
    for server in servers:
        server.stop()


def shards_as(servers: list[AclRedis], user: str) -> Shards:
    """The shards as `user` sees them: one connection to each, in the deployment's order."""
    return Shards([s.connect(user) for s in servers], KEYS)


def test_sharded_processes_start_and_clients_route_under_the_file(two_acl: list[AclRedis]) -> None:
    """What a sharded deployment's logins send beyond one Redis's: the dispatcher's start-up
    check writes the placement; the worker's (`parley worker --shard i`) and every client read
    it (HMGET of the config); a careful producer WAITs for a replica; a reader's `show` routes by
    the placement and its `interrupts` reads every shard."""
    placement = shards_as(two_acl, DISPATCHER).check(4, create=True)
    assert placement is not None and placement.partitions == 4
    assert shards_as(two_acl, WORKER).check(create=False) == placement  # the worker's start-up
    assert read_view(two_acl[1].connect(WORKER), KEYS, 1).placement == placement
    for i, server in enumerate(two_acl):
        assert read_view(server.connect(READER), KEYS, i).placement == placement

    producer_shards = shards_as(two_acl, PRODUCER)
    client = Client(producer_shards, producer=APP)
    on = {placement.shard_of_session(s): s for s in (f"acl-s{i}" for i in range(16))}
    assert set(on) == {0, 1}, "a session on each shard"
    for shard, session in on.items():
        client.send(session, {"type": "message.create", "content": "hi"}, idempotency_key=session)
        # a careful producer: a replica must hold the input (none here: WAIT answers 0 at once)
        assert producer_shards.clients[shard].execute_command("WAIT", 0, 10) == 0
    for i, server in enumerate(two_acl):
        d = Dispatcher(server.connect(DISPATCHER), Keys(), app_info(load_app(SCENARIOS)), partitions=4,
                       shard=i, block_ms=5)
        d.leases.partitions = 4  # as its start publishes them (make_dispatcher)
        tick(d, 8)
    reader = Client(shards_as(two_acl, READER))
    for session in on.values():
        view = reader.show(session)
        assert view is not None and view["messages"][0]["content"] == "hi"
    assert reader.interrupts() == []
    # `parley worker --replica-acks 1`: the probe write and WAIT after each outcome (no replica
    # here: short, which is not a refusal)
    with pytest.raises(ReplicasBehind):
        Replicas(two_acl[0].connect(WORKER), KEYS, ReplicaPolicy(acks=1, timeout_ms=10)).confirm()
    assert [s.denials() for s in two_acl] == [[], []]
