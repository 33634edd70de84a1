"""dispatcher.store against a real Redis: load, the atomic commit script, fencing, TTLs, trimming."""

import time
from typing import Any

import orjson
import pytest
import redis

from parley.dispatcher.core import AppInfo, Context, Effect, IndexRemove, Transition, effect_to_dict
from parley.dispatcher.core.transition import Tx
from parley.dispatcher.store import COMMITTED, CONFLICT, IDEMPOTENCY_TTL_S, LEASE_LOST, Store
from parley.schemas.keys import Keys
from parley.schemas.state import Core, SessionState, Turn
from parley.schemas.tree import Shape

KEYS = Keys()
S = "s-store"
LEASE = KEYS.lease(0)
TOKEN = "dispatcher-a:0001"


@pytest.fixture
def store(r: redis.Redis) -> Store:
    r.set(LEASE, TOKEN)
    return Store(r, KEYS)


def msg(n: int, parent: int | None = None) -> dict[str, Any]:
    return {"id": f"msg-{n}", "parent_id": f"msg-{parent}" if parent else None, "role": "user",
            "content": f"text {n}", "turn": f"msg-{n}"}


def event(kind: str, n: int) -> dict[str, Any]:
    return {"type": kind, "at": 1000 + n, "n": n}


def transition(entry: str, *, head: str | None = "msg-1", messages: list[dict[str, Any]] | None = None,
               evs: list[dict[str, Any]] | None = None, effects: list[Effect] | None = None,
               idem: str | None = None, exists: bool = True, session: str = S,
               shape: Shape | None = None, created: bool = False) -> Transition:
    """A transition as the core makes one; `shape`: the tree's shape as loaded, to which the new
    messages are added (None: a session whose shape is not stored yet); `created`: it creates
    the session."""
    shape = shape if shape is not None else Shape(stored=None)
    for m in messages or []:
        shape.add(m["id"], m["parent_id"], m["turn"])
    # the core counts what the shape holds, as every transition keeps it (Tx.add_message)
    core = Core(session=session, created_at=1000, head=head, seq={"msg": 1},
                n_msgs=len(shape)) if exists else None
    return Transition(state=SessionState(core=core, applied={"parley:inputs": entry}),
                      new_messages=messages or [], events=evs or [], effects=effects or [],
                      idempotency_key=idem, tree_fields=shape.dirty_fields() if exists else {},
                      created=created)


def calls_of(r: redis.Redis, action: Any) -> dict[str, int]:
    """The commands `action()` sent, by name (INFO commandstats before and after)."""
    before = r.info("commandstats")
    action()
    after = r.info("commandstats")
    diff = {k.removeprefix("cmdstat_"): after[k]["calls"] - before.get(k, {"calls": 0})["calls"]
            for k in after if k != "cmdstat_info"}
    return {k: n for k, n in diff.items() if n}


def snapshot(r: redis.Redis, session: str = S) -> dict[str, Any]:
    """Everything the commit script can write for one session."""
    return {
        "meta": r.hgetall(KEYS.meta(session)),
        "msgs": r.hgetall(KEYS.messages(session)),
        "events": r.xrange(KEYS.events(session)),
        "outbox": r.hgetall(KEYS.outbox(session)),
        "idem": r.zrange(KEYS.idempotency_keys(session), 0, -1),
    }


def test_load_of_a_missing_session(store: Store, r: redis.Redis) -> None:
    state, version = store.load("nobody")
    assert version == "0"
    assert state.core is None
    assert state.messages == {}
    assert state.applied == {}
    assert state.duplicate is False
    state, version = store.load("nobody", idempotency_key="k-1")
    assert (state.core, state.duplicate, version) == (None, False, "0")
    assert r.keys("*") == [LEASE.encode()]  # loading writes nothing


