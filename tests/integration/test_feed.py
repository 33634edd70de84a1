"""The fleet-wide feed (docs/protocol.md, "Feed"): written by the commit script, with the session's
own events, in the same atomic step; nothing for a commit that did not happen."""

from typing import Any

import orjson
import redis

from parley.dispatcher.core import Transition
from parley.dispatcher.store import CONFLICT, DEFAULT_FEED_MAXLEN, LEASE_LOST, Store
from parley.schemas.events import FEED_EVENT_TYPES
from parley.schemas.keys import Keys
from parley.schemas.state import Core, SessionState

KEYS = Keys()
S = "s-feed"
LEASE = KEYS.lease(0)
TOKEN = "dispatcher-a:0001"


def transition(entry: str, evs: list[dict[str, Any]]) -> Transition:
    core = Core(session=S, created_at=1000, head="msg-1", seq={"msg": 1})
    return Transition(state=SessionState(core=core, applied={"parley:inputs": entry}), events=evs)


def feed(r: redis.Redis, key: str = KEYS.feed) -> list[dict[str, Any]]:
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in r.xrange(key)]


RAISED = {"type": "interrupt.raised", "at": 1, "interrupt_id": "int-1", "reason": "approval",
          "payload": {"tool": "send_email"}, "anchor": "msg-2"}
RESUMED = {"type": "interrupt.resumed", "at": 2, "interrupt_id": "int-1", "payload": {"ok": True},
           "delivered": True, "timed_out": False, "reason": "approval", "input": {"entry": "9-0"}}


def test_feed_types_are_the_interrupt_lifecycle_and_turn_completed() -> None:
    assert {"interrupt.raised", "interrupt.resumed", "interrupt.cancelled",
                                "turn.completed"} == FEED_EVENT_TYPES


def test_commit_copies_interrupt_and_turn_events_to_the_feed_whole(r: redis.Redis) -> None:
    r.set(LEASE, TOKEN)
    store = Store(r, KEYS)
    evs = [{"type": "message.created", "at": 1, "message": {"id": "msg-2"}}, RAISED, RESUMED,
           {"type": "turn.completed", "at": 3, "head": "msg-3"}]
    assert store.commit(S, "0", transition("1-0", evs), LEASE, TOKEN, 1) == 1
    session_ids = [i.decode() for i, _ in r.xrange(KEYS.events(S))]
    entries = feed(r)
    assert [e["type"] for e in entries] == ["interrupt.raised", "interrupt.resumed", "turn.completed"]
    assert [e["session"] for e in entries] == [S, S, S]
    # each names the session event it copies, so a reader can fetch the context around it
    assert [e["event_id"] for e in entries] == session_ids[1:]
    # fields are copied generically: a field the feed does not know of still flows through
    assert orjson.loads(entries[1]["event"]) == RESUMED


def test_a_refused_commit_writes_nothing_to_the_feed(r: redis.Redis) -> None:
    r.set(LEASE, TOKEN)
    store = Store(r, KEYS)
    assert store.commit(S, "0", transition("1-0", [RAISED]), LEASE, TOKEN, 1) == 1
    # a replay computed from the old version conflicts: no second copy
    assert store.commit(S, "0", transition("1-0", [RAISED]), LEASE, TOKEN, 1) == CONFLICT
    assert store.commit(S, "1", transition("2-0", [RESUMED]), LEASE, "someone-else", 1) == LEASE_LOST
    assert [e["type"] for e in feed(r)] == ["interrupt.raised"]


def test_the_feed_is_capped_near_feed_maxlen(r: redis.Redis) -> None:
    r.set(LEASE, TOKEN)
    assert DEFAULT_FEED_MAXLEN == 100_000
    small = Store(r, KEYS, feed_maxlen=10)
    for version in range(200):
        evs = [dict(RAISED, interrupt_id=f"int-{version}")]
        assert small.commit(S, str(version), transition(f"{version + 1}-0", evs), LEASE, TOKEN, 1) == 1
    assert 10 <= r.xlen(KEYS.feed) < 200
    assert orjson.loads(feed(r)[-1]["event"])["interrupt_id"] == "int-199"


def test_the_feed_key_follows_the_prefix(r: redis.Redis) -> None:
    keys = Keys("acme")
    r.set(keys.lease(0), TOKEN)
    assert keys.feed == "acme:feed"
    assert Store(r, keys).commit(S, "0", transition("1-0", [RAISED]), keys.lease(0), TOKEN, 1) == 1
    assert r.xlen("acme:feed") == 1 and r.exists("parley:feed") == 0
