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
    another connection, which may reach another server): its unrun outcome, signed with the
    job's token, makes a dispatcher issue it again (here the test issues attempt 2, as the
    dispatcher's core does: tests/unit cover that rule), and it runs once the replica is back."""
    from parley.dispatcher.engine_key import EngineKey
    from parley.schemas.signing import job_signed

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
    try:
        make_worker(["tools"], primary).work(burst=True)
    finally:
        thaw(pair[1])
    assert timeouts() >= before + 1 and calls == []
    [(_id, fields)] = primary.xrange(RESULTS)
    unrun = WorkOutcome.model_validate_json(fields[b"outcome"])
    assert (unrun.work, unrun.attempt, unrun.unrun, unrun.lost, unrun.ok) == ("call-1", 1, True, True, False)
    assert job_signed(EngineKey(primary, KEYS).load(), job, fields[b"outcome"], fields[b"job_sig"].decode())
    assert primary.llen("rq:queue:tools") == 0 and not primary.hexists(KEYS.running, job)
    assert not primary.hexists(KEYS.inflight, job) and not primary.exists(f"rq:job:{job}")
    again = enqueue_tool_job(primary, "s-t", "call-1", "add", {"a": 1, "b": 2}, attempt=2)
    assert primary.wait(1, 10_000) == 1  # the replica back, and caught up
    make_worker(["tools"], primary).work(burst=True)
    assert calls == [(1, 2)]  # run once the replica was back, and once only
    posted = [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in primary.xrange(RESULTS)][1:]
    assert {(o.work, o.attempt, o.ok, str(o.value)) for o in posted} == {("call-1", 2, True, "3")}
    assert not primary.hexists(KEYS.running, again)


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


# ---- a take confirmed only where it was made (review of issue 29) -------------------------------


