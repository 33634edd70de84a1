"""The list of sessions in the pure core (schemas/listing.py; docs/operations.md, "The list of
sessions"): its members and indexed metadata, and the `Listing` effect a transition emits exactly
when the session's listing changed (created, parked, active again, closed), and never otherwise."""

from typing import Any

import pytest

from parley.cli.transcript import format_transcript
from parley.client.inbox import merge
from parley.client.sessions import (
    STATUS_DRIVER,
    SessionFilter,
    bounds,
    choose_driver,
    decode_cursor,
    encode_cursor,
)
from parley.dispatcher.core import AppInfo, Listing, effect_from_dict, effect_to_dict
from parley.dispatcher.core.effects import listing_move
from parley.schemas.keys import Keys
from parley.schemas.listing import (
    MAX_INDEXED_PAIRS,
    MAX_INDEXED_VALUE_CHARS,
    Listed,
    ListingStatus,
    listed,
    listing_entries,
    listing_member,
    metadata_pairs,
    session_of_member,
)
from parley.schemas.state import Core, SessionState
from parley.schemas.view import show

from .harness import Sim, make_app
from .test_subagents import AGENT, close_entry, spawn_entry

ACTIVE, PARKED, CLOSED = ListingStatus.ACTIVE, ListingStatus.PARKED, ListingStatus.CLOSED


def moves(sim: Sim) -> list[Listing]:
    """The listing moves of the last transition."""
    assert sim.last is not None
    return [fx for fx in sim.last.effects if isinstance(fx, Listing)]


def statuses(sim: Sim) -> list[tuple[ListingStatus | None, ListingStatus]]:
    return [(fx.before, fx.after) for fx in moves(sim)]


# ---- members and metadata -------------------------------------------------------------------------

def test_a_member_is_fifteen_digits_of_creation_time_then_the_session_so_byte_order_is_age():
    assert listing_member(1_764_558_000_000, "s-1") == "001764558000000\x1fs-1"
    members = [listing_member(t, s) for t, s in [(20, "a"), (3, "z"), (3, "b"), (100, "a")]]
    assert sorted(members) == [listing_member(3, "b"), listing_member(3, "z"), listing_member(20, "a"),
                               listing_member(100, "a")]
    assert session_of_member(listing_member(7, "p:sub-1")) == "p:sub-1"


def test_only_top_level_scalars_are_indexed_within_their_bounds():
    metadata: dict[str, Any] = {
        "team": "a", "tier": 2, "vip": True, "off": False, "ratio": 0.5, "tags": ["x"], "nested": {"a": 1},
        "none": None, "long": "v" * (MAX_INDEXED_VALUE_CHARS + 1), "k" * 65: "x", "sep": "a\x1fb"}
    assert metadata_pairs(metadata) == [("off", "false"), ("team", "a"), ("tier", "2"), ("vip", "true")]
    many = {f"k{i:02}": i for i in range(MAX_INDEXED_PAIRS + 5)}
    assert len(metadata_pairs(many)) == MAX_INDEXED_PAIRS
    assert metadata_pairs(None) == [] and metadata_pairs({}) == []


def test_the_entries_are_the_status_set_and_one_set_per_indexed_pair():
    keys = Keys("acme")
    core = Core(session="s1", created_at=5, metadata={"team": "a", "tier": 1, "blob": {"x": 1}})
    member = listing_member(5, "s1")
    assert listing_entries(keys, core) == {
        ("acme:sessions:active", member), ("acme:sessions:meta:team\x1fa", member),
        ("acme:sessions:meta:tier\x1f1", member)}
    assert listing_entries(keys, None) == set()
    core.status = "closed"  # type: ignore[assignment]
    assert ("acme:sessions:closed", member) in listing_entries(keys, core)


# ---- the transitions that move a session, and those that do not -----------------------------------

def test_creating_a_session_lists_it_active_under_its_metadata():
    sim = Sim()
    sim.create(metadata={"team": "a", "tier": 2, "blob": [1]})
    [fx] = moves(sim)
    assert (fx.before, fx.after, fx.added, fx.removed) == (None, ACTIVE, (("team", "a"), ("tier", "2")), ())
    assert fx.created_at == sim.core.created_at


def test_an_implicit_creation_by_a_first_message_lists_it_too():
    sim = Sim()
    sim.send("hello")
    assert statuses(sim) == [(None, ACTIVE)]


