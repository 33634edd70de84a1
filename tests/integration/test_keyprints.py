"""The dispatchers' key fingerprints in Redis (`parley:keyprints`, dispatcher/keyprints.py) and
the inbox's check of its keys against them (parley/web/keycheck.py), on a real redis-server
with the shipped redis.conf and users.acl: each side under its own login. Which logins may
write or read the key: tests/integration/test_acl.py."""

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.keyprints import KeyprintsPublisher
from parley.dispatcher.keys_reload import KeysReloader
from parley.runtime.procs import RedisServer, free_port
from parley.schemas.keyprints import AGUI, Keyprints, KeyProblem, fingerprint, read_published
from parley.schemas.keys import Keys
from parley.schemas.signing import Keyring
from parley.web.keycheck import KeyCheck, check_keys, read_shard
from tests.conftest import eventually
from tests.deployed import DISPATCHER, deployed_redis, login
from tests.integration.conftest import NO_DECIDE

KEYS = Keys()
INBOX = "parley-inbox"
ALICE, BOB, CAROL = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef", "carol-key-0123456789abcdef"

pytestmark = pytest.mark.usefixtures("restore_signals")


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


@pytest.fixture
def as_dispatcher(redis_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_server.url_as(login(DISPATCHER)))
    yield conn
    conn.close()


@pytest.fixture
def as_inbox(redis_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_server.url_as(login(INBOX)))
    yield conn
    conn.close()


def records(r: redis.Redis) -> dict[str, Keyprints]:
    return {p.dispatcher: p.prints for p in read_published(r.hgetall(KEYS.keyprints)).records}


def denials(admin: redis.Redis) -> list[str]:
    """Who Redis refused something to, since it started (its ACL LOG)."""
    entries: Any = admin.acl_log()
    return [e["username"].decode() if isinstance(e["username"], bytes) else e["username"] for e in entries]


# ---- the dispatcher's side ------------------------------------------------------------------------


def test_a_dispatcher_publishes_prints_on_start_and_reload_and_withdraws_them_on_stop(
        as_dispatcher: redis.Redis, as_inbox: redis.Redis, r: redis.Redis, tmp_path: Path) -> None:
    """The loop's wiring (dispatcher/consume.py): its keyring published before the first tick,
    the keys file read again (here on a SIGHUP's request) published at the next round, and the
    record gone after a clean stop; the inbox's login reads it, and no key is in it."""
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"alice": ALICE}))
    d = Dispatcher(as_dispatcher, Keys(), NO_DECIDE, keyring=Keyring.load(str(path)), block_ms=5,
                   name="d-loop")
    reloader = KeysReloader(str(path))
    d.decoder.reload_keys = reloader.poll
    stop = threading.Event()
    loop = threading.Thread(target=d.run, args=(stop,))
    loop.start()
    try:
        eventually(lambda: "d-loop" in records(as_inbox), timeout=10)
        assert records(as_inbox)["d-loop"].principals == {"alice": (fingerprint("alice", ALICE),)}
        raw = r.hget(KEYS.keyprints, "d-loop")
        assert isinstance(raw, bytes) and ALICE.encode() not in raw
        path.write_text(json.dumps({"alice": [BOB, ALICE], "carol": CAROL}))
        reloader.request()
        eventually(lambda: set(records(as_inbox)["d-loop"].principals) == {"alice", "carol"}, timeout=10)
        assert records(as_inbox)["d-loop"].principals["alice"] == (fingerprint("alice", BOB),
                                                                  fingerprint("alice", ALICE))
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive() and r.hexists(KEYS.keyprints, "d-loop") == 0
    assert denials(r) == []


def test_publishing_is_skipped_when_nothing_changed_and_done_when_the_keys_do(
        as_dispatcher: redis.Redis, r: redis.Redis) -> None:
    publisher = KeyprintsPublisher(as_dispatcher, KEYS, "d-1")
    keys = {"alice": (ALICE,)}
    publisher.maintain(keys)
    first = records(r)["d-1"]
    r.hset(KEYS.keyprints, "d-1", Keyprints(at=1, principals={"x": ("00",)}).encode())  # a marker
    publisher.maintain(dict(keys))  # equal keys (a new keyring with the engine's key, say): no write
    assert records(r)["d-1"].principals == {"x": ("00",)}
    publisher.maintain({"alice": (ALICE,), "bob": (BOB,)})
    assert set(records(r)["d-1"].principals) == {"alice", "bob"} and records(r)["d-1"].at >= first.at
    publisher.withdraw()
    assert r.exists(KEYS.keyprints) == 0