def _counting_app(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The scenarios app, with its `add` tool counting its runs."""
    monkeypatch.setattr(jobs, "_app", None)
    app = load_app("tests.apps.scenarios")
    calls: list[tuple[int, int]] = []
    add = app.tools["add"]

    def counted(a: int, b: int) -> int:
        calls.append((a, b))
        return add(a, b)

    monkeypatch.setitem(app.tools, "add", counted)
    jobs.set_app(app)
    return calls


def _outcomes(conn: redis.Redis) -> set[tuple[str, int, bool, str]]:
    posted = [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in conn.xrange(RESULTS)]
    return {(o.work, o.attempt, o.ok, str(o.value)) for o in posted}


def test_a_take_whose_wait_another_server_answers_is_not_run(
        tmp_path: Path, primary: redis.Redis, pair: tuple[RedisServer, RedisServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker takes a job on server A; before its confirmation, its pool reconnects to
    another server B (a promoted replica, as a Sentinel-managed pool does, or redis-py's own
    retries) that still has the job queued. B's WAIT is answered by a live replica, so counting
    replicas alone would confirm it: the job would run from A's take and again from B's queue.
    The WAIT's pipeline names B, not A (TakeNotConfirmed): not run, and not given back either
    (B does not hold the take: the job is queued there already). The worker takes it again, on
    B, confirmed there, and runs it once."""
    calls = _counting_app(monkeypatch)
    monkeypatch.setattr(jobs, "_worker_id", "w-moved")
    monkeypatch.setattr(jobs, "_replicas", ReplicaPolicy(acks=1, timeout_ms=2000))
    a_server = RedisServer(tmp_path / "a").start()
    a = redis.Redis.from_url(a_server.url)
    try:
        job = enqueue_tool_job(a, "s-m", "call-1", "add", {"a": 1, "b": 2})
        assert enqueue_tool_job(primary, "s-m", "call-1", "add", {"a": 1, "b": 2}) == job
        real = jobs.confirm_take
        confirms: list[Any] = []

        def moved_then_confirm(connection: redis.Redis, took_on: Any) -> None:
            if not confirms:  # between the take and its confirmation: the pool now reaches B
                pool = connection.connection_pool
                pool.connection_kwargs["port"] = pair[0].port
                pool.disconnect(inuse_connections=False)  # (RQ's pubsub thread keeps its own)
                pool.reset()  # new connections, to B
            confirms.append(took_on)
            real(connection, took_on)

        monkeypatch.setattr(jobs, "confirm_take", moved_then_confirm)
        moving = redis.Redis.from_url(a_server.url)  # the worker's: its pool will reach B
        make_worker(["tools"], moving).work(burst=True)
        moving.close()
        assert calls == [(1, 2)]  # once, from B's take
        assert len(confirms) == 2 and confirms[0] != confirms[1]
        assert confirms[1].run_id == primary.info("server")["run_id"]
        assert _outcomes(primary) == {("call-1", 1, True, "3")} and primary.xlen(RESULTS) == 1
        assert queue_ids(primary, "tools") == [] and not primary.hexists(KEYS.running, job)
        # A's take was never run: A still records it (its heartbeat would lapse: lost work)
        assert a.xlen(RESULTS) == 0 and a.hexists(KEYS.running, job) and queue_ids(a, "tools") == []
    finally:
        a.close()
        a_server.stop()


def _synced(conn: redis.Redis, within_s: float = 30) -> None:
    """Wait until `conn`'s server, a replica, has finished its sync with its primary."""
    deadline = time.monotonic() + within_s
    while True:
        info = conn.info("replication")
        if info.get("master_link_status") == "up" and not int(info.get("master_sync_in_progress", 0)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not synced: {info}")
        time.sleep(0.05)


def test_a_take_lost_in_a_resync_is_not_confirmed_by_the_same_server_promoted_again(
        primary: redis.Redis, pair: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """The server that made the take, P, is demoted (its replica R promoted without the take),
    fully resynced from R (losing the take: the job is queued again, no running record), and
    promoted again, R following it: within redis-py's retry window the worker's connection
    reaches the same process, with the same run_id, and a WAIT there is answered by R. Its
    master_replid is another since (a promotion and a full resync change it): not confirmed,
    not run on that take, not given back (P does not hold it); taken again and run once."""
    calls = _counting_app(monkeypatch)
    monkeypatch.setattr(jobs, "_worker_id", "w-resync")
    monkeypatch.setattr(jobs, "_replicas", ReplicaPolicy(acks=1, timeout_ms=2000))
    p_server, r_server = pair
    replica = redis.Redis.from_url(r_server.url)
    try:
        replica.config_set("repl-diskless-sync-delay", 0)  # it serves P's resync: at once
        job = enqueue_tool_job(primary, "s-r", "call-1", "add", {"a": 1, "b": 2})
        assert primary.execute_command("WAIT", 1, 5000) == 1  # R holds the job queued
        replica.replicaof("NO", "ONE")  # promoted; P, cut off, still takes this worker's take
        worker = make_worker(["tools"], primary)
        taken = worker.take("token-1")
        assert isinstance(taken, tuple) and taken[0].id == job and primary.hexists(KEYS.running, job)
        took_on = taken[0].parley_server
        assert took_on.run_id == primary.info("server")["run_id"] and took_on.replid
        primary.replicaof("127.0.0.1", r_server.port)  # demoted: a full resync from R
        _synced(primary)
        primary.replicaof("NO", "ONE")  # promoted again
        replica.replicaof("127.0.0.1", p_server.port)
        ReplicaSet.wait_replicas(p_server, 1)
        _synced(replica)
        # the same process, without the take: the job queued, recorded as running nowhere
        assert primary.info("server")["run_id"] == took_on.run_id
        assert primary.info("replication")["master_replid"] != took_on.replid
        assert queue_ids(primary, "tools") == [job] and not primary.hexists(KEYS.running, job)
        assert worker.confirm_take(*taken) is False
        assert calls == [] and queue_ids(primary, "tools") == [job]  # not given back a second time
        make_worker(["tools"], primary).work(burst=True)
        assert calls == [(1, 2)]
        assert _outcomes(primary) == {("call-1", 1, True, "3")} and primary.xlen(RESULTS) == 1
    finally:
        replica.close()