def test_a_transition_that_changes_nothing_of_the_listing_moves_nothing():
    sim = Sim()
    sim.open_session(metadata={"team": "a"})
    assert moves(sim) == []  # session.created decided
    sim.start("hi")
    assert moves(sim) == []
    sim.finish_llm(content="hello")
    assert moves(sim) == []
    sim.create()  # ignored: session_exists
    assert sim.ev("input.ignored")["code"] == "session_exists" and moves(sim) == []
    sim.switch("nope")  # refused
    assert moves(sim) == []


def test_an_input_refused_before_the_session_exists_lists_nothing():
    sim = Sim()
    sim.resume("int-1")  # no such session: ignored
    assert sim.last is not None and sim.last.state.core is None and moves(sim) == []


def test_an_interrupt_parks_it_a_second_one_changes_nothing_and_the_last_answer_makes_it_active():
    sim = Sim()
    sim.open_session()
    _turn, _calls, first = sim.pause_on_tool("send_email", "search", reason="confirm")
    assert statuses(sim) == [(ACTIVE, PARKED)]
    assert moves(sim)[0].added == () and moves(sim)[0].removed == ()
    # a second question, on another branch: still parked
    sim.send("other", parent=None)
    sim.decide([{"type": "interrupt", "reason": "ask"}], expect="message.created")
    assert len(sim.core.interrupts) == 2 and moves(sim) == []
    sim.resume(first, {"approved": True})
    assert sim.core.interrupts and moves(sim) == []
    sim.settle_decides()
    [second] = list(sim.core.interrupts)
    sim.resume(second)
    assert statuses(sim) == [(PARKED, ACTIVE)]


def test_a_budget_stop_parks_it():
    sim = Sim()
    sim.budget_stopped()
    assert statuses(sim) == [(ACTIVE, PARKED)]


def test_closing_a_parked_session_lists_it_closed():
    sim = Sim(make_app(tools={}), session="p:sub-1", agents={AGENT: AppInfo(has_decide=True)})
    sim.input(spawn_entry(), engine=True)
    assert statuses(sim) == [(None, ACTIVE)]
    sim.decide([{"type": "interrupt", "reason": "ask"}], expect="session.created")
    assert statuses(sim) == [(ACTIVE, PARKED)]
    sim.input(close_entry(), engine=True)
    assert statuses(sim) == [(PARKED, CLOSED)]
    # a closed session ignores a resume and stays where it is
    sim.resume("int-1")
    assert sim.ev("input.ignored")["code"] == "session_closed" and moves(sim) == []


def test_the_move_is_the_last_effect_of_its_transition_with_its_own_seq():
    sim = Sim()
    sim.create(metadata={"team": "a"})
    assert sim.last is not None
    seqs = [fx.seq for fx in sim.last.effects]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert isinstance(sim.last.effects[-1], Listing)


def test_a_move_round_trips_through_the_outbox_json():
    before = Listed("s1", 5, ACTIVE, (("team", "a"), ("tier", "1")))
    after = Listed("s1", 5, PARKED, (("team", "b"), ("tier", "1")))
    fx = listing_move(7, before, after)
    assert (fx.before, fx.after, fx.added, fx.removed) == (ACTIVE, PARKED, (("team", "b"),), (("team", "a"),))
    assert effect_from_dict(effect_to_dict(fx)) == fx
    created = listing_move(1, None, after)
    assert effect_from_dict(effect_to_dict(created)) == created and created.before is None


def test_listed_is_none_before_the_session_exists_and_equal_when_nothing_moved():
    assert listed(None) is None
    core = Core(session="s1", created_at=5, metadata={"a": "b"})
    assert listed(core) == listed(core.model_copy(update={"head": "msg-9"}))


# ---- the read's pure parts (parley/client/sessions.py) ---------------------------------------------

def test_a_filter_checks_its_values_and_says_what_is_wrong():
    assert SessionFilter.of().statuses == (ACTIVE, PARKED, CLOSED)
    assert SessionFilter.of(["closed", "active"]).statuses == (ACTIVE, CLOSED)  # a fixed order
    assert SessionFilter.of("parked").statuses == (PARKED,)
    assert SessionFilter.of(metadata={"tier": 1, "vip": True, "team": "a"}).metadata == (
        ("team", "a"), ("tier", "1"), ("vip", "true"))
    for bad, match in [(dict(status="open"), "unknown session status"),
                       (dict(status=[]), "unknown session status"),
                       (dict(metadata={"tags": ["x"]}), "not indexed"),
                       (dict(metadata={"k": "v" * 200}), "not indexed"),
                       (dict(metadata={"k" * 65: "v"}), "not indexed"),
                       (dict(created_after=-1), "Unix ms"),
                       (dict(created_before="yesterday"), "Unix ms")]:
        with pytest.raises(ValueError, match=match):
            SessionFilter.of(**bad)  # type: ignore[arg-type]