def test_commit_writes_core_messages_events_outbox_and_bumps_version(store: Store, r: redis.Redis) -> None:
    effects = [IndexRemove(seq=1, interrupt_id="int-1"),
               IndexRemove(seq=2, interrupt_id="int-2")]
    tr = transition("5-0", messages=[msg(1)], evs=[event("session.created", 1), event("message.created", 2)],
                    effects=effects)
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED

    meta = r.hgetall(KEYS.meta(S))
    assert meta[b"ver"] == b"1"
    assert Core.model_validate_json(meta[b"core"]) == tr.state.core
    assert orjson.loads(meta[b"applied"]) == {"parley:inputs": "5-0"}
    assert {k: orjson.loads(v) for k, v in r.hgetall(KEYS.messages(S)).items()} == {b"msg-1": msg(1)}
    written = r.xrange(KEYS.events(S))
    assert [list(fields) for _id, fields in written] == [[b"event"], [b"event"]]
    assert [orjson.loads(f[b"event"]) for _id, f in written] == tr.events
    assert {k: orjson.loads(v) for k, v in r.hgetall(KEYS.outbox(S)).items()} == {
        b"1": effect_to_dict(effects[0]), b"2": effect_to_dict(effects[1])}

    state, version = store.load(S)
    assert version == "1"
    assert state.core == tr.state.core
    # the tree's shape, from the meta hash; no body (a transition never reads the messages hash)
    assert state.tree == ["msg-1", -1, 0] and state.messages == {}
    assert state.applied == {"parley:inputs": "5-0"}
    assert store.pending_effects(S) == effects

    # the next transition is computed from version 1 and leaves version 2
    tr2 = transition("6-0", head="msg-2", messages=[msg(2, 1)], evs=[event("message.created", 3)],
                     shape=Shape(state.tree, stored=1))
    assert store.commit(S, "1", tr2, LEASE, TOKEN, 1) == COMMITTED
    state, version = store.load(S)
    assert version == "2"
    assert state.core is not None and state.core.head == "msg-2"
    assert state.tree == ["msg-1", -1, 0, "msg-2", 0, 1]
    assert set(r.hkeys(KEYS.messages(S))) == {b"msg-1", b"msg-2"}  # messages are added, never replaced
    assert r.xlen(KEYS.events(S)) == 3
    assert state.applied == {"parley:inputs": "6-0"}


def test_pending_effects_are_sorted_by_numeric_seq(store: Store) -> None:
    effects = [IndexRemove(seq=n, interrupt_id=f"int-{n}") for n in (10, 2, 1)]
    assert store.commit(S, "0", transition("1-0", effects=effects), LEASE, TOKEN, 1) == COMMITTED
    assert [fx.seq for fx in store.pending_effects(S)] == [1, 2, 10]


def test_stale_version_is_a_conflict_and_writes_nothing(store: Store, r: redis.Redis) -> None:
    first = transition("1-0", messages=[msg(1)], evs=[event("message.created", 1)],
                       effects=[IndexRemove(seq=1, interrupt_id="int-1")])
    assert store.commit(S, "0", first, LEASE, TOKEN, 1) == COMMITTED
    before = snapshot(r)

    stale = transition("2-0", head="msg-2", messages=[msg(2, 1)],
                       evs=[event("message.created", 2), event("llm.started", 3)],
                       effects=[IndexRemove(seq=2, interrupt_id="int-2")],
                       idem="req-2")
    assert store.commit(S, "0", stale, LEASE, TOKEN, 1) == CONFLICT  # computed from version 0
    assert store.commit(S, "7", stale, LEASE, TOKEN, 1) == CONFLICT  # a version from nowhere
    after = snapshot(r)
    assert after == before
    assert r.xlen(KEYS.events(S)) == 1
    assert list(after["msgs"]) == [b"msg-1"]
    assert after["meta"][b"ver"] == b"1"
    assert after["idem"] == []  # the key of an entry that did not commit is not used up
    assert store.load(S, "req-2")[0].duplicate is False


def test_wrong_lease_token_is_lease_lost_and_writes_nothing(store: Store, r: redis.Redis) -> None:
    tr = transition("1-0", messages=[msg(1)], evs=[event("message.created", 1)],
                    effects=[IndexRemove(seq=1, interrupt_id="int-1")], idem="req-1")
    assert store.commit(S, "0", tr, LEASE, "dispatcher-b:9999", 1) == LEASE_LOST
    assert snapshot(r) == {"meta": {}, "msgs": {}, "events": [], "outbox": {}, "idem": []}

    # fencing is checked before the version: a stale writer without the lease is told to stop
    assert store.commit(S, "3", tr, LEASE, "dispatcher-b:9999", 1) == LEASE_LOST

    # an expired (absent) lease fences every token, the former holder's included
    r.delete(LEASE)
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == LEASE_LOST
    assert r.exists(KEYS.meta(S), KEYS.messages(S), KEYS.events(S), KEYS.outbox(S)) == 0

    r.set(LEASE, TOKEN)
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    assert r.hget(KEYS.meta(S), "ver") == b"1"


