"""The planning of a partition move (schemas/moves.py): which keys and shard-wide members are a
partition's (sub-agents with their root, tenants' ids), the tables a move writes and in which
order, the counters' share, and what `repair` does with what a stopped move left."""

import fnmatch

import pytest

from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import listing_member
from parley.schemas.moves import (
    MemberForm,
    Repair,
    RepairStep,
    held_of,
    in_partition,
    parked_of,
    partition_states,
    partition_streams,
    plan_move,
    plan_repair,
    session_key_pattern,
    session_of_job,
    session_of_key,
    session_of_member,
    shared_sets,
)
from parley.schemas.shards import Placement, PlacementError

N = 16
K = Keys("acme:parley")


def test_a_sub_agent_is_in_its_roots_partition() -> None:
    for root in ("s1", "acme/s2", "t/nested"):
        p = partition_of(root, N)
        assert in_partition(f"{root}:sub-1", p, N) and in_partition(f"{root}:sub-1:sub-3", p, N)
        assert not in_partition(root, (p + 1) % N, N)


@pytest.mark.parametrize("session", ["s1", "acme/s1", "acme/s1:sub-2", "a.b-c_d"])
def test_every_session_key_is_found_by_the_pattern_and_names_its_session(session: str) -> None:
    for key in K.session_keys(session):
        assert fnmatch.fnmatchcase(key, session_key_pattern(K))
        assert session_of_key(K, key) == session


@pytest.mark.parametrize("key", [
    "acme:parley:inputs:3", "acme:parley:config", "other:{s1}:meta", "acme:parley:{s1}:nope",
    "acme:parley:{}:meta", "acme:parley:{s1", "acme:parley:sessions:active",
])
def test_keys_that_are_no_sessions_are_left_alone(key: str) -> None:
    assert session_of_key(K, key) is None


def test_the_partitions_streams_include_each_producers() -> None:
    assert partition_streams(K, 3, N, ["web", "batch"]) == [
        "acme:parley:inputs:3", "acme:parley:results:3", "acme:parley:in:batch:3", "acme:parley:in:web:3"]


def test_members_name_their_session_in_each_form() -> None:
    session = "acme/s1:sub-1"
    index = K.index_member(session, "int-1")
    timed = f"{'1' * 15}\x1f{session}\x1fint-1"
    listed = listing_member(1_700_000_000_000, session)
    forms = {s.name: s.form for s in shared_sets(K)}
    assert session_of_member(forms[K.interrupt_index], index) == session
    assert session_of_member(forms[K.deadlines], index) == session
    assert session_of_member(forms[K.interrupt_anchors], f"{session}\x1f") == session  # a global interrupt
    assert session_of_member(forms[K.interrupts_by_session], f"{session}\x1f{'1' * 15}\x1fint-1") == session
    assert session_of_member(forms[K.interrupts_by_time], timed) == session
    assert session_of_member(forms[K.interrupts_reason_prefix + "*"], timed) == session
    assert session_of_member(forms[K.sessions_of_status("*")], listed) == session
    assert session_of_member(forms[K.expiring], session) == session
    assert session_of_member(forms[K.pending("*")], session) == session


@pytest.mark.parametrize(("form", "member"), [
    (MemberForm.SESSION_FIRST, "no-separator"), (MemberForm.SESSION_FIRST, "\x1fint-1"),
    (MemberForm.SESSION_SECOND, "000000000000001"), (MemberForm.SESSION_SECOND, "1\x1f\x1fx"),
    (MemberForm.SESSION, ""),
])
def test_a_member_of_no_known_form_is_nobodys(form: MemberForm, member: str) -> None:
    assert session_of_member(form, member) is None


def test_the_shared_sets_cover_every_set_a_session_has_members_in() -> None:
    names = {s.name for s in shared_sets(K)}
    patterns = [s.name for s in shared_sets(K) if s.pattern]
    expected = [K.interrupt_index, K.interrupt_info, K.interrupt_anchors, K.deadlines,
                K.interrupts_by_session,
                K.interrupts_by_time, K.interrupts_for_anyone, K.interrupts_of_reason("approval"),
                K.interrupts_of_principal("alice"), K.expiring, K.idle, K.sessions_of_status("parked"),
                K.sessions_of_metadata("team", "red"), K.pending("web")]
    for key in expected:
        assert key in names or any(fnmatch.fnmatchcase(key, p) for p in patterns), key


