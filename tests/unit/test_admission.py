"""Admission limits applied by the pure core (docs/protocol.md, "Limits"): messages and
branches per session (`session_full`), and the counts the commit publishes for the submit
function. A *branch* is a leaf of the message tree."""

from typing import Any

import pytest

from parley.dispatcher.core import AdmissionLimits, ToolInfo, admission
from parley.schemas.state import SessionState

from .harness import Sim, make_app


def sim_with(**limits: int) -> Sim:
    return Sim(make_app(has_decide=False), admission=AdmissionLimits(**limits))


def turn(sim: Sim, parent: Any = None, reply: str = "ok") -> str:
    """A client message under `parent` (None: the head) and its model reply; the reply's id."""
    if parent is None:
        sim.send("hi")
    else:
        sim.send("hi", parent)
    sim.finish_llm(content=reply)
    return str(sim.head)


def counts(sim: Sim) -> tuple[int, int]:
    return sim.core.n_msgs, sim.core.n_branches


def refused(sim: Sim) -> dict[str, Any]:
    return sim.ev("input.refused")


# ---- the counts ------------------------------------------------------------------------------


def test_a_conversation_is_one_branch_however_long():
    sim = sim_with()
    for _ in range(3):
        turn(sim)
    assert counts(sim) == (6, 1)


def test_a_new_root_and_a_message_under_one_with_a_child_each_make_a_branch():
    sim = sim_with()
    first = turn(sim)                 # msg-1 -> msg-2
    turn(sim)                         # msg-2 -> msg-3 -> msg-4: still one branch
    assert counts(sim) == (4, 1)
    turn(sim, parent=first)           # under msg-2, which has a child: a fork
    assert counts(sim) == (6, 2)
    sim.send("again", None)           # a new root
    assert counts(sim) == (7, 3)


def test_a_message_under_a_leaf_only_moves_that_branch_end():
    sim = sim_with()
    turn(sim)
    tip = turn(sim, parent=sim.head)
    assert counts(sim) == (4, 1)
    sim.switch("msg-1")
    sim.send("under the leaf", tip)
    assert counts(sim) == (5, 1)


def test_counts_of_a_set_of_messages():
    msgs = [{"id": "a", "parent_id": None}, {"id": "b", "parent_id": "a"},
            {"id": "c", "parent_id": "a"}, {"id": "d", "parent_id": None}]
    assert admission.count(msgs) == admission.Counts(messages=4, branches=3)
    assert admission.count([]) == admission.Counts()


def test_a_session_stored_before_counts_were_kept_is_counted_again_from_its_messages():
    sim = sim_with()
    first = turn(sim)
    turn(sim, parent="msg-1")  # msg-1 had msg-2: a fork
    assert counts(sim) == (4, 2)
    old = sim.core.model_copy(update={"n_msgs": 0, "n_branches": 0})  # as an older commit stored it
    sim.state = SessionState(core=old, messages=sim.state.messages)
    sim.send("more", first)
    assert counts(sim) == (5, 2)


# ---- session_full ----------------------------------------------------------------------------


def test_a_message_in_a_session_at_the_message_limit_is_refused_session_full():
    sim = sim_with(messages=4)
    turn(sim)
    turn(sim)
    before = sim.state
    sim.send("one more")
    no = refused(sim)
    assert no["code"] == "session_full" and "4 messages, the limit is 4" in no["message"]
    assert sim.last is not None and sim.last.input_outcome == ("message.create", "refused", "session_full")
    assert sim.state.messages == before.messages and counts(sim) == (4, 1)


def test_a_fork_beyond_the_branch_limit_is_refused_but_the_branch_goes_on():
    sim = sim_with(branches=2)
    first = turn(sim)
    turn(sim)
    turn(sim, parent=first)  # the second branch
    assert counts(sim)[1] == 2
    sim.send("a third", first)
    assert refused(sim)["code"] == "session_full"
    assert "2 branches, the limit is 2" in refused(sim)["message"]
    sim.send("a new root", None)
    assert refused(sim)["code"] == "session_full"
    sim.send("go on")  # under the head, a leaf: no new branch
    assert sim.types()[0] == "message.created" and counts(sim)[1] == 2


def test_the_engines_messages_finish_the_turn_past_the_message_limit():
    """Only a client's message is refused: a turn in flight (its model reply, its tool calls
    and results) finishes, so a session may end a little past the limit."""
    sim = Sim(make_app(has_decide=False, tools={"search": ToolInfo()}), admission=AdmissionLimits(messages=2))
    sim.send("find it")
    calls = sim.reply_tools("search")
    sim.finish_tool(calls[0])
    sim.finish_llm(content="found")
    assert sim.core.n_msgs == 4 and "turn.completed" in sim.types()
    sim.send("thanks")
    assert refused(sim)["code"] == "session_full"


def test_a_message_refused_for_another_reason_says_that_reason_first():
    sim = sim_with(messages=2)
    turn(sim)
    sim.send("x", "no-such-message")
    assert refused(sim)["code"] == "unknown_parent"


def test_the_first_message_of_a_new_session_always_fits():
    sim = sim_with(messages=1, branches=1)
    sim.send("hi")
    assert sim.types()[:2] == ["session.created", "message.created"]


def test_a_session_create_is_never_refused_by_the_limits():
    sim = sim_with(messages=1, branches=1)
    sim.create()
    assert sim.types() == ["session.created"]


# ---- the limits themselves -------------------------------------------------------------------


def test_the_defaults_and_the_config_fields_the_submit_function_reads():
    limits = AdmissionLimits()
    assert limits.config() == {"limit_input_bytes": 1024 * 1024, "limit_pending": 100,
                               "limit_messages": 10_000, "limit_branches": 1_000}


@pytest.mark.parametrize("bad", [{"messages": 0}, {"branches": -1}, {"pending": 1.5},
                                 {"input_bytes": True}])
def test_a_limit_is_a_whole_number_of_at_least_one(bad: dict[str, Any]):
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        AdmissionLimits(**bad)
