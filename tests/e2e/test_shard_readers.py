"""Readers across sessions over two shards, end to end: a dispatcher and a worker per shard
running the seed app, sessions sent through `Client` to their placed shard, and the questions
they raise listed by `Client` and `parley interrupts` with both URLs, merged in raise order and
paged with no row lost or repeated; the list of sessions merged the same way."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.dispatcher.functions import Functions
from parley.runtime.procs import RedisServer, stop_processes
from parley.schemas.keys import Keys
from tests.conftest import ROOT, eventually, wait_for
from tests.forkserver import run_parley, start_parley

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."
N = 16


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[str], Shards]]:
    servers = [RedisServer(tmp_path / f"redis-{i}").start() for i in range(2)]
    urls = [s.url for s in servers]
    shards = Shards([redis.Redis.from_url(u) for u in urls], Keys())
    shards.check(N, create=True)
    for r in shards.clients:  # what each shard's dispatcher loads at start: sending need not wait
        Functions(r).ensure()
    env = {"PYTHONPATH": str(ROOT), "PARLEY_APP": "examples.seed_app", "PARLEY_LOG_LEVEL": "INFO"}
    procs = []
    given = [a for u in urls for a in ("--redis-url", u)]
    for i in range(len(urls)):
        procs.append(start_parley([*given, "dispatcher", "--shard", str(i), "--register-producer", "app"],
                                  env, tmp_path / f"dispatcher-{i}.log"))
        procs.append(start_parley([*given, "worker", "--shard", str(i)], env, tmp_path / f"worker-{i}.log"))
    try:
        yield urls, shards
    finally:
        codes = stop_processes(procs)
        for server in servers:
            server.stop(kill=True)
        assert all(code == 0 for code in codes), codes


def cli(urls: list[str], *args: str) -> Any:
    given = [a for u in urls for a in ("--redis-url", u)]
    out = run_parley([*given, *args], text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout)


def test_interrupts_and_sessions_of_two_shards_merge_in_order_and_page_without_loss(
        fleet: tuple[list[str], Shards]) -> None:
    urls, shards = fleet
    client = Client(shards, producer="app")
    sessions = [f"s-{i}" for i in range(8)]
    placed = {shards.index_of_session(s) for s in sessions}
    assert placed == {0, 1}
    for s in sessions:  # one after another: each raises its question before the next is sent
        client.send(s, {"type": "session.create", "metadata": {"team": "a"}})
        client.send(s, {"type": "message.create", "content": SEED})
        wait_for(client, s, lambda e: e["type"] == "interrupt.raised")
    for s in sessions:  # each session is on its shard only
        assert client.shards.clients[1 - shards.index_of_session(s)].exists(Keys().meta(s)) == 0
    eventually(lambda: len(client.interrupts()) == len(sessions))

    rows = client.interrupts()
    assert [r["raised_at"] for r in rows] == sorted(r["raised_at"] for r in rows)
    assert sorted(r["session"] for r in rows) == sessions
    every = cli(urls, "interrupts", "--json")
    def ids(listed: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(r["session"], r["interrupt_id"]) for r in listed]

    assert ids(every) == ids(rows)

    paged: list[str] = []
    cursor: str | None = None
    while True:
        page = cli(urls, "interrupts", "--json", "--limit", "3", *(["--cursor", cursor] if cursor else []))
        assert len(page["items"]) <= 3
        paged += [r["session"] for r in page["items"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert paged == [r["session"] for r in rows]

    listed: list[str] = []
    cursor = None
    while True:
        spage = client.sessions(limit=3, cursor=cursor, newest_first=True)
        listed += [row.session for row in spage.items]
        cursor = spage.cursor
        if cursor is None:
            break
    assert listed == list(reversed(sessions))
    shown = cli(urls, "sessions", "--json", "--status", "parked")
    assert [row["session"] for row in shown["items"]] == sessions
