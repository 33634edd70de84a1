"""Tenants (docs/operations.md, "Tenants"): the example users of deploy/redis/users.acl scoped to
tenant `acme` by key patterns, on a real redis-server. The reader reads acme's sessions (show,
events, export's EVAL_RO) and is refused another tenant's; the producer writes only its own
input streams and reads only acme's events and records, so it can neither read nor write a
session of another tenant. The fleet-wide listings are an unscoped reader's: a scoped one is
refused them (their sets hold every tenant's sessions)."""

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.dispatcher.core import IndexAdd
from parley.dispatcher.enqueue import Outbox
from parley.schemas.keys import Keys
from tests.integration.conftest import tick
from tests.integration.test_acl import (
    ACME_PRODUCER,
    ACME_READER,
    DISPATCHER,
    AclRedis,
    make_dispatcher,
    refused,
)

pytestmark = pytest.mark.usefixtures("restore_signals")

KEYS = Keys()
ACME, GLOBEX = "acme/s-1", "globex/s-1"


@pytest.fixture
def acl(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path / "redis")  # deploy/redis/users.acl, as test_acl.py starts it
    yield server
    server.stop()


@pytest.fixture
def sessions(acl: AclRedis) -> None:
    """Two sessions of two tenants, made by a dispatcher under its own user."""
    for session in (ACME, GLOBEX):
        acl.admin.xadd(KEYS.inputs(), {"session": session, "input": orjson.dumps(
            {"type": "message.create", "content": f"hi from {session}"})})
    d = make_dispatcher(acl.connect(DISPATCHER))
    for _ in range(3):
        tick(d, 1)
    assert acl.admin.exists(KEYS.meta(ACME), KEYS.meta(GLOBEX)) == 2
    acl.reset_denials()


@pytest.fixture
def acme_reader(acl: AclRedis, sessions: None) -> redis.Redis:
    return acl.connect(ACME_READER)


@pytest.fixture
def acme_producer(acl: AclRedis, sessions: None) -> redis.Redis:
    return acl.connect(ACME_PRODUCER)


def test_the_scoped_reader_reads_its_tenants_sessions(acl: AclRedis, acme_reader: redis.Redis) -> None:
    client = Client(acme_reader)
    view = client.show(ACME)
    assert view is not None and view["messages"][0]["content"] == "hi from acme/s-1"
    events = client.events(ACME, block_ms=1, until=time.monotonic() + 0.05)
    assert "message.created" in [e["type"] for _id, e in events]
    assert client.export(ACME).messages[0]["content"] == "hi from acme/s-1"  # EVAL_RO, read-only
    assert client.show("acme/never-made") is None
    # a sub-agent's child of an acme session is acme's too: `acme/s-1:sub-1`
    assert acme_reader.xrange(KEYS.events(ACME + ":sub-1")) == []
    # and the replies its models stream (parley watch --deltas)
    acl.admin.xadd(KEYS.deltas(ACME), {"call": "llm-1", "attempt": "1", "seq": "1", "text": "Hi"})
    streamed = client.events(ACME, block_ms=1, until=time.monotonic() + 0.05, deltas=True)
    assert [e.get("text") for _id, e in streamed if e["type"] == "llm.delta"] == ["Hi"]
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: Client(r).show(GLOBEX), id="show"),
    pytest.param(lambda r: Client(r).export(GLOBEX), id="export-eval-ro"),
    pytest.param(lambda r: r.xrange(KEYS.events(GLOBEX)), id="events"),
    pytest.param(lambda r: r.xread({KEYS.events(ACME): "0-0", KEYS.deltas(GLOBEX): "0-0"}),
                 id="another-tenants-streamed-replies"),
    pytest.param(lambda r: r.xread({KEYS.events(ACME): "0-0", KEYS.events(GLOBEX): "0-0"}),
                 id="events-read-along-with-its-own"),
    pytest.param(lambda r: r.hgetall(KEYS.messages(GLOBEX)), id="messages"),
    pytest.param(lambda r: r.hmget(KEYS.meta(GLOBEX), "core"), id="meta"),
    # a read-only script declaring acme's key but reading another tenant's: checked per command
    pytest.param(lambda r: r.eval_ro(f"return redis.call('HGETALL', '{KEYS.meta(GLOBEX)}')", 1,
                                     KEYS.meta(ACME)), id="script-reads-another-tenants-key"),
    pytest.param(lambda r: r.hset(KEYS.meta(ACME), "ver", 9), id="write-its-own-meta"),
    pytest.param(lambda r: r.hgetall(KEYS.outbox(ACME)), id="its-own-outbox"),
    pytest.param(lambda r: r.zrange(KEYS.idempotency_keys(ACME), 0, -1), id="its-own-idempotency-keys"),
    pytest.param(lambda r: r.xrange(KEYS.events("acme2/s-1")), id="a-tenant-whose-name-starts-alike"),
    pytest.param(lambda r: r.xrange(KEYS.events("acme")), id="a-session-named-like-the-tenant"),
    # the fleet-wide listings hold every tenant's sessions: an unscoped reader's
    pytest.param(lambda r: Client(r).interrupts(), id="interrupts-listing"),
    pytest.param(lambda r: Client(r).sessions(), id="sessions-listing"),
    pytest.param(lambda r: r.xrange(KEYS.feed), id="feed"),
    pytest.param(lambda r: r.scan(0, match="parley:*"), id="scan"),
])
def test_the_scoped_reader_is_refused_other_tenants_and_the_fleet(
        acl: AclRedis, acme_reader: redis.Redis, attempt: Callable[[redis.Redis], Any]) -> None:
    refused(lambda: attempt(acme_reader))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {ACME_READER}


