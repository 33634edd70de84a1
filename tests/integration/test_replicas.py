"""--replica-acks against a real primary and replica: a batch whose commits the replica does not
hold is neither acknowledged nor flushed, and its replay, once the replica is back, applies it
once. The replica is held still with SIGSTOP (it stays connected, but acknowledges nothing)."""

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.replicas import ReplicaPolicy, Replicas, ReplicasBehind
from parley.runtime import metrics
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.workers import jobs
from parley.workers.app import load_app
from parley.workers.worker import make_worker
from tests.integration.conftest import (
    INPUTS,
    NO_DECIDE,
    RESULTS,
    enqueue_tool_job,
    events,
    pending_count,
    queue_ids,
    send,
    tick,
)
from tests.replica_set import FAST_SYNC, ReplicaSet

KEYS = Keys()
pytestmark = pytest.mark.usefixtures("restore_signals")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer(tmp_path / "primary", settings=FAST_SYNC).start()
    replica = RedisServer(tmp_path / "replica", settings={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    ReplicaSet.wait_replicas(primary, 1)
    yield primary, replica
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGCONT)  # whatever the test left it in
    replica.stop()
    primary.stop()


@pytest.fixture
def primary(pair: tuple[RedisServer, RedisServer]) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(pair[0].url)
    yield client
    client.close()


def freeze(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def thaw(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


def timeouts() -> float:
    return metrics.REGISTRY.get_sample_value("parley_replica_ack_timeouts_total") or 0.0


def test_off_asks_nothing(primary: redis.Redis, pair: tuple[RedisServer, RedisServer]) -> None:
    freeze(pair[1])
    Replicas(primary, KEYS, ReplicaPolicy()).confirm()  # returns at once: no WAIT at all
    assert primary.hget(KEYS.stats, "replica_waits") is None


def test_confirm_passes_once_the_replica_holds_every_write(primary: redis.Redis) -> None:
    primary.set("x", 1)
    Replicas(primary, KEYS, ReplicaPolicy(acks=1, timeout_ms=5000)).confirm()


def test_confirm_raises_when_the_replica_does_not_acknowledge(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer]) -> None:
    """A write made on ANOTHER connection is covered too: the probe write puts this
    connection's offset past it (WAIT alone would wait for this connection's writes only)."""
    other = redis.Redis.from_url(pair[0].url)
    before = timeouts()
    freeze(pair[1])
    other.set("y", 1)
    with pytest.raises(ReplicasBehind, match="0 of 1 replicas"):
        Replicas(primary, KEYS, ReplicaPolicy(acks=1, timeout_ms=100)).confirm()
    assert timeouts() == before + 1
    other.close()


def test_two_replicas_asked_of_one_never_confirm(primary: redis.Redis) -> None:
    # (the one replica may itself be late on a loaded machine: 0 or 1 of 2, never 2)
    with pytest.raises(ReplicasBehind, match=r"[01] of 2 replicas"):
        Replicas(primary, KEYS, ReplicaPolicy(acks=2, timeout_ms=300)).confirm()


def test_a_batch_the_replica_lacks_is_not_acknowledged_then_replayed_once(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer]) -> None:
    d = Dispatcher(primary, KEYS, NO_DECIDE, block_ms=5, replicas=ReplicaPolicy(acks=1, timeout_ms=100))
    d.leases.partitions = 1
    tick(d, 1)  # leases taken, nothing to apply
    entry = send(primary, "s-1", {"type": "message.create", "content": "hello"})
    freeze(pair[1])
    with pytest.raises(ReplicasBehind):
        tick(d, 1)
    # committed (its job with it: the commit enqueues it; a worker with --replica-acks runs it
    # only once its take, after the commit, is on the replica), but neither acknowledged nor
    # flushed: the entry pending, the session's listing in the outbox
    meta = primary.hgetall(KEYS.meta("s-1"))
    assert orjson.loads(meta[b"applied"]) == {INPUTS: entry}
    assert pending_count(primary, INPUTS) == 1
    assert primary.hlen(KEYS.outbox("s-1")) > 0
    assert len(queue_ids(primary, "llm")) == 1

    thaw(pair[1])
    # the replica back: a WAIT long enough for it to catch up and answer (a bound, not a measure)
    d.replicas.policy = ReplicaPolicy(acks=1, timeout_ms=10_000)
    d.leases.suspect_all()  # what the run loop does after an outage: claim our pending entries
    tick(d, 2)
    assert d.stats.applied == 1 and d.stats.replays == 1  # applied once; the replay a no-op
    assert pending_count(primary, INPUTS) == 0
    assert primary.hlen(KEYS.outbox("s-1")) == 0
    assert len(queue_ids(primary, "llm")) == 1
    assert [e["type"] for e in events(primary, "s-1")] == [
        "session.created", "message.created", "llm.started"]


# ---- workers: `parley worker --replica-acks K` ------------------------------------------------


def test_a_workers_outcome_is_posted_again_until_the_replica_holds_it(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """An outcome lost in a failover would leave its running record on the promoted replica
    (of a live worker: no sweep fires) and the session waiting: with --replica-acks the worker
    counts it posted only once a replica holds it, and posts it again meanwhile."""
    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.scenarios"))
    monkeypatch.setattr(jobs, "_worker_id", "w-acks")
    monkeypatch.setattr(jobs, "_replicas", ReplicaPolicy(acks=1, timeout_ms=100))
    # the take confirmed at once (its own test below): the shortfalls here are the outcome's
    monkeypatch.setattr(jobs, "confirm_take", lambda connection, took_on: None)
    job = enqueue_tool_job(primary, "s-w", "call-1", "add", {"a": 1, "b": 2})
    before = timeouts()
    freeze(pair[1])
    seen: dict[str, Any] = {}

    def thaw_after_two_shortfalls() -> None:
        deadline = time.monotonic() + 30  # a bound, so that a worker that does not wait fails
        while timeouts() < before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # the outcome is posted, but the job not done: its running record stays meanwhile
        seen["shortfalls"] = timeouts() - before
        seen["posted"] = primary.xlen(RESULTS)
        seen["running"] = primary.hexists(KEYS.running, job)
        thaw(pair[1])

    thawer = threading.Thread(target=thaw_after_two_shortfalls, daemon=True)
    thawer.start()
    make_worker(["tools"], primary).work(burst=True)  # returns once the outcome is confirmed
    thawer.join(60)
    assert seen["shortfalls"] >= 2 and seen["posted"] >= 2  # posted, short, posted again
    posted = [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in primary.xrange(RESULTS)]
    # the copies are one outcome of one attempt: the dispatcher applies the first, drops the rest
    assert {(o.work, o.attempt, o.ok, str(o.value)) for o in posted} == {("call-1", 1, True, "3")}
    assert not primary.hexists(KEYS.running, job)
    assert int(primary.hget(KEYS.stats, "replica_waits") or 0) >= 3  # the probe write of each WAIT


def test_a_worker_runs_a_job_only_once_the_replica_holds_its_take(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle that enqueued a job may not be on the replica yet: promoted, it would replay
    that settle and enqueue the job again, and a tool would run twice. With --replica-acks the
    worker runs a job only once a replica holds its take (and so, the stream being ordered,
    the settle before it). A take not confirmed is given back (issue 29: never waited for on
    another connection, which may reach another server), and taken again after a backoff."""
    monkeypatch.setattr(jobs, "_app", None)
    app = load_app("tests.apps.scenarios")
    calls: list[tuple[int, int]] = []
    add = app.tools["add"]

    def counted(a: int, b: int) -> int:
        calls.append((a, b))
        return add(a, b)

    monkeypatch.setitem(app.tools, "add", counted)
    jobs.set_app(app)
    monkeypatch.setattr(jobs, "_worker_id", "w-take")
    monkeypatch.setattr(jobs, "_replicas", ReplicaPolicy(acks=1, timeout_ms=100))
    job = enqueue_tool_job(primary, "s-t", "call-1", "add", {"a": 1, "b": 2})
    before = timeouts()
    freeze(pair[1])
    seen: dict[str, Any] = {}

    def thaw_after_two_shortfalls() -> None:
        deadline = time.monotonic() + 30  # a bound, so that a worker that does not wait fails
        while timeouts() < before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # not run: either taken (recorded as running on this worker, off its queue) or given back
        # (queued, recorded nowhere), never both, never neither (one MULTI reads both)
        seen["shortfalls"] = timeouts() - before
        seen["calls"] = list(calls)
        seen["posted"] = primary.xlen(RESULTS)
        pipe = primary.pipeline(transaction=True)
        pipe.hexists(KEYS.running, job)
        pipe.lrange("rq:queue:tools", 0, -1)
        running, queued = pipe.execute()
        seen["where"] = {(True, ()): "taken", (False, (job.encode(),)): "given back"}.get(
            (bool(running), tuple(queued)), f"running {running}, queued {queued}")
        thaw(pair[1])

    thawer = threading.Thread(target=thaw_after_two_shortfalls, daemon=True)
    thawer.start()
    make_worker(["tools"], primary).work(burst=True)
    thawer.join(60)
    assert seen.pop("shortfalls") >= 2
    where = seen.pop("where")
    assert seen == {"calls": [], "posted": 0} and where in ("taken", "given back"), where
    assert calls == [(1, 2)]  # run once the replica was back, and once only
    posted = [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in primary.xrange(RESULTS)]
    assert {(o.work, o.attempt, o.ok, str(o.value)) for o in posted} == {("call-1", 1, True, "3")}
    assert not primary.hexists(KEYS.running, job)


def test_a_worker_without_replica_acks_asks_no_replica(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "_app", None)
    jobs.set_app(load_app("tests.apps.scenarios"))
    freeze(pair[1])
    enqueue_tool_job(primary, "s-w", "call-1", "add", {"a": 1, "b": 2})
    make_worker(["tools"], primary).work(burst=True)
    assert primary.xlen(RESULTS) == 1 and primary.hget(KEYS.stats, "replica_waits") is None


# ---- readiness and the start-up warning (`parley dispatcher --replica-acks K`) ------------------


def test_readyz_says_not_ready_while_settles_are_refused_for_replicas(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer]) -> None:
    d = Dispatcher(primary, KEYS, NO_DECIDE, block_ms=5, replicas=ReplicaPolicy(acks=1, timeout_ms=100))
    d.leases.partitions = 1
    health = metrics.Health(primary, checks=[d.replicas.readiness])
    tick(d, 1)
    assert health.ready() == (True, "ok")
    send(primary, "s-r", {"type": "message.create", "content": "hello"})
    freeze(pair[1])
    with pytest.raises(ReplicasBehind):
        tick(d, 1)
    ok, why = health.ready()
    assert not ok and "replicas behind" in why
    thaw(pair[1])
    d.replicas.policy = ReplicaPolicy(acks=1, timeout_ms=10_000)
    d.leases.suspect_all()
    tick(d, 2)
    assert health.ready() == (True, "ok")


def test_a_dispatcher_warns_at_start_when_fewer_replicas_are_connected(
        primary: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="parley.dispatcher"):
        assert Replicas(primary, KEYS, ReplicaPolicy(acks=1)).warn_if_short() == 1
        assert not caplog.records
        assert Replicas(primary, KEYS, ReplicaPolicy(acks=2)).warn_if_short() == 1
    assert [r.getMessage() for r in caplog.records] == [
        "--replica-acks 2 but the primary has 1 connected replica(s): nothing will be "
        "acknowledged until 2 connect"]
    assert Replicas(primary, KEYS, ReplicaPolicy()).warn_if_short() is None  # off: not asked
