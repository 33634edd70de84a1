"""A stream read with a consumer group deleted under its readers (issue 29): the group goes with
the key, and every read of it then answers `NOGROUP`. Each reader makes the group again (from
id 0) and goes on, instead of failing the same read for good: the dispatcher on its own input and
results streams (a producer's: tests/e2e/test_stream_deleted.py), `parley notify` on the feed,
the archive consumer on `parley:archive` (docs/operations.md, "A stream deleted")."""

import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis
from redis.exceptions import ResponseError

from parley.dispatcher.consume import Dispatcher
from parley.runtime.redis_errors import group_gone
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually
from tests.integration.conftest import INPUTS, RESULTS, MakeDispatcher, send
from tests.integration.test_notify import FEED, Behaviour, Receiver, notify, receivers, write_feed

__all__ = ["receivers"]  # a fixture of test_notify.py, used here

KEYS = Keys()


@pytest.fixture
def running(make_dispatcher: MakeDispatcher) -> Iterator[Callable[..., Dispatcher]]:
    """`start(**kwargs)`: a Dispatcher running its own loop (`run`) in a thread, stopped after."""
    started: list[tuple[threading.Event, threading.Thread]] = []

    def start(**kwargs: Any) -> Dispatcher:
        d = make_dispatcher(**kwargs)
        stop = threading.Event()
        thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
        thread.start()
        started.append((stop, thread))
        return d

    yield start
    for stop, thread in started:
        stop.set()
        thread.join(10)


def served(r: redis.Redis, session: str, entry: str) -> bool:
    """The entry was applied to the session: one of its events names it."""
    return any(entry.encode() in f[b"event"] for _id, f in r.xrange(KEYS.events(session)))


def groups(r: redis.Redis, stream: str) -> list[str]:
    return [g["name"].decode() for g in r.xinfo_groups(stream)]


def test_group_gone_knows_the_reply_alone_and_in_a_pipeline(r: redis.Redis) -> None:
    r.xadd("s", {"a": "1"})
    with pytest.raises(ResponseError) as alone:
        r.xreadgroup("g", "c", {"s": ">"})
    pipe = r.pipeline(transaction=True)
    pipe.xack("s", "g", "1-0")
    pipe.xreadgroup("g", "c", {"s": ">"})
    with pytest.raises(ResponseError) as piped:
        pipe.execute()
    # a read blocked on the stream when it is deleted
    r.xgroup_create("s", "g", id="0")
    blocked: list[BaseException] = []

    def read() -> None:
        try:
            r.xreadgroup("g", "c", {"s": ">"}, block=5000)  # a connection of its own, from the pool
        except ResponseError as exc:
            blocked.append(exc)

    r.xreadgroup("g", "c", {"s": ">"})  # nothing new left to read: the next read blocks
    reader = threading.Thread(target=read)
    reader.start()
    eventually(lambda: int(r.info("clients")["blocked_clients"]) == 1)
    r.delete("s")
    reader.join(5)
    assert group_gone(alone.value) and group_gone(piped.value) and group_gone(blocked[0])
    r.xadd("s", {"a": "1"})
    with pytest.raises(ResponseError) as other:
        r.hset("s", "x", 1)  # WRONGTYPE
    assert not group_gone(other.value)


@pytest.mark.parametrize("deleted", [INPUTS, RESULTS])
def test_the_engines_own_streams_deleted_under_a_running_dispatcher(
        r: redis.Redis, running: Callable[..., Dispatcher], deleted: str) -> None:
    """`parley:inputs` or `parley:results` deleted: the dispatcher makes its group again, and the
    inputs written after (to either stream: one read covers both) are applied."""
    running()
    first = send(r, "s-1", {"type": "session.create"})
    eventually(lambda: served(r, "s-1", first), timeout=10)
    assert r.delete(deleted) == 1
    after = [send(r, f"s-{i}", {"type": "session.create"}) for i in range(2, 6)]
    eventually(lambda: all(served(r, f"s-{i}", e) for i, e in enumerate(after, start=2)), timeout=10)
    assert groups(r, deleted) == [Keys.GROUP]
    eventually(lambda: r.xlen(INPUTS) == 0)  # acknowledged and deleted as usual