def test_the_scoped_producer_writes_its_own_streams_and_reads_its_tenant(
        acl: AclRedis, acme_producer: redis.Redis) -> None:
    own = KEYS.producer_inputs("acme-app")
    acme_producer.xadd(own, {"session": ACME, "input": '{"type":"session.create"}'})
    acme_producer.xadd(KEYS.producer_inputs("acme-app", 3, 4), {"session": ACME, "input": "{}"})
    assert acl.admin.xlen(own) == 1
    acme_producer.hget(KEYS.config, "partitions")  # the client reads N (allowed: no denial below)
    # what the submit function does under this login: count its pending inputs, read the limits
    assert acme_producer.hincrby(KEYS.pending("acme-app"), ACME, 1) == 1
    assert acme_producer.hget(KEYS.pending("acme-app"), ACME) == b"1"
    acme_producer.hmget(KEYS.config, "limit_pending", "limit_messages")
    assert [f[b"event"] for _id, f in acme_producer.xrange(KEYS.events(ACME))]
    assert acme_producer.xread({KEYS.events(ACME): "0-0", KEYS.deltas(ACME): "0-0"})  # watch --deltas
    # its tenant's records: what the submit function reads to check the limits
    assert acme_producer.hmget(KEYS.meta(ACME), "core")[0]
    assert acl.denials() == []


@pytest.mark.parametrize("attempt", [
    # reading another tenant's session
    pytest.param(lambda r: r.xrange(KEYS.events(GLOBEX)), id="read-events"),
    pytest.param(lambda r: r.xread({KEYS.events(GLOBEX): "0-0"}), id="follow-events"),
    pytest.param(lambda r: r.xread({KEYS.deltas(GLOBEX): "0-0"}), id="follow-streamed-replies"),
    pytest.param(lambda r: r.hmget(KEYS.meta(GLOBEX), "core"), id="read-meta"),
    pytest.param(lambda r: r.hgetall(KEYS.messages(GLOBEX)), id="read-messages"),
    pytest.param(lambda r: Client(r).show(GLOBEX), id="show"),
    # writing for another tenant: its producer's streams, the shared ones, the session itself
    pytest.param(lambda r: r.xadd(KEYS.producer_inputs("globex-app"), {"session": GLOBEX, "input": "{}"}),
                 id="write-another-producers-stream"),
    pytest.param(lambda r: r.xadd(KEYS.producer_inputs("acme-app2"), {"session": ACME, "input": "{}"}),
                 id="write-a-stream-of-a-producer-named-alike"),
    pytest.param(lambda r: r.xadd(KEYS.inputs(), {"session": GLOBEX, "input": "{}"}),
                 id="write-shared-inputs"),
    pytest.param(lambda r: r.xadd(KEYS.inputs(0, 4), {"session": GLOBEX, "input": "{}"}),
                 id="write-shared-partition"),
    pytest.param(lambda r: r.xadd(KEYS.events(GLOBEX), {"event": "{}"}), id="write-events"),
    pytest.param(lambda r: r.hset(KEYS.meta(GLOBEX), "ver", 9), id="write-meta"),
    pytest.param(lambda r: r.hset(KEYS.meta(ACME), "ver", 9), id="write-its-own-tenants-meta"),
    pytest.param(lambda r: r.xrange(KEYS.producer_inputs("globex-app")), id="read-another-producers-inputs"),
    pytest.param(lambda r: r.eval("return redis.call('HGETALL', KEYS[1])", 1, KEYS.meta(GLOBEX)), id="eval"),
    pytest.param(lambda r: r.hgetall(KEYS.producers), id="read-the-producer-registry"),
    pytest.param(lambda r: r.hincrby(KEYS.pending("globex-app"), GLOBEX, -5), id="another-producers-counts"),
    pytest.param(lambda r: r.hget(KEYS.pending("globex-app"), GLOBEX), id="read-another-producers-counts"),
    pytest.param(lambda r: Client(r).interrupts(), id="list-interrupts"),
    pytest.param(lambda r: r.scan(0, match="parley:*"), id="scan"),
])
def test_the_scoped_producer_cannot_read_or_write_another_tenants_session(
        acl: AclRedis, acme_producer: redis.Redis, attempt: Callable[[redis.Redis], Any]) -> None:
    refused(lambda: attempt(acme_producer))
    assert acl.denials() and {u for u, _why, _obj in acl.denials()} == {ACME_PRODUCER}
    assert acl.admin.xlen(KEYS.events(GLOBEX)) >= 1  # globex's session is untouched
    assert acl.admin.exists(KEYS.producer_inputs("globex-app"), KEYS.inputs(0, 4)) == 0