def test_job_records_name_their_session() -> None:
    assert session_of_job(b'{"session": "s1:sub-1", "work": "w"}') == "s1:sub-1"
    assert session_of_job(b"not json") is None and session_of_job(b"[1]") is None
    assert session_of_job(b'{"session": 3}') is None


def test_the_held_share_leaves_out_what_the_outbox_will_add() -> None:
    core = {"turns": {"t1": {"held": [{}, {}]}, "t2": {"held": []}, "t3": {}}}
    assert held_of(core, []) == 2
    assert held_of(core, [{"op": "stat", "field": "held", "delta": 1}, {"op": "enqueue"},
                          {"op": "stat", "field": "other", "delta": 5}]) == 1
    assert held_of(None, []) == 0


def test_the_parked_share_counts_anchors_with_an_open_interrupt() -> None:
    assert parked_of([1, 2, 0, 3]) == 3


def test_a_move_writes_target_first_and_source_last() -> None:
    placement = Placement.default(N, 4)
    plan = plan_move(placement, 5, 3)  # 5 mod 4: on shard 1
    assert (plan.source, plan.target) == (1, 3)
    assert plan.write_order() == [3, 0, 2, 1]
    assert plan.frozen.moving == {5: 3} and not plan.frozen.serves(1, 5) and not plan.frozen.serves(3, 5)
    assert plan.flipped.serves(3, 5) and plan.flipped.version == placement.version + 2


@pytest.mark.parametrize(("partition", "to", "why"), [
    (16, 1, "no partition 16"), (1, 2, "no shard 2"), (1, 1, "already on shard 1"),
])
def test_a_move_that_cannot_be_is_refused_with_why(partition: int, to: int, why: str) -> None:
    with pytest.raises(PlacementError, match=why):
        plan_move(Placement.default(N, 2), partition, to)


def test_a_second_move_of_a_moving_partition_is_refused() -> None:
    with pytest.raises(PlacementError, match="already moving"):
        plan_move(Placement.default(N, 3).freeze(1, 2), 1, 0)


def test_repair_flips_a_copied_move_and_unfreezes_any_other() -> None:
    placement = Placement.default(N, 2).freeze(1, 0).freeze(2, 1)
    assert plan_repair(placement, {1: 0}) == [RepairStep(1, Repair.FLIP, 1, 0),
                                              RepairStep(2, Repair.UNFREEZE, 0, 1)]


def test_repair_cleans_a_flipped_move_whose_source_was_not_cleaned() -> None:
    placement = Placement.default(N, 2).freeze(1, 0).flip(1)
    assert plan_repair(placement, {1: 0}) == [RepairStep(1, Repair.CLEAN, -1, 0)]
    # a mark on a shard the partition is not on: the copy of an undone move, not a flip
    assert plan_repair(Placement.default(N, 2), {1: 0}) == []
    assert plan_repair(Placement.default(N, 2), {}) == []


def test_the_list_says_each_partitions_shard_and_state() -> None:
    states = partition_states(Placement.default(4, 2).freeze(3, 0))
    assert states == [(0, 0, "served"), (1, 1, "served"), (2, 0, "served"), (3, 1, "moving to 0")]


# ---- a partition's members looked up by its sessions ----------------------------------------------

def test_a_sessions_by_session_range_holds_its_members_only() -> None:
    from parley.schemas.moves import by_session_range, interrupt_of_by_session

    low, high = by_session_range("s-1")
    mine, theirs = "s-1\x1f000000000000005\x1fint-1", "s-10\x1f000000000000005\x1fint-1"
    assert low[1:] <= mine < high[1:] and not (low[1:] <= theirs < high[1:])
    assert low.startswith("[") and high.startswith("(")
    assert interrupt_of_by_session(mine) == ("000000000000005", "int-1")
    assert interrupt_of_by_session("s-1\x1f000000000000005") is None