def test_idempotency_key_counts_for_24h_in_the_sessions_sorted_set(store: Store, r: redis.Redis) -> None:
    assert IDEMPOTENCY_TTL_S == 24 * 3600
    before = int(time.time() * 1000)
    tr = transition("1-0", evs=[event("session.created", 1)], idem="req-7")
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    key = KEYS.idempotency_keys(S)
    assert key == "parley:{s-store}:idem"
    until = r.zscore(key, "req-7")
    assert until is not None and before + 24 * 3600 * 1000 <= until <= time.time() * 1000 + 24 * 3600 * 1000
    # the session's own keys never expire by TTL (the expiry sweep deletes them)
    assert r.ttl(KEYS.meta(S)) == -1 and r.ttl(key) == -1
    assert store.load(S, "req-7")[0].duplicate is True
    assert store.load(S, "req-8")[0].duplicate is False


def test_an_expired_idempotency_key_no_longer_counts_and_the_next_commit_drops_it(
        store: Store, r: redis.Redis) -> None:
    past = int(time.time() * 1000) - 1
    r.zadd(KEYS.idempotency_keys(S), {"old": past})
    assert store.load(S, "old")[0].duplicate is False  # its window is over: a new entry
    assert store.commit(S, "0", transition("1-0", idem="new"), LEASE, TOKEN, 1) == COMMITTED
    assert [m for m, _ in r.zrange(KEYS.idempotency_keys(S), 0, -1, withscores=True)] == [b"new"]
    assert store.load(S, "req-8")[0].duplicate is False


def test_commit_without_idempotency_key_writes_no_key(store: Store, r: redis.Redis) -> None:
    assert store.commit(S, "0", transition("1-0", evs=[event("session.created", 1)]), LEASE, TOKEN, 1) == 1
    assert r.exists(KEYS.idempotency_keys(S)) == 0
    assert r.ttl(KEYS.meta(S)) == -1