def test_the_interrupt_listing_by_session_prefix_selects_one_tenant(r: redis.Redis) -> None:
    """`parley interrupts --session-prefix acme/`: the listing's range by session id stops at the
    tenant's end, whatever ids sort next to it (`acme2/...`, `acme-...`, `acme`)."""
    sessions = ["acme", "acme-x", "acme/s-1", "acme/s-1:sub-1", "acme/s-2", "acme2/s-1", "globex/s-1"]
    for n, session in enumerate(sessions):
        Outbox(r, KEYS).flush_many([(session, [IndexAdd(
            seq=1, interrupt_id="int-1", reason="confirm", anchor=None, raised_at=1_000 + n,
            deadline=None, parent=None, resumable_by=None)])])
    client = Client(r)
    page = client.interrupt_page(InterruptFilter(session_prefix="acme/"), limit=2)
    assert [i.session for i in page.items] == ["acme/s-1", "acme/s-1:sub-1"]
    rest = client.interrupt_page(InterruptFilter(session_prefix="acme/"), limit=2, cursor=page.cursor)
    assert [i.session for i in rest.items] == ["acme/s-2"] and rest.cursor is None
    assert [i.session for i in client.interrupt_page(InterruptFilter(session_prefix="globex/")).items] \
        == ["globex/s-1"]
    # newest first (by session id descending) starts at the tenant's end, not past it
    newest = InterruptFilter(session_prefix="acme/", newest_first=True)
    page = client.interrupt_page(newest, limit=2)
    assert [i.session for i in page.items] == ["acme/s-2", "acme/s-1:sub-1"]
    rest = client.interrupt_page(newest, limit=2, cursor=page.cursor)
    assert [i.session for i in rest.items] == ["acme/s-1"] and rest.cursor is None


# What the submit function's tenant check stands on (the function itself is loaded by
# dispatchers): a Redis Function runs its commands as the CALLING login, so under the acme
# producer a read of another tenant's session record inside the function is refused, and
# FCALL itself is refused keys that are not the producer's own.
PROBE = """#!lua name=tenant_probe
redis.register_function('tenant_probe', function(keys, args)
  local reply = redis.pcall('HMGET', args[1], 'core')
  if type(reply) == 'table' and reply.err then return 'refused: ' .. reply.err end
  return 'read'
end)
"""


def test_a_function_called_by_the_scoped_producer_reads_only_its_tenants_records(
        acl: AclRedis, acme_producer: redis.Redis) -> None:
    acl.admin.function_load(PROBE, replace=True)
    own = [KEYS.producer_inputs("acme-app"), KEYS.pending("acme-app")]
    assert acme_producer.fcall("tenant_probe", 2, *own, KEYS.meta(ACME)) == b"read"
    assert acl.denials() == []
    answer = acme_producer.fcall("tenant_probe", 2, *own, KEYS.meta(GLOBEX)).decode()
    # Redis 7.0 words a refusal inside a function "can't access"; later versions say NOPERM
    assert answer.startswith("refused: ") and ("can't access" in answer or "NOPERM" in answer), answer
    assert {u for u, _why, _obj in acl.denials()} == {ACME_PRODUCER}
    acl.reset_denials()
    # FCALL naming keys of another producer, of another tenant's session, or the shared stream
    for keys in ([KEYS.producer_inputs("globex-app"), KEYS.pending("globex-app")],
                 [KEYS.meta(GLOBEX), KEYS.pending("acme-app")],
                 [KEYS.inputs(), KEYS.pending("acme-app")]):
        refused(lambda keys=keys: acme_producer.fcall("tenant_probe", 2, *keys, KEYS.meta(ACME)))
