"""Regression tests for bugs fixed in the codec and the machine."""

from typing import Any

import orjson
import pytest

from parley.schemas.codec import InputError, decode_input_entry

from .harness import MALFORMED_REPLIES, Sim

# ---- codec: a non-string input type ------------------------------------------------------------------


@pytest.mark.parametrize("bad_type", [[], {}, ["message.create"], {"a": 1}, 5, None, True])
def test_non_string_input_type_is_an_input_error(bad_type: Any):
    fields = {b"session": b"s-1", b"input": orjson.dumps({"type": bad_type, "interrupt_id": "int-1"})}
    with pytest.raises(InputError) as info:
        decode_input_entry(fields)
    assert "unknown input type" in str(info.value)
    assert info.value.input_type is None  # reported as `type: null`


# ---- one model call after a resume -------------------------------------------------------------------


def test_I4_I10_two_held_completions_and_a_voided_call_give_one_model_call_after_the_resume():
    s = Sim()
    s.start("x")
    c = s.reply_tools("search", "search", "search")
    s.decide()
    s.decide()
    s.decide()
    s.finish_tool(c[0])
    s.decide([{"type": "llm.call"}])  # llm-2, started early
    s.finish_tool(c[1])
    s.decide([{"type": "interrupt", "reason": "r"}])  # voids llm-2
    assert s.ev("llm.voided")["call_id"] == "llm-2"
    s.finish_tool(c[2])  # held; it proposes llm.call (nothing pending)
    [held] = s.held("msg-1")
    assert held.proposed == [{"type": "llm.call"}]
    s.resume("int-1")
    # the held completion proposes the model: the resume does not propose it again
    assert s.proposed == []
    s.decide()
    assert s.ev("decision.released")["trigger"] == {"type": "tool.completed", "call_id": c[2]}
    assert s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.running_llm() == ["llm-3"]
    assert [e["call_id"] for e in s.of("llm.started")] == ["llm-1", "llm-2", "llm-3"]
    assert s.deciding is None and s.held("msg-1") == []


# ---- a decision naming another turn's call ------------------------------------------------------------


def parked_and_live() -> Sim:
    """Turn msg-1 parked by int-1 on call-1, its call-2 waiting (held); a live turn msg-3."""
    s = Sim()
    s.pause_on_tool("send_email", "search")
    assert s.work("call-2").status == "new"
    s.start("b", parent=None)  # msg-3, llm-2
    return s


@pytest.mark.parametrize("action", [
    {"type": "tool.execute", "call_id": "call-2"},
    {"type": "tool.result", "call_id": "call-2", "result": "x"},
    {"type": "tool.error", "call_id": "call-1", "error": "x"},
])
def test_decision_naming_a_call_of_another_parked_turn_fails_and_enqueues_nothing(action):
    s = parked_and_live()
    s.finish_llm("llm-2", content="done")
    tr = s.decide([action], expect="llm.completed")
    assert s.types() == ["decision.failed", "turn.completed"]
    ev = s.ev("decision.failed")
    assert ev["trigger"] == {"type": "llm.completed", "message_id": "msg-4"}
    assert "belongs to another turn" in ev["error"]
    assert tr.effects == [] and tr.new_messages == []
    assert s.work("call-1").status == "new" and s.work("call-2").status == "new"
    assert s.held_refs("msg-1") == [("tool.execute", "call-2")]


def test_tool_execute_naming_another_turns_call_settles_only_its_own_call():
    s = parked_and_live()
    calls = s.reply_tools("search", call_id="llm-2")  # call-3, of msg-3
    s.decide([{"type": "tool.execute", "call_id": "call-2"}], expect="tool.execute")
    assert "belongs to another turn" in s.ev("decision.failed")["error"]
    # docs/protocol.md, Triggers: the trigger's own call is settled decision_failed; call-2 does not run
    assert s.ev("tool.completed")["call_id"] == calls[0]
    assert s.ev("tool.completed")["error"] == "decision_failed"
    assert s.enqueued("tool") == [] and s.enqueued_work("decide") != []
    assert s.of("tool.started") == [] and s.work("call-2").status == "new"


# ---- malformed model responses --------------------------------------------------------------------------


@pytest.mark.parametrize("value", MALFORMED_REPLIES)
def test_malformed_llm_outcome_is_llm_failed_not_a_crash(value: Any):
    s = Sim()
    s.start("x")
    tr = s.finish_llm("llm-1", value=value)
    assert s.types() == ["llm.failed"]
    ev = s.ev("llm.failed")
    assert ev["call_id"] == "llm-1" and ev["head"] == "msg-1"
    assert ev["error"].startswith("invalid model response")
    assert tr.new_messages == [] and s.core.work == {}
    assert s.trigger == {"type": "llm.failed", "session": "s1", "head": "msg-1", "call_id": "llm-1",
                         "error": ev["error"]}
    assert s.proposed == []
    s.decide()
    assert s.ev("turn.completed")["head"] == "msg-1"


# ---- message.create with a parent, on a missing session ----------------------------------------------


