"""Each partition's list of sessions (issue 35): a move finds a partition's keys and members
from it, in O(the partition), instead of scanning the shard.

A real dispatcher and worker (tests.apps.scenarios, 4 partitions, an idle timeout) make sessions
of every kind a move must carry: open interrupts for anyone, for one principal, with a deadline,
sessions with metadata, closed ones waiting out their retention, idle ones. Then, on that Redis:

- what the lists find of each partition is exactly what scanning the shard finds (keys and
  every shard-wide member, with their scores and values);
- the work of finding one partition's share stays the same when the shard holds ten times more
  sessions of other partitions (counted in keys and members looked at, not timed), while a scan
  grows with them;
- `parley partitions index` lists the sessions of a shard from before the lists (an older
  release's), and marks it.
"""

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from parley.client import Client
from parley.fleet.copying import Copier, Members
from parley.schemas.keys import Keys, partition_of
from parley.schemas.moves import INDEXED_FIELD
from tests.conftest import Procs, eventually, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

APP = "tests.apps.scenarios"
KEYS = Keys()
N = 4
P = 0


def named(partition: int, start: int, count: int) -> Iterator[str]:
    """`count` session ids of `partition`, from a counter."""
    n = start
    made = 0
    while made < count:
        session = f"ps-{n}"
        n += 1
        if partition_of(session, N) == partition:
            made += 1
            yield session