def test_notify_forwards_on_after_the_feed_is_deleted(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    """The feed deleted while `parley notify` reads it: the group is made again from id 0 and
    every entry written after the DEL is posted (and the process still exits 0 on SIGTERM)."""
    rec = receivers(lambda n: 200)
    notify(procs, rec.url)
    eventually(lambda: r.exists(FEED) == 1, timeout=20)  # its group made, with the feed
    before = write_feed(r, 2)
    eventually(lambda: rec.accepted_ids() == before, timeout=20)
    assert r.delete(FEED) == 1
    after = write_feed(r, 3)  # the first of them may be written before the group is made again
    eventually(lambda: rec.accepted_ids() == before + after, timeout=20)
    assert "made again from id 0" in procs.logs()


def test_the_archive_consumer_reads_on_after_its_stream_is_deleted(
        r: redis.Redis, make_dispatcher: MakeDispatcher, pg_dsn: str, pg_schema: str) -> None:
    """`parley:archive` deleted under examples/archive_postgres.py: its group is made again from
    id 0, and an entry written after the DEL is stored (before issue 29 the consumer died)."""
    from tests.integration.sessions import APP, make_session, write_archive_entry
    from tests.integration.test_archive_postgres import consumer, rows

    make_session(r, make_dispatcher(app=APP))
    c = consumer(r, pg_dsn, pg_schema)
    c.connection()  # its tables made
    stop = threading.Event()
    thread = threading.Thread(target=c.run, args=(stop,), daemon=True)
    thread.start()
    try:
        write_archive_entry(r, "s-exp", closed_at=7_000)
        eventually(lambda: len(rows(pg_dsn, pg_schema)) == 1, timeout=10)
        r.delete(KEYS.archive)
        write_archive_entry(r, "s-exp", closed_at=9_000)
        eventually(lambda: rows(pg_dsn, pg_schema)[0][1].timestamp() == 9, timeout=10)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)


def test_an_outage_while_the_group_is_made_again_is_ridden_out(
        r: redis.Redis, running: Callable[..., Dispatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis away just as the dispatcher makes a deleted stream's group again: the error does not
    escape its loop (the thread lives on), it backs off, makes the group and applies what follows."""
    real = Dispatcher.regroup
    failed: list[int] = []

    def flaky(self: Dispatcher) -> list[str]:
        if not failed:
            failed.append(1)
            raise redis.ConnectionError("redis went away while the group was made again")
        return real(self)

    monkeypatch.setattr(Dispatcher, "regroup", flaky)
    d = running()
    first = send(r, "s-1", {"type": "session.create"})
    eventually(lambda: served(r, "s-1", first), timeout=10)
    assert r.delete(INPUTS) == 1
    after = send(r, "s-2", {"type": "session.create"})
    eventually(lambda: served(r, "s-2", after), timeout=15)
    assert failed == [1] and groups(r, INPUTS) == [Keys.GROUP]
    # the count moves after the commit that `served` sees: waited for, not read at once (a
    # loaded box once read 1 here)
    eventually(lambda: d.stats.applied >= 2, timeout=10)


def test_the_runbook_case_whole_an_entry_with_the_last_id_is_refused_so_the_session_goes_on(
        r: redis.Redis, running: Callable[..., Dispatcher]) -> None:
    """A producer's entry with the last possible id jams its stream (docs/operations.md). Were it
    applied, it would be its session's marker for the stream, and after the runbook's DEL every
    later input of that session would be taken for a replay and dropped. It is refused as
    written with an explicit id (to the rejected stream), so after the DEL the session goes on."""
    running()
    first = send(r, "jam", {"type": "session.create"})
    eventually(lambda: served(r, "jam", first), timeout=10)
    last = "18446744073709551615-18446744073709551615"
    r.xadd(INPUTS, {"session": "jam", "input": orjson.dumps(
        {"type": "message.create", "content": "from the far future"})}, id=last)
    eventually(lambda: any(last.encode() in b"".join(v for v in f.values())
                           for _id, f in r.xrange(KEYS.rejected)), timeout=10)
    eventually(lambda: r.xlen(INPUTS) == 0)
    assert r.delete(INPUTS) == 1  # the runbook
    after = send(r, "jam", {"type": "message.create", "content": "after the DEL"})
    eventually(lambda: served(r, "jam", after), timeout=10)
