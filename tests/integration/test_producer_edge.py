"""The producer edge under deploy/redis/users.acl: every attack a producer login could make on
other producers' inputs, run as that login, and refused or harmless to anyone else
(docs/protocol.md, "Writing inputs"; docs/operations.md, "Producers").

Before the submit function, a producer login had XADD on the shared `parley:inputs`: `MAXLEN 1`
deleted everyone's unread inputs, an id of 18446744073709551615-18446744073709551615 made every
later `XADD *` fail, and nothing limited how many inputs one session queued. Now each producer
writes only its own streams, through `parley_submit`: what it does to them hurts it alone.

Each test has a second registered producer, `other` (its login made from the file's producer
line, with its own streams), submit first, runs the attack as `app`, then checks `other`'s
entries are all still there, and applied by a dispatcher.
"""

# The fixtures `acl`, `producer` and `dispatcher` come from test_acl.py, and name parameters here.
# ruff: noqa: F811

from typing import Any

import orjson
import pytest
import redis
from redis.exceptions import ResponseError

from parley.client import Client
from parley.client.producer import SubmitRefused
from parley.runtime.metrics import REGISTRY
from tests.integration.test_acl import (  # noqa: F401 (fixtures)
    ACL_FILE,
    APP,
    KEYS,
    PRODUCER,
    AclRedis,
    acl,
    dispatcher,
    make_dispatcher,
    producer,
    refused,
    register,
    text,
    tick,
)

OTHER, OTHER_USER, OTHER_PASSWORD = "other", "parley-producer-other", "other-password"
JAM = "18446744073709551615-18446744073709551615"
MESSAGE = {"type": "message.create", "content": "hi"}
OTHER_SESSIONS = ["o-1", "o-2", "o-3"]


def other_login(acl: AclRedis) -> redis.Redis:
    """A login for producer `other`: the file's producer rules with `other`'s own keys."""
    line = next(u for u in ACL_FILE.read_text().splitlines() if u.startswith(f"user {PRODUCER} "))
    rules = [rule.replace(f":in:{APP}", f":in:{OTHER}").replace(f":pending:{APP}", f":pending:{OTHER}")
             for rule in line.split()[2:] if not rule.startswith(">")]
    acl.admin.execute_command("ACL", "SETUSER", OTHER_USER, *rules, f">{OTHER_PASSWORD}")
    register(acl.admin, OTHER)
    return acl.connect(OTHER_USER, OTHER_PASSWORD)


@pytest.fixture
def others(acl: AclRedis) -> list[tuple[str, dict[bytes, bytes]]]:
    """`other`'s inputs, submitted before the attack: (entry id, fields) as in its stream."""
    client = Client(other_login(acl), producer=OTHER)
    for session in OTHER_SESSIONS:
        client.send(session, MESSAGE)
    return [(text(i), f) for i, f in acl.admin.xrange(KEYS.producer_inputs(OTHER))]


def intact(acl: AclRedis, others: list[tuple[str, dict[bytes, bytes]]], dispatcher: redis.Redis) -> None:
    """`other`'s inputs are all still in its stream, and a dispatcher applies each."""
    assert [(text(i), f) for i, f in acl.admin.xrange(KEYS.producer_inputs(OTHER))] == others
    d = make_dispatcher(dispatcher)
    tick(d)
    for session in OTHER_SESSIONS:
        assert [orjson.loads(f[b"event"])["type"] for _i, f in acl.admin.xrange(KEYS.events(session))] \
            == ["session.created", "message.created"], session


def fields(session: str = "s-1", value: Any = MESSAGE) -> dict[str, Any]:
    return {"session": session, "input": orjson.dumps(value)}


def sample(name: str) -> float:
    """A dispatcher metric's value in this process (0 while it has none)."""
    return REGISTRY.get_sample_value(name) or 0.0


def _served(acl: AclRedis, session: str) -> bool:
    return acl.admin.hexists(KEYS.meta(session), "ver")