def test_message_create_with_a_parent_on_a_missing_session_is_refused_and_creates_nothing():
    s = Sim()
    tr = s.send("hi", parent="msg-7", entry_id="3-1")
    assert s.types() == ["input.refused"]
    ev = s.ev("input.refused")
    assert ev["code"] == "unknown_parent"
    assert ev["input"] == {"entry": "3-1", "type": "message.create", "parent_id": "msg-7"}
    assert s.state.core is None and tr.state.core is None
    assert tr.new_messages == [] and tr.effects == []
    # a later message without a parent creates it as usual
    s.send("hi")
    assert s.types() == ["session.created", "message.created"]
    assert s.ev("message.created")["message"]["id"] == "msg-1"


# ---- found in review ----------------------------------------------------------------------------------


def test_a_tool_execute_decision_that_leaves_its_call_waiting_settles_it_not_executed():
    s = Sim()
    s.start("x")
    [call] = s.reply_tools("search")
    s.decide([{"type": "message", "content": "not now"}])
    done = s.ev("tool.completed")
    assert done["call_id"] == call and done["error"] == "not_executed"
    s.decide()  # tool.completed proposes the model call: the turn goes on
    assert s.running_llm() == ["llm-2"]


def test_tool_result_after_tool_execute_of_the_same_call_is_an_invalid_decision():
    s = Sim()
    s.start("x")
    [call] = s.reply_tools("search")
    s.decide([{"type": "tool.execute"}, {"type": "tool.result", "result": "fake"}])
    assert "not open" in s.ev("decision.failed")["error"]
    assert s.enqueued("tool") == []
    assert s.ev("tool.completed")["call_id"] == call
    assert s.ev("tool.completed")["error"] == "decision_failed"


def test_I4_resume_proposes_the_voided_call_with_its_model_and_params():
    s = Sim()
    s.start("x")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide([{"type": "llm.call", "model": "big", "params": {"t": 0}},
              {"type": "interrupt", "reason": "r"}])
    assert s.of("llm.voided")
    s.resume("int-1")
    assert s.proposed == [{"type": "tool.execute"}, {"type": "llm.call", "model": "big", "params": {"t": 0}}]
    assert calls


def test_I3_budget_raised_again_on_resume_keeps_the_voided_model_call():
    s = Sim()
    s.open_session(budget={"tokens": 100})
    s.start("x")
    c = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(c[0])
    s.decide([{"type": "llm.call"}])
    s.finish_tool(c[1])
    s.decide([{"type": "llm.call"}])
    s.finish_llm("llm-2", value={"content": "r", "usage": {"tokens": 100}})
    s.resume("int-1")  # limit not raised: raised again at once
    assert s.ev("interrupt.raised")["interrupt_id"] == "int-2"
    s.resume("int-2", {"budget": {"tokens": 1000}})
    assert s.proposed == [{"type": "llm.call"}]


def test_I10_a_trigger_held_after_a_bypass_delivery_is_not_decided_while_parked():
    s = Sim()
    s.start("x")
    s.reply_tools("send_email")
    s.decide([{"type": "interrupt", "reason": "confirm"}])
    held = s.interrupt("int-1").origin
    assert held is not None
    s.send("elsewhere", parent=None)  # leave the branch: the resume will not be delivered
    s.settle_decides()
    s.resume("int-1")
    assert all(not item.bypass for item in s.held("msg-1"))


# ---- found by the fuzz run ----------------------------------------------------------------------------


def test_unicode_digits_or_a_huge_ts_are_unauthorized_not_a_crash():
    from parley.schemas.signing import Keyring, Unauthorized

    ring = Keyring({"alice": "k"})
    for ts in ("²", "9" * 5000):
        fields = {b"session": b"s-1", b"input": b"{}", b"id": b"k1", b"principal": b"alice",
                  b"ts": ts.encode(), b"sig": b"00"}
        with pytest.raises(Unauthorized):
            ring.verify(fields, 0)


@pytest.mark.parametrize("value", [
    {"type": "session.create", "budget": {"tokens": "3"}},
    {"type": "session.create", "budget": {"llm_calls": True}},
    {"type": "session.create", "budget": {"tool_calls": 2.0}},
    {"type": "tool.result", "call_id": "call-1", "error": None},
])
def test_inputs_are_typed_strictly(value):
    with pytest.raises(InputError):
        decode_input_entry({b"session": b"s1", b"input": orjson.dumps(value)})


def test_a_session_id_with_a_trailing_newline_is_invalid():
    with pytest.raises(InputError):
        decode_input_entry({b"session": b"s-1\n", b"input": b'{"type": "session.create"}'})


def test_an_entry_id_ahead_of_every_clock_is_told_from_the_ids_redis_makes() -> None:
    from parley.dispatcher.entries import FUTURE_ID_MARGIN_MS, ahead_of_clock

    now = 1_764_000_000_000
    assert not ahead_of_clock(f"{now}-0", now)
    assert not ahead_of_clock(f"{now + FUTURE_ID_MARGIN_MS}-5", now)  # clocks drift: within the margin
    assert ahead_of_clock(f"{now + FUTURE_ID_MARGIN_MS + 1}-0", now)
    assert ahead_of_clock("18446744073709551615-18446744073709551615", now)
    assert not ahead_of_clock("1-1", now)