def test_commit_of_a_session_that_still_does_not_exist_keeps_only_markers(
        store: Store, r: redis.Redis) -> None:
    """An input ignored for an unknown session still marks its entry applied (exactly once)."""
    tr = transition("9-0", exists=False, evs=[event("input.ignored", 1)])
    assert store.commit(S, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    meta = r.hgetall(KEYS.meta(S))
    assert set(meta) == {b"ver", b"applied"}
    state, version = store.load(S)
    assert (state.core, version, state.applied) == (None, "1", {"parley:inputs": "9-0"})
    assert r.xlen(KEYS.events(S)) == 1


def test_commit_without_fencing_token_skips_the_lease_check(store: Store, r: redis.Redis) -> None:
    r.delete(LEASE)
    assert store.commit(S, "0", transition("1-0"), LEASE, "", 1) == COMMITTED
    assert r.hget(KEYS.meta(S), "ver") == b"1"


def test_events_stream_is_trimmed_near_events_maxlen(r: redis.Redis) -> None:
    r.set(LEASE, TOKEN)
    small = Store(r, KEYS, events_maxlen=10)
    total = 0
    for version in range(200):
        evs = [event("message.created", total + j) for j in range(5)]
        total += 5
        assert small.commit(S, str(version), transition(f"{version + 1}-0", evs=evs), LEASE, TOKEN, 1) == 1
    assert total == 1000
    length = r.xlen(KEYS.events(S))
    assert 10 <= length < 200, length
    last = orjson.loads(r.xrevrange(KEYS.events(S), count=1)[0][1][b"event"])
    assert last["n"] == 999  # the newest events are the ones kept

    # the default cap (10,000) keeps all of a small session's events
    default = Store(r, KEYS)
    assert default.events_maxlen == 10_000
    other = "s-other"
    for version in range(30):
        tr = transition(f"{version + 1}-0", evs=[event("message.created", version)], session=other)
        assert default.commit(other, str(version), tr, LEASE, TOKEN, 1) == 1
    assert r.xlen(KEYS.events(other)) == 30


def test_every_session_key_carries_the_hash_tag(r: redis.Redis) -> None:
    keys = Keys("acme")
    r.set(keys.lease(0), TOKEN)
    store = Store(r, keys)
    tr = transition("1-0", messages=[msg(1)], evs=[event("message.created", 1)],
                    effects=[IndexRemove(seq=1, interrupt_id="int-1")], idem="k", created=True)
    assert store.commit("s:1.x-y", "0", tr, keys.lease(0), TOKEN, 1) == COMMITTED
    written = sorted(k.decode() for k in r.keys("*") if k.decode() != keys.lease(0))
    # the session's own keys, and its partition's list of sessions (shard-wide, by prefix)
    assert written == ["acme:partition:0:sessions", "acme:{s:1.x-y}:events", "acme:{s:1.x-y}:idem",
                       "acme:{s:1.x-y}:meta", "acme:{s:1.x-y}:msgs", "acme:{s:1.x-y}:outbox"]
    assert r.zrange(keys.partition_sessions(0), 0, -1) == [b"s:1.x-y"]
    assert store.load("s:1.x-y")[1] == "1"


# ---- many sessions per round trip (the dispatcher's waves) ---------------------------------------


def test_load_many_reads_what_load_reads_in_one_round_trip(store: Store, r: redis.Redis) -> None:
    assert store.commit("s-a", "0", transition("1-0", session="s-a", messages=[msg(1)], idem="k-a"),
                        LEASE, TOKEN, 1) == COMMITTED
    assert store.commit("s-b", "0", transition("2-0", session="s-b"), LEASE, TOKEN, 1) == COMMITTED
    wanted: list[tuple[str, str | None]] = [("s-a", "k-a"), ("s-b", None), ("s-none", "k"), ("s-a-2", None)]
    before = r.info("commandstats")
    many = store.load_many(wanted)
    after = r.info("commandstats")
    assert many == [store.load(s, k) for s, k in wanted]
    assert [v for _state, v in many] == ["1", "1", "0", "0"]
    assert many[0][0].duplicate is True and many[0][0].tree == ["msg-1", -1, 0]
    assert many[2][0].core is None and many[2][0].duplicate is False
    calls = {k: after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after}
    # each meta hash whole (core and shape), never a messages hash
    assert (calls["cmdstat_hgetall"], calls["cmdstat_zscore"]) == (4, 2)
    assert "cmdstat_hmget" not in calls


def test_a_session_stored_before_the_shape_was_kept_is_read_whole_once(store: Store, r: redis.Redis) -> None:
    """docs/design.md, Storage: an older dispatcher's commit wrote no shape; the first load reads
    the messages hash whole, the core builds the shape and the commit stores it; loads after that
    read the meta hash alone."""
    old = transition("1-0", messages=[msg(1), msg(2, 1)])
    old.tree_fields = {}  # what a commit before the shape wrote
    assert store.commit(S, "0", old, LEASE, TOKEN, 1) == COMMITTED
    loaded: list[Any] = []
    calls = calls_of(r, lambda: loaded.append(store.load(S)))
    state, version = loaded[0]
    assert state.tree is None and set(state.messages) == {"msg-1", "msg-2"}
    assert calls["hgetall"] == 2  # the meta hash, then the messages hash (once)
    tx = Tx(state, Context(now_ms=2000, app=AppInfo()), S, owned=True)
    tx.c.head = "msg-1"
    assert store.commit(S, version, tx.result(), LEASE, TOKEN, 1) == COMMITTED
    assert r.hexists(KEYS.meta(S), "tree:0")
    calls = calls_of(r, lambda: loaded.append(store.load(S)))
    assert loaded[1][0].tree == ["msg-1", -1, 0, "msg-2", 0, 1]
    assert loaded[1][0].messages == {} and calls == {"hgetall": 1}


def test_a_shape_left_behind_by_an_older_dispatchers_commits_is_rebuilt(store: Store,
                                                                        r: redis.Redis) -> None:
    """A session whose shape was kept, then given a message by a dispatcher that does not keep
    it (an older binary after a downgrade): its count says 3 messages, its shape 2. The shape is
    not trusted: the messages are read whole and the next commit writes the whole shape again,
    so the new message is found (a walk from it reaches the root)."""
    new = transition("1-0", messages=[msg(1), msg(2, 1)])
    new.state.core.n_msgs = 2  # type: ignore[union-attr]
    assert store.commit(S, "0", new, LEASE, TOKEN, 1) == COMMITTED
    old = transition("2-0", head="msg-3", messages=[msg(3, 2)])
    old.state.core.n_msgs = 3  # type: ignore[union-attr]
    old.tree_fields = {}  # what an older dispatcher's commit writes
    assert store.commit(S, "1", old, LEASE, TOKEN, 1) == COMMITTED
    state, version = store.load(S)
    assert state.tree is None and set(state.messages) == {"msg-1", "msg-2", "msg-3"}
    tx = Tx(state, Context(now_ms=2000, app=AppInfo()), S, owned=True)
    assert list(tx.shape.ancestors("msg-3")) == ["msg-3", "msg-2", "msg-1"]
    assert store.commit(S, version, tx.result(), LEASE, TOKEN, 1) == COMMITTED
    again, _ = store.load(S)
    assert again.tree == ["msg-1", -1, 0, "msg-2", 0, 1, "msg-3", 1, 2] and again.messages == {}


def test_an_unreported_childs_load_reads_its_turns_tips_and_nothing_else(store: Store,
                                                                         r: redis.Redis) -> None:
    child = "p:sub-1"
    tr = transition("1-0", session=child, messages=[msg(1), msg(2, 1), msg(3, 2)])
    assert tr.state.core is not None
    tr.state.core.parent = {"session": "p", "call_id": "call-1", "attempt": 1, "app": "a", "reply_to": "x"}
    tr.state.core.turns = {"msg-1": Turn(id="msg-1", tip="msg-3", replied=True)}
    assert store.commit(child, "0", tr, LEASE, TOKEN, 1) == COMMITTED
    loaded: list[Any] = []
    calls = calls_of(r, lambda: loaded.append(store.load(child)))
    assert loaded[0][0].messages == {"msg-3": msg(3, 2)}
    assert calls == {"hgetall": 1, "hmget": 1}


def test_commit_many_answers_for_each_transition_in_one_pipeline(store: Store, r: redis.Redis) -> None:
    assert store.commit("s-b", "0", transition("1-0", session="s-b"), LEASE, TOKEN, 1) == COMMITTED
    batch = [("s-a", "0", transition("2-0", session="s-a", evs=[event("session.created", 1)])),
             ("s-b", "0", transition("3-0", session="s-b")),  # stale: s-b is at version 1
             ("s-c", "0", transition("4-0", session="s-c", idem="k-c",
                                     effects=[IndexRemove(seq=1, interrupt_id="int-1")]))]
    before = r.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert store.commit_many(batch, LEASE, TOKEN, 1) == [COMMITTED, CONFLICT, COMMITTED]
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] - before == 3
    assert "cmdstat_script|exists" not in r.info("commandstats")  # no SCRIPT EXISTS round trip
    assert r.hget(KEYS.meta("s-a"), "ver") == b"1" and r.xlen(KEYS.events("s-a")) == 1
    assert r.hget(KEYS.meta("s-b"), "ver") == b"1"  # the conflicting one wrote nothing
    assert store.load("s-b")[0].applied == {"parley:inputs": "1-0"}
    assert r.zscore(KEYS.idempotency_keys("s-c"), "k-c") and r.hlen(KEYS.outbox("s-c")) == 1

    # each commit is fenced on its own: without the lease, nothing is written
    r.set(LEASE, "dispatcher-b:9999")
    lost = [("s-d", "0", transition("5-0", session="s-d")), ("s-e", "0", transition("6-0", session="s-e"))]
    assert store.commit_many(lost, LEASE, TOKEN, 1) == [LEASE_LOST, LEASE_LOST]
    assert r.exists(KEYS.meta("s-d"), KEYS.meta("s-e")) == 0