def test_departed_dispatchers_records_are_deleted_and_our_own_restored(
        as_dispatcher: redis.Redis, r: redis.Redis) -> None:
    now = int(time.time() * 1000)
    old = now - 10 * KeyprintsPublisher.GRACE_MS
    r.hset(KEYS.keyprints, mapping={
        "ghost": Keyprints(at=old, principals={}).encode(),              # died long ago
        "starting": Keyprints(at=now, principals={}).encode(),           # not registered yet
        "live": Keyprints(at=old, principals={}).encode(),               # published long ago, live
        "newer": b'{"format": 2}'})                                       # a newer release's
    r.zadd(KEYS.dispatchers, {"live": now})
    publisher = KeyprintsPublisher(as_dispatcher, KEYS, "d-1")
    publisher.maintain({"alice": (ALICE,)})
    r.hdel(KEYS.keyprints, "d-1")  # deleted by hand
    publisher.PRUNE_EVERY_S = 0
    publisher.maintain({"alice": (ALICE,)})
    assert sorted(records(r)) == ["d-1", "live", "starting"]
    assert r.hexists(KEYS.keyprints, "newer")
    assert records(r)["d-1"].principals == {"alice": (fingerprint("alice", ALICE),)}


def test_a_refused_write_is_logged_once_never_stops_the_dispatcher_and_is_retried(
        as_dispatcher: redis.Redis, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    r.set(KEYS.keyprints, "not a hash")  # WRONGTYPE for every HSET
    publisher = KeyprintsPublisher(as_dispatcher, KEYS, "d-1")
    publisher.PRUNE_EVERY_S = 0
    with caplog.at_level(logging.INFO, "parley.dispatcher"):
        publisher.maintain({"alice": (ALICE,)})
        publisher.maintain({"alice": (ALICE,)})  # the prune's read fails too: not said again
        failed = [rec for rec in caplog.records if "not published" in rec.getMessage()]
        assert len(failed) == 1 and failed[0].levelno == logging.WARNING
        assert "WRONGTYPE" in failed[0].kv["error"]  # type: ignore[attr-defined]
        r.delete(KEYS.keyprints)
        publisher.maintain({"alice": (ALICE,)})
    assert "d-1" in records(r)
    assert any("published again" in rec.getMessage() for rec in caplog.records)


def test_an_outage_propagates_to_the_loop_which_waits_it_out() -> None:
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        KeyprintsPublisher(down, KEYS, "d-1").maintain({"alice": (ALICE,)})


# ---- the inbox's check ----------------------------------------------------------------------------


def test_the_check_says_what_the_dispatchers_lack_under_the_inbox_login(
        as_dispatcher: redis.Redis, redis_server: RedisServer, r: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    theirs = {"bob": (BOB,), "carol": ("other-carol-key-0123",)}
    KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain(theirs)
    inbox = redis.Redis.from_url(redis_server.url_as(login(INBOX)))
    with caplog.at_level(logging.INFO, "parley.inbox"):
        check = check_keys([inbox], KEYS, {"alice": (ALICE,), "bob": (BOB,), "carol": (CAROL,)})
    assert check.lines == [
        "inbox key for alice is unknown to the dispatchers: start them with the same --keys-file (or add "
        "alice's key to theirs)",
        "inbox key for carol (its first, which it signs with) is not one the dispatchers have for carol: "
        "start them with the same --keys-file (or add carol's key to theirs)"]
    warned = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert [rec.getMessage() for rec in warned] == check.lines
    assert [rec.kv["principal"] for rec in warned] == ["alice", "carol"]  # type: ignore[attr-defined]
    assert not check.pending and denials(r) == []


def test_the_same_keys_are_one_info_line(as_dispatcher: redis.Redis, as_inbox: redis.Redis,
                                         caplog: pytest.LogCaptureFixture) -> None:
    KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain({"alice": (ALICE,), "bob": (BOB,)})
    with caplog.at_level(logging.INFO, "parley.inbox"):
        assert check_keys([as_inbox], KEYS, {"alice": (ALICE,)}).lines == []
    # the inbox's own lines (the publisher above logs under the dispatcher's logger, and a
    # logger left at INFO by an earlier test in the process would show it here too)
    assert [(rec.levelno, rec.getMessage()) for rec in caplog.records if rec.name == "parley.inbox"] == [
        (logging.INFO, "inbox keys checked: the 1 dispatcher(s) that published theirs have the key the "
                       "inbox signs with for each of its 1 principal(s)")]


def test_the_check_waits_for_dispatchers_starting_alongside_the_inbox(
        as_dispatcher: redis.Redis, as_inbox: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing published at the first look: looked at again, and what the dispatcher publishes a
    moment later is compared, rather than said to be missing."""
    check = KeyCheck([as_inbox], KEYS, {"alice": (ALICE,)})
    assert check.look() and check.lines == []  # pending
    later = threading.Timer(0.3, lambda: KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain(
        {"bob": (BOB,)}))
    later.start()
    with caplog.at_level(logging.INFO, "parley.inbox"):
        lines = check.wait(wait_s=10, every_s=0.05)
    later.join()
    assert [line.split(":")[0] for line in lines] == ["inbox key for alice is unknown to the dispatchers"]
    assert any("no dispatcher has published its keys yet: looking again for 10 s" in rec.getMessage()
               for rec in caplog.records)


def test_nothing_published_for_the_whole_wait_is_said(as_inbox: redis.Redis) -> None:
    check = KeyCheck([as_inbox], KEYS, {"alice": (ALICE,)})
    assert check.look()
    started = time.monotonic()
    assert check.wait(wait_s=0.3, every_s=0.05) == [
        "no dispatcher has published its keys (older dispatchers, or none running): the inbox's keys "
        "cannot be checked against theirs"]
    assert 0.3 <= time.monotonic() - started < 5


def test_check_keys_waits_in_a_thread_and_the_page_goes_on(as_dispatcher: redis.Redis,
                                                          redis_server: RedisServer) -> None:
    inbox = redis.Redis.from_url(redis_server.url_as(login(INBOX)))
    started = time.monotonic()
    check = check_keys([inbox], KEYS, {"alice": (ALICE,)}, wait_s=10)
    assert time.monotonic() - started < 2 and check.pending  # returned at once, still looking
    KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain({"alice": (ALICE,)})
    eventually(lambda: not check.pending, timeout=10)
    assert check.lines == [] and len(check.found) == 1


def test_a_login_without_the_grant_is_told_to_load_the_new_acl_file(tmp_path: Path) -> None:
    """An ACL file from before the check: the inbox's HGETALL is refused; it says so, and starts."""
    from tests.deployed import SHIPPED_ACL

    old = SHIPPED_ACL.read_text().replace(" (+hgetall %R~parley:keyprints)", "")
    assert old != SHIPPED_ACL.read_text()
    server = deployed_redis(tmp_path / "old-acl", acl_text=old).start()
    try:
        inbox = redis.Redis.from_url(server.url_as(login(INBOX)))
        [line] = check_keys([inbox], KEYS, {"alice": (ALICE,)}).lines
        assert line.startswith("the dispatchers' published keys could not be read (this Redis login may "
                               "not read parley:keyprints: load the new deploy/redis/users.acl; ")
    finally:
        server.stop(kill=True)


def test_a_shard_that_cannot_be_reached_is_said_and_the_others_checked(as_dispatcher: redis.Redis,
                                                                      as_inbox: redis.Redis) -> None:
    KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain({"bob": (BOB,)})
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    lines = check_keys([as_inbox, down], KEYS, {"alice": (ALICE,)}).lines
    assert lines[0] == ("inbox key for alice is unknown to the dispatchers of shard 0: start them with the "
                        "same --keys-file (or add alice's key to theirs)")
    assert lines[1].startswith("the dispatchers' published keys could not be read on shard 1 (")
    assert len(lines) == 2


def test_each_shard_is_compared_with_its_own_dispatchers(tmp_path: Path, as_dispatcher: redis.Redis,
                                                        as_inbox: redis.Redis) -> None:
    """An answer is verified on its session's shard: a key missing on shard 1 only is said of
    shard 1 only."""
    other = deployed_redis(tmp_path / "shard1").start()
    try:
        KeyprintsPublisher(as_dispatcher, KEYS, "d-0").maintain({"alice": (ALICE,)})
        KeyprintsPublisher(redis.Redis.from_url(other.url_as(login(DISPATCHER))), KEYS, "d-1").maintain({})
        inbox1 = redis.Redis.from_url(other.url_as(login(INBOX)))
        assert check_keys([as_inbox, inbox1], KEYS, {"alice": (ALICE,)}).lines == [
            "the dispatchers of shard 1 verify no signing key at all (started without --keys-file?): they "
            "refuse every answer the inbox signs; start them with the same --keys-file"]
    finally:
        other.stop(kill=True)


def test_the_agui_endpoint_checks_its_one_key(as_dispatcher: redis.Redis, redis_server: RedisServer) -> None:
    KeyprintsPublisher(as_dispatcher, KEYS, "d-1").maintain({"desk": ("another-desk-key-0123",)})
    agui = redis.Redis.from_url(redis_server.url_as(login("parley-agui")))
    [line] = check_keys([agui], KEYS, {"desk": ("desk-key-0123456789",)}, AGUI).lines
    assert line == ("agui key for desk (its first, which it signs with) is not one the dispatchers have for "
                    "desk: add desk's key (parley agui's --signing-key) to their --keys-file")


def test_an_unreadable_record_is_said_not_fatal(as_inbox: redis.Redis, r: redis.Redis) -> None:
    r.hset(KEYS.keyprints, mapping={"d-new": orjson.dumps({"format": 2}),
                                    "d-1": Keyprints.of({"alice": (ALICE,)}, 1).encode()})
    found = read_shard(as_inbox, KEYS, None)
    assert not isinstance(found, KeyProblem) and found.unreadable == ("d-new",)
    assert check_keys([as_inbox], KEYS, {"alice": (ALICE,)}).lines == [
        "dispatcher d-new's published keys cannot be read (a newer release?): not compared"]