def test_trimming_with_maxlen_reaches_only_the_producers_own_entries(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    app = Client(producer, producer=APP)
    for i in range(3):
        app.send(f"a-{i}", MESSAGE)
    for stream in (KEYS.inputs(), KEYS.inputs(0, 4), KEYS.producer_inputs(OTHER)):
        refused(lambda stream=stream: producer.xadd(stream, fields(), maxlen=1, approximate=False))
    producer.xadd(KEYS.producer_inputs(APP), fields(), maxlen=1, approximate=False)  # its own: allowed
    assert acl.admin.xlen(KEYS.producer_inputs(APP)) == 1  # it trimmed its own inputs, no one else's
    intact(acl, others, dispatcher)


def test_jamming_a_stream_with_the_last_possible_id_blocks_only_its_own_submits(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    for stream in (KEYS.inputs(), KEYS.inputs(3, 4), KEYS.producer_inputs(OTHER)):
        refused(lambda stream=stream: producer.xadd(stream, fields(), id=JAM))
    producer.xadd(KEYS.producer_inputs(APP), fields(), id=JAM)  # its own stream: allowed
    with pytest.raises(ResponseError, match="exhausted the last possible ID"):
        Client(producer, producer=APP).send("s-2", MESSAGE)
    Client(acl.connect(OTHER_USER, OTHER_PASSWORD), producer=OTHER).send("o-4", MESSAGE)
    assert acl.admin.xlen(KEYS.producer_inputs(OTHER)) == len(others) + 1  # others go on
    intact_others = others + [(text(i), f) for i, f in acl.admin.xrange(KEYS.producer_inputs(OTHER))][-1:]
    intact(acl, intact_others, dispatcher)


@pytest.mark.parametrize("attack", [
    pytest.param(lambda r, s: r.xdel(s, "0-1"), id="xdel"),
    pytest.param(lambda r, s: r.xtrim(s, maxlen=0, approximate=False), id="xtrim"),
    pytest.param(lambda r, s: r.delete(s), id="del"),
    pytest.param(lambda r, s: r.unlink(s), id="unlink"),
    pytest.param(lambda r, s: r.rename(s, "parley:in:app:9"), id="rename"),
    pytest.param(lambda r, s: r.xgroup_setid(s, "parley-dispatchers", "$"), id="skip-the-group-ahead"),
    pytest.param(lambda r, s: r.xreadgroup("parley-dispatchers", "c", {s: ">"}), id="consume-them"),
])
@pytest.mark.parametrize("stream", [KEYS.inputs(), KEYS.producer_inputs(OTHER), KEYS.producer_inputs(APP)])
def test_input_streams_cannot_be_deleted_trimmed_or_consumed(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any, attack: Any,
        stream: str) -> None:
    refused(lambda: attack(producer, stream))
    intact(acl, others, dispatcher)


@pytest.mark.parametrize("keys", [
    pytest.param((KEYS.producer_inputs(OTHER), KEYS.pending(OTHER)), id="other-producers-keys"),
    pytest.param((KEYS.producer_inputs(APP), KEYS.pending(OTHER)), id="other-producers-pending-hash"),
    pytest.param((KEYS.producer_inputs(OTHER), KEYS.pending(APP)), id="other-producers-stream"),
    pytest.param((KEYS.inputs(), KEYS.pending(APP)), id="the-shared-stream"),
])
def test_the_function_called_on_keys_not_its_own_is_refused(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any,
        keys: tuple[str, str]) -> None:
    name = OTHER if keys[0] == KEYS.producer_inputs(OTHER) else APP
    refused(lambda: producer.fcall("parley_submit", 2, *keys, "parley", name,
                                   "session", "o-1", "input", orjson.dumps(MESSAGE)))
    assert acl.admin.hgetall(KEYS.pending(OTHER)) == {s.encode(): b"1" for s in OTHER_SESSIONS}
    intact(acl, others, dispatcher)


def test_a_5_mb_input_is_refused_too_large_and_nothing_is_written(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    huge = {"type": "message.create", "content": "x" * (5 * 1024 * 1024)}
    too_large = "^PARLEY too_large `input` is 5242918 bytes, over the limit of 1048576$"
    with pytest.raises(ResponseError, match=too_large):
        producer.fcall("parley_submit", 2, KEYS.producer_inputs(APP), KEYS.pending(APP), "parley", APP,
                       *[x for kv in fields("s-1", huge).items() for x in kv])
    assert not acl.admin.exists(KEYS.producer_inputs(APP), KEYS.pending(APP))
    intact(acl, others, dispatcher)


def test_200_inputs_for_one_session_the_101st_is_rate_limited_at_submit(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    app = Client(producer, producer=APP)
    codes = []
    for i in range(200):
        try:
            app.send("flood", {"type": "message.create", "content": f"m{i}"})
            codes.append("admitted")
        except SubmitRefused as err:
            codes.append(err.code)
    assert codes == ["admitted"] * 100 + ["rate_limited"] * 100
    assert acl.admin.xlen(KEYS.producer_inputs(APP)) == 100
    app.send("calm", MESSAGE)  # its other sessions are not held back
    intact(acl, others, dispatcher)


def test_an_unscoped_producer_reads_every_sessions_meta_and_events_but_not_its_messages_or_outbox(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    """The file's producer is not scoped to a tenant: it reads every session's events, and any
    field of every session's meta hash by HGET/HMGET (the counts the submit function reads, and
    with them the session's state `core`: docs/operations.md, "Producers and their logins";
    scope producers to tenants to keep them apart). It reads nothing else of a session."""
    intact(acl, others, dispatcher)
    assert producer.xrange(KEYS.events("o-1"))
    assert producer.hmget(KEYS.meta("o-1"), "ver", "n_msgs") == [b"1", b"1"]
    assert producer.hget(KEYS.meta("o-1"), "core") == acl.admin.hget(KEYS.meta("o-1"), "core") is not None
    for attempt in (lambda: producer.hgetall(KEYS.messages("o-1")),
                    lambda: producer.hget(KEYS.messages("o-1"), "msg-1"),
                    lambda: producer.hgetall(KEYS.meta("o-1")),
                    lambda: producer.hset(KEYS.meta("o-1"), "ver", 9),
                    lambda: producer.hgetall(KEYS.outbox("o-1")),
                    lambda: producer.zrange(KEYS.idempotency_keys("o-1"), 0, -1)):
        refused(attempt)


# ---- a producer's own keys, given another type ----------------------------------------------------


@pytest.mark.parametrize("attack", [
    pytest.param(lambda r: r.xadd(KEYS.pending(APP), {"x": "y"}), id="pending-hash-as-stream"),
    pytest.param(lambda r: r.hincrby(KEYS.producer_inputs(APP), "x", 1), id="stream-as-hash"),
    pytest.param(lambda r: r.hincrby(KEYS.producer_inputs(APP, 3, 4), "x", 1), id="partition-as-hash"),
    pytest.param(lambda r: r.hget(KEYS.producer_inputs(APP), "x"), id="hget-on-its-stream"),
])
def test_a_producer_cannot_give_its_own_keys_another_type(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any, attack: Any) -> None:
    """Its XADD reaches its streams only, its HGET and HINCRBY its pending hash only: a key of
    the wrong type would fail a dispatcher's command on it (the settle's MULTI, XREADGROUP)."""
    refused(lambda: attack(producer))
    assert not acl.admin.exists(KEYS.producer_inputs(APP), KEYS.producer_inputs(APP, 3, 4), KEYS.pending(APP))
    Client(producer, producer=APP).send("a-1", MESSAGE)  # the submit function still works
    assert acl.admin.hgetall(KEYS.pending(APP)) == {b"a-1": b"1"}
    intact(acl, others, dispatcher)
    assert acl.admin.hgetall(KEYS.pending(APP)) == {}


def test_a_pending_key_of_another_type_never_stops_a_dispatcher(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    """Made by an administrator (or a producer login from before the ACL split): entries marked
    admitted, applied and rejected, do not fail the MULTIs that acknowledge them; other
    producers' sessions are served, and the skipped counts are counted."""
    acl.admin.xadd(KEYS.pending(APP), {"x": "y"})
    skipped = sample("parley_pending_counts_skipped_total")
    producer.xadd(KEYS.producer_inputs(APP), {**fields("a-1"), "admitted": "1"})  # applied
    producer.xadd(KEYS.producer_inputs(APP), {"session": "a-2", "input": "not json", "admitted": "1"})
    intact(acl, others, dispatcher)
    assert [orjson.loads(f[b"event"])["type"] for _i, f in acl.admin.xrange(KEYS.events("a-1"))] \
        == ["session.created", "message.created"]
    assert acl.admin.xlen(KEYS.producer_inputs(APP)) == 0  # both acknowledged and deleted
    assert acl.admin.type(KEYS.pending(APP)) == b"stream"
    assert sample("parley_pending_counts_skipped_total") == skipped + 2


def test_a_pending_count_that_cannot_go_down_is_skipped(
        acl: AclRedis, producer: redis.Redis, dispatcher: redis.Redis, others: Any) -> None:
    """The lowest count HINCRBY allows: taking one off would overflow, an error in the MULTI."""
    producer.hincrby(KEYS.pending(APP), "a-3", -(2**63))
    skipped = sample("parley_pending_counts_skipped_total")
    producer.xadd(KEYS.producer_inputs(APP), {**fields("a-3"), "admitted": "1"})
    intact(acl, others, dispatcher)
    assert _served(acl, "a-3") and acl.admin.xlen(KEYS.producer_inputs(APP)) == 0
    assert sample("parley_pending_counts_skipped_total") == skipped + 1


def test_a_producer_stream_of_another_type_is_left_out_and_the_others_served(
        acl: AclRedis, dispatcher: redis.Redis) -> None:
    """`parley:in:app` made a hash before `app` is read: the dispatcher leaves it out (reported
    in parley_producer_streams_unusable), serves `other`, and reads `app` once the key is gone."""
    acl.admin.hincrby(KEYS.producer_inputs(APP), "x", 1)
    d = make_dispatcher(dispatcher)
    other = Client(other_login(acl), producer=OTHER)
    other.send("o-1", MESSAGE)
    tick(d)
    assert _served(acl, "o-1")
    assert d.registry.unusable == {KEYS.producer_inputs(APP)}
    assert sample("parley_producer_streams_unusable") == 1
    # the key goes (an operator); the stream is read again at the next refresh
    acl.admin.delete(KEYS.producer_inputs(APP))
    Client(acl.connect(PRODUCER), producer=APP).send("a-1", MESSAGE)
    d.registry.expire()
    tick(d)
    assert _served(acl, "a-1") and d.registry.unusable == set()
    assert sample("parley_producer_streams_unusable") == 0


def test_a_producer_stream_made_another_type_while_read_is_left_out_after_one_failed_tick(
        acl: AclRedis, dispatcher: redis.Redis) -> None:
    d = make_dispatcher(dispatcher)
    other = Client(other_login(acl), producer=OTHER)
    tick(d)
    assert KEYS.producer_inputs(APP) in d.leases.owned[0].streams
    acl.admin.delete(KEYS.producer_inputs(APP))
    acl.admin.hincrby(KEYS.producer_inputs(APP), "x", 1)
    other.send("o-1", MESSAGE)
    for _ in range(3):  # as the loop does: a failed tick is retried after its pause
        try:
            tick(d, 1)
        except ResponseError:
            d._pause(__import__("threading").Event(), 0)
    assert _served(acl, "o-1")
    assert KEYS.producer_inputs(APP) not in d.leases.owned[0].streams
