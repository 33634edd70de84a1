"""--replica-acks against a real primary and replica: a batch whose commits the replica does not
hold is neither acknowledged nor flushed, and its replay, once the replica is back, applies it
once. The replica is held still with SIGSTOP (it stays connected, but acknowledges nothing)."""

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from parley import metrics
from parley.cli.procs import RedisServer
from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.replicas import ReplicaPolicy, Replicas, ReplicasBehind
from parley.schemas.keys import Keys
from tests.integration.conftest import INPUTS, NO_DECIDE, events, pending_count, queue_ids, send, tick
from tests.replica_set import FAST_SYNC, ReplicaSet

KEYS = Keys()


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
    # committed, but neither acknowledged nor flushed: the entry pending, its job in the outbox
    meta = primary.hgetall(KEYS.meta("s-1"))
    assert orjson.loads(meta[b"applied"]) == {INPUTS: entry}
    assert pending_count(primary, INPUTS) == 1
    assert primary.hlen(KEYS.outbox("s-1")) > 0
    assert queue_ids(primary, "llm") == []

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