def test_an_interrupts_details_name_the_listing_members_the_lua_writes() -> None:
    from parley.schemas.keys import Keys
    from parley.schemas.moves import Holds, interrupt_candidates, listed_candidates, lua_time

    keys = Keys()
    info = {"session": "s", "interrupt_id": "int-2", "raised_at": 1_700, "reason": "confirm",
            "anchor": "msg-3", "resumable_by": ["alice", "bob"]}
    raised = lua_time(1_700)
    timed = "000000000001700\x1fs\x1fint-2"
    names = {(c.key, c.member) for c in listed_candidates(keys, info, raised)}
    assert names == {(keys.interrupts_by_time, timed), (keys.interrupts_of_reason("confirm"), timed),
                     (keys.interrupts_of_principal("alice"), timed),
                     (keys.interrupts_of_principal("bob"), timed), (keys.interrupt_anchors, "s\x1fmsg-3")}
    anyone = {c.key for c in listed_candidates(keys, {**info, "resumable_by": None, "anchor": None}, raised)}
    assert keys.interrupts_for_anyone in anyone
    assert (keys.interrupt_anchors, "s\x1f") in {(c.key, c.member) for c in listed_candidates(
        keys, {**info, "anchor": None}, raised)}  # a global interrupt: the session's '' anchor
    for nobody in ([], {}):  # an empty list (cjson writes it {}): in no principal's set, not anyone's
        keys_of = {c.key for c in listed_candidates(keys, {**info, "resumable_by": nobody}, raised)}
        assert not any(k.startswith(keys.interrupts_principal_prefix) for k in keys_of)
        assert keys.interrupts_for_anyone not in keys_of
    # details that do not read name their anchor only (the Lua counts it from the session alone)
    assert [(c.key, c.member) for c in listed_candidates(keys, {"session": "s"}, raised)] == [
        (keys.interrupt_anchors, "s\x1f")]
    assert listed_candidates(keys, {"reason": "x"}, raised) == []
    own = interrupt_candidates(keys, "s", "int-2", raised)
    assert [(c.key, c.holds) for c in own] == [
        (keys.interrupt_index, Holds.ZSET), (keys.interrupt_info, Holds.HASH),
        (keys.deadlines, Holds.ZSET), (keys.interrupts_by_session, Holds.ZSET)]
    # rounded as printf's %.0f does, not truncated (a fractional raise time finds its members)
    assert (lua_time(1_700.4), lua_time(1_700.6)) == ("000000000001700", "000000000001701")


def test_a_sessions_record_names_every_status_its_metadata_and_its_sub_agent_timers() -> None:
    from parley.schemas.ids import subagent_deadline
    from parley.schemas.keys import Keys
    from parley.schemas.moves import interrupts_of, session_candidates
    from parley.schemas.state import Core, Interrupt, Work

    keys = Keys()
    core = Core.model_validate({"session": "s", "created_at": 42, "metadata": {"team": "a", "n": 3}})
    core.work["call-1"] = Work.model_validate({"id": "call-1", "kind": "tool", "name": "ask", "deadline": 99,
                                                      "turn": "msg-1"})
    core.work["call-2"] = Work.model_validate({"id": "call-2", "kind": "tool", "name": "pay",
                                               "turn": "msg-1"})
    core.interrupts["int-9"] = Interrupt.model_validate(
        {"id": "int-9", "reason": "r", "anchor": None, "turn": None, "origin": None, "raised_at": 1_234})
    named = {(c.key, c.member) for c in session_candidates(keys, "s", core)}
    member = "000000000000042\x1fs"
    assert {(keys.sessions_of_status(st), member) for st in ("active", "parked", "closed")} <= named
    assert {(keys.sessions_of_metadata("team", "a"), member),
            (keys.sessions_of_metadata("n", "3"), member)} <= named
    assert (keys.deadlines, Keys.index_member("s", subagent_deadline("call-1"))) in named
    assert not any(m.endswith(subagent_deadline("call-2")) for _k, m in named)  # no deadline, no timer
    assert {(keys.expiring, "s"), (keys.idle, "s")} <= named
    assert session_candidates(keys, "s", None) == session_candidates(keys, "s", None)[:2]
    # the interrupts of the index and those of the core not listed yet, each with its time
    listed = ["s\x1f000000000000005\x1fint-1"]
    assert interrupts_of(core, listed) == {"int-1": "000000000000005", "int-9": "000000000001234"}