def test_a_row_passes_only_when_its_record_still_matches_every_filter():
    core = Core(session="s1", created_at=100, metadata={"team": "a", "tier": 2})
    assert SessionFilter.of(metadata={"team": "a", "tier": "2"}).matches(core)
    assert not SessionFilter.of(metadata={"team": "b"}).matches(core)
    assert not SessionFilter.of("parked").matches(core)
    assert SessionFilter.of(created_after=99, created_before=101).matches(core)
    assert not SessionFilter.of(created_after=100).matches(core)
    assert not SessionFilter.of(created_before=100).matches(core)


def test_ages_bound_the_range_of_the_time_prefix_and_the_cursor_starts_past_its_member():
    flt = SessionFilter.of(created_after=9, created_before=20)
    assert bounds(flt, None) == ("[000000000000010", "(000000000000020")
    member = listing_member(12, "s")
    assert bounds(flt, member) == ("(" + member, "(000000000000020")
    newest = SessionFilter.of(created_after=9, newest_first=True)
    assert bounds(newest, member) == ("[000000000000010", "(" + member)
    assert bounds(SessionFilter.of(), None) == ("-", "+")


def test_the_smallest_set_drives_a_metadata_listing():
    flt = SessionFilter.of(metadata={"a": "1", "b": "2"})
    assert choose_driver(flt, [50, 10, 0, 0, 0]) == "1"
    assert choose_driver(flt, [5, 10, 0, 0, 0]) == "0"
    # with a status asked for, its set drives when it is smaller than every pair's
    closed = SessionFilter.of("closed", metadata={"a": "1"})
    assert choose_driver(closed, [500, 20]) == STATUS_DRIVER
    assert choose_driver(closed, [5, 20]) == "0"
    assert choose_driver(SessionFilter.of(), []) == STATUS_DRIVER


def test_merged_status_sets_page_in_creation_order_either_way():
    active = [listing_member(t, f"s{t}") for t in (1, 4, 7)]
    parked = [listing_member(t, f"s{t}") for t in (2, 3)]
    assert merge([active, parked], 3) == ([*active[:1], *parked, ][:3], False)
    assert merge([active[::-1], parked[::-1]], 2, reverse=True) == ([active[2], active[1]], False)


def test_a_cursor_round_trips_and_is_refused_when_forged_or_used_with_other_filters():
    flt = SessionFilter.of("active", metadata={"team": "a"})
    text = encode_cursor("0", listing_member(5, "s"), flt)
    later = SessionFilter.of("active", metadata={"team": "a"}, created_before=99)  # ages may move
    assert decode_cursor(text, later) == ("0", listing_member(5, "s"))
    for bad in ("", "!!!", "e30", encode_cursor("7", listing_member(5, "s"), flt),
                encode_cursor("0", "no-separator", flt)):
        with pytest.raises(ValueError, match="invalid cursor"):
            decode_cursor(bad, flt)
    for other in (SessionFilter.of("parked", metadata={"team": "a"}), SessionFilter.of("active"),
                  SessionFilter.of("active", metadata={"team": "a"}, newest_first=True)):
        with pytest.raises(ValueError, match="other filters"):
            decode_cursor(text, other)


# ---- `parley show` says the status -------------------------------------------------------------------

def test_show_says_active_parked_or_closed_and_when_it_closed():
    sim = Sim()
    sim.open_session()
    assert (sim.show()["status"], sim.show()["closed_at"]) == ("active", None)
    sim.pause_on_tool("send_email")
    assert sim.show()["status"] == "parked"
    closed = sim.core.model_copy(update={"status": "closed", "closed_at": 1_764_558_000_000,
                                         "interrupts": {}})
    view = show(SessionState(core=closed, messages=sim.state.messages))
    assert (view["status"], view["closed_at"]) == ("closed", 1_764_558_000_000)
    first = format_transcript(view).splitlines()[0]
    assert "status=closed (at 2025-12-01T03:00:00+00:00)" in first