def others(count: int, start: int) -> list[str]:
    return [s for p in range(1, N) for s in named(p, start, count // (N - 1))]


def make(client: Client, sessions: list[str]) -> None:
    """Sessions of each kind, by their position: a question for anyone, one for alice only, one
    with an hour's deadline, one with metadata and no question, one closed (kept for its
    retention), one left idle."""
    kinds = ["Email bob@example.com: hello", "Email bob@example.com: [guarded] hi",
             "Email bob@example.com: [deadline-hour] soon"]
    for n, session in enumerate(sessions):
        kind = n % 6
        if kind < 3:
            client.send(session, {"type": "message.create", "content": kinds[kind]})
        elif kind == 3:
            client.send(session, {"type": "session.create", "metadata": {"team": f"t{n % 2}"}})
        elif kind == 4:
            client.send(session, {"type": "session.create"})
            client.send(session, {"type": "session.close", "reason": "done"})
        else:
            client.send(session, {"type": "session.create"})
    for n, session in enumerate(sessions):
        kind = n % 6
        wanted = "interrupt.raised" if kind < 3 else "session.closed" if kind == 4 else "session.created"
        wait_for(client, session, lambda e, wanted=wanted: e["type"] == wanted, timeout=30)


def flat(members: list[Members]) -> set[tuple[str, str, Any]]:
    return {(key, member, value if isinstance(value, float) else bytes(value))
            for key, _holds, items in members for member, value in items}


def found_by_lists(r: redis.Redis, partition: int) -> tuple[set[Any], set[str], int]:
    copier = Copier(KEYS)
    keys = {k for _s, k in copier.session_keys_of(r, partition, N) if r.exists(k)}
    members = flat(copier.members_of(r, partition, N))
    return members, keys, copier.touched


def found_by_scan(r: redis.Redis, partition: int) -> tuple[set[Any], set[str], int]:
    r.hdel(KEYS.config, INDEXED_FIELD)
    try:
        copier = Copier(KEYS)
        keys = {k for _s, k in copier.session_keys_of(r, partition, N)}
        members = flat(copier.members_of(r, partition, N))
        return members, keys, copier.touched
    finally:
        r.hset(KEYS.config, INDEXED_FIELD, "1")


@pytest.fixture
def engine(procs: Procs, r: redis.Redis) -> Client:
    procs.dispatcher(APP, "--partitions", str(N), "--idle-timeout", "3600")
    procs.worker(APP)
    client = Client(r)
    eventually(lambda: r.hget(KEYS.config, "partitions") == str(N).encode(), timeout=20)
    # written by the dispatcher just after N, as it finds the Redis new
    eventually(lambda: r.hget(KEYS.config, INDEXED_FIELD) is not None, timeout=20)
    return client


def test_the_lists_find_exactly_what_a_scan_of_the_shard_finds(engine: Client, r: redis.Redis) -> None:
    assert r.hget(KEYS.config, INDEXED_FIELD) == b"1"  # a new Redis: listed from the first commit
    make(engine, [*named(P, 0, 12), *others(24, 0)])
    # an input naming no session leaves a refusal readable for a while: no session, not listed
    engine.send("ps-nobody", {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": True})
    eventually(lambda: r.exists(KEYS.events("ps-nobody")) == 1)
    for partition in range(N):
        members, keys, _ = found_by_lists(r, partition)
        scanned_members, scanned_keys, _ = found_by_scan(r, partition)
        assert members == scanned_members, partition
        traces = {k for k in scanned_keys if "ps-nobody" in k}
        assert keys == scanned_keys - traces, partition
        assert traces == set() or partition == partition_of("ps-nobody", N)
    # every kind is there to be carried: questions (anyone, alice's, with a deadline), listings
    # by status and metadata, retention, idleness, the anchors of parked branches
    names = {key for key, _m, _v in found_by_lists(r, P)[0]}
    for key in (KEYS.interrupt_index, KEYS.interrupt_info, KEYS.interrupt_anchors, KEYS.deadlines,
                KEYS.interrupts_by_time, KEYS.interrupts_by_session, KEYS.interrupts_for_anyone,
                KEYS.interrupts_of_principal("alice"), KEYS.interrupts_of_reason("confirm"),
                KEYS.expiring, KEYS.idle, KEYS.sessions_of_status("parked"),
                KEYS.sessions_of_status("closed"), KEYS.sessions_of_metadata("team", "t1")):
        assert key in names, key


def test_finding_a_partition_costs_the_same_with_ten_times_more_sessions_of_others(
        engine: Client, r: redis.Redis) -> None:
    make(engine, [*named(P, 0, 6), *others(6, 0)])
    _, _, listed_before = found_by_lists(r, P)
    _, _, scanned_before = found_by_scan(r, P)
    make(engine, others(66, 1_000))  # ten times the others' sessions
    members, keys, listed_after = found_by_lists(r, P)
    _, _, scanned_after = found_by_scan(r, P)
    print(f"looked at for partition {P}: lists {listed_before} -> {listed_after}, "
          f"scan {scanned_before} -> {scanned_after}")
    assert listed_after == listed_before  # P's sessions only: the same count of keys looked at
    assert scanned_after >= 5 * scanned_before  # a scan meets everything the shard holds
    assert keys and members  # and P's share is found all the same


def test_partitions_index_lists_the_sessions_of_an_older_release(engine: Client, r: redis.Redis,
                                                               procs: Procs) -> None:
    sessions = [*named(P, 0, 6), *others(12, 0)]
    make(engine, sessions)
    listed = {p: set(r.zrange(KEYS.partition_sessions(p), 0, -1)) for p in range(N)}
    assert sum(len(v) for v in listed.values()) == len(sessions)
    # as a release before the lists left it: no lists, no mark
    r.delete(*[KEYS.partition_sessions(p) for p in range(N)])
    r.hdel(KEYS.config, INDEXED_FIELD)
    done = run_parley(["--redis-url", procs.url, "partitions", "index"], text=True)
    assert done.returncode == 0, done.stderr
    assert "shard 0:" in done.stdout and "indexed" in done.stdout
    assert {p: set(r.zrange(KEYS.partition_sessions(p), 0, -1)) for p in range(N)} == listed
    assert r.hget(KEYS.config, INDEXED_FIELD) == b"1"
    again = run_parley(["--redis-url", procs.url, "partitions", "index"], text=True)
    assert again.returncode == 0 and "shard 0: 0 session(s) added" in again.stdout
