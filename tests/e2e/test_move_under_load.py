"""A partition moved between two shards under load (docs/operations.md, "Moving a partition"):
a dispatcher and a worker per shard (`--shard i`), sessions sent continuously through a sharded
Client (which retries inputs refused `moved`), and `parley partitions move` run as a user runs
it. Every session finishes, with each of its inputs applied exactly once."""

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys, partition_of
from parley.schemas.shards import DEFAULT_SHARDED_PARTITIONS
from tests import forkserver
from tests.conftest import ROOT, Procs, all_events, wait_for

pytestmark = pytest.mark.e2e

K = Keys()
N = DEFAULT_SHARDED_PARTITIONS
P = 0  # on shard 0 (p mod 2), moved to shard 1
APP = "examples.seed_app"


@pytest.fixture
def second(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-1", appendonly=True).start()
    yield server
    server.stop(kill=True)


def session_names() -> Iterator[str]:
    """Every other session in the partition that moves, the rest anywhere."""
    i = 0
    while True:
        while partition_of(f"load-{i}", N) != P:
            i += 1
        yield f"load-{i}"
        yield f"any-{i}"
        i += 1


class Sender(threading.Thread):
    """Sends sessions (a create and a message, each with an idempotency key) until stopped."""

    def __init__(self, client: Client):
        super().__init__(daemon=True)
        self.client = client
        self.sent: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for session in session_names():
                if self.stop.is_set():
                    return
                self.client.send(session, {"type": "session.create"}, f"{session}-create")
                self.client.send(session, {"type": "message.create", "content": "hello"}, f"{session}-hello")
                self.sent.append(session)
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc


def run_parley(urls: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    flags = [a for url in urls for a in ("--redis-url", url)]
    return forkserver.run_parley([*flags, *args], env, text=True, timeout=180)


def test_a_partition_moved_under_load_loses_and_doubles_nothing(procs: Procs, second: RedisServer) -> None:
    urls = [procs.url, second.url]
    env = {"PARLEY_REDIS_URLS": " ".join(urls)}
    for shard in (0, 1):
        procs.dispatcher(APP, "--shard", str(shard), "--lease-ms", "2000", "--register-producer", "web",
                         env=env)
        procs.start("worker", APP, "--shard", str(shard), env=env)
    shards = Shards([redis.Redis.from_url(u) for u in urls], K)
    deadline = time.monotonic() + 30
    while shards.refresh() is None or not all(c.hexists(K.producers, "web") for c in shards.clients):
        assert time.monotonic() < deadline, procs.logs()
        time.sleep(0.1)

    client = Client(shards, producer="web")
    sender = Sender(client)
    sender.start()
    while len(sender.sent) < 20 and sender.error is None:
        time.sleep(0.05)
    moved = run_parley(urls, "partitions", "move", str(P), "--to", "1", "--drain-timeout", "30")
    assert moved.returncode == 0, moved.stdout + moved.stderr + procs.logs()
    during = len(sender.sent)
    while len(sender.sent) < during + 20 and sender.error is None:
        time.sleep(0.05)
    sender.stop.set()
    sender.join(30)
    assert sender.error is None, repr(sender.error)

    placement = shards.refresh()
    assert placement is not None and placement.serves(1, P) and not placement.moving
    in_p = [s for s in sender.sent if partition_of(s, N) == P]
    assert len(in_p) >= 20
    for session in sender.sent:
        wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=60)
    for session in sender.sent:
        events: list[dict[str, Any]] = all_events(client, session)
        kinds = [e["type"] for e in events]
        users = [e for e in events if e["type"] == "message.created" and e["message"]["role"] == "user"]
        assert len(users) == 1 and kinds.count("turn.completed") == 1, (session, kinds)
        assert "input.refused" not in kinds, (session, events)
    # the partition's sessions are on the target only
    for session in in_p:
        assert shards.clients[1].exists(K.meta(session)) and not shards.clients[0].exists(K.meta(session))