def test_commit_many_loads_the_script_again_after_a_flush(store: Store, r: redis.Redis) -> None:
    """A restarted Redis has no scripts: NOSCRIPT ran nothing, so the commits are sent again."""
    r.script_flush()
    batch = [("s-a", "0", transition("1-0", session="s-a")), ("s-b", "0", transition("2-0", session="s-b"))]
    assert store.commit_many(batch, LEASE, TOKEN, 1) == [COMMITTED, COMMITTED]
    assert r.hget(KEYS.meta("s-a"), "ver") == b"1" and r.hget(KEYS.meta("s-b"), "ver") == b"1"


def test_a_session_is_listed_in_its_own_partition_whatever_stream_its_input_came_on(r: redis.Redis) -> None:
    """A producer's stream of partition P may carry a session of another partition: its keys
    are its own partition's, and so is the list that names it (a move of P must not take it)."""
    from parley.schemas.keys import partition_of

    keys = Keys()
    session = next(f"x-{n}" for n in range(100) if partition_of(f"x-{n}", 4) == 3)
    r.set(keys.lease(1), TOKEN)  # committed by partition 1's holder
    store = Store(r, keys)
    tr = transition("1-0", session=session, created=True)
    assert store.commit(session, "0", tr, keys.lease(1), TOKEN, 4) == COMMITTED
    assert r.zrange(keys.partition_sessions(3), 0, -1) == [session.encode()]
    assert not r.exists(keys.partition_sessions(1))
