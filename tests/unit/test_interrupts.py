"""The interrupt rules I1-I12 (docs/rules.md), on the pure core (parley.dispatcher.core).
Each test's name carries the rule it checks."""

from typing import Any

from parley.dispatcher.core import IndexAdd, interrupts
from parley.dispatcher.core.transition import Tx
from parley.dispatcher.core.turns import finish
from parley.schemas.actions import InterruptAction
from parley.schemas.state import Interrupt

from .harness import Sim

INTERRUPT = {"type": "interrupt", "reason": "confirm"}


def enqueue_turns(s: Sim, tr: Any) -> list[str | None]:
    """The turn (client message id) each enqueue effect of a transition works for."""
    turns: list[str | None] = []
    for f in s.enqueued(tr=tr):
        p = f.args
        if f.job == "decide":
            head = p["trigger"]["head"]
        elif f.job == "llm":
            head = p["chain"][-1]
        else:  # the assistant message that carries the tool call
            head = next(m["id"] for m in s.state.messages.values()
                        if any(c["id"] == f.work for c in m.get("tool_calls") or []))
        turns.append(s.state.messages[head]["turn"] if head else None)
    return turns


def edit_away(s: Sim) -> str:
    """I7: the client edits the first message (a new root) and its turn runs to its end."""
    mid = s.start("edited", parent=None)
    [llm] = [w.id for w in s.core.work.values() if w.kind == "llm" and w.turn == mid]
    s.finish_llm(llm, content="edited answer")
    s.settle_decides()
    assert s.of("turn.completed")[-1]["head"] == s.head
    return mid


# ---- I1 Pausing --------------------------------------------------------------------------------


def test_I1_interrupt_action_opens_an_interrupt_with_reason_payload_and_minted_id():
    s = Sim()
    _turn, calls, iid = s.pause_on_tool("send_email", payload={"message": "Send?"})
    assert iid == "int-1"
    assert s.types() == ["interrupt.raised"]
    assert s.ev("interrupt.raised") | {"at": 0} == {
        "type": "interrupt.raised", "at": 0, "interrupt_id": "int-1", "reason": "confirm",
        "payload": {"message": "Send?"}, "anchor": "msg-2"}
    [fx] = [f for f in s.last.effects if isinstance(f, IndexAdd)]
    assert fx.interrupt_id == "int-1" and fx.anchor == "msg-2" and fx.reason == "confirm"
    view = s.show()
    assert view["parked"] is True
    assert view["interrupts"] == [{"interrupt_id": "int-1", "reason": "confirm",
                                   "payload": {"message": "Send?"}, "anchor": "msg-2",
                                   "status": "open"}]
    # the call is not settled and the turn is not over: it waits for the human
    assert view["pending"] == [{"call_id": calls[0], "kind": "tool", "name": "send_email"}]
    assert s.of("turn.completed") == [] and s.enqueued() == []


def test_I1_app_chosen_interrupt_id_is_kept():
    s = Sim()
    _, _, iid = s.pause_on_tool("send_email", interrupt_id="ask-bob")
    assert iid == "ask-bob" and "ask-bob" in s.core.interrupts
    s.resume("ask-bob", {"ok": True})
    assert s.ev("interrupt.resumed")["interrupt_id"] == "ask-bob"


def test_I1_interrupt_id_already_resumed_is_an_invalid_decision():
    s = Sim()
    _, calls, _ = s.pause_on_tool("send_email", interrupt_id="ask")
    s.resume("ask")
    s.decide([{"type": "interrupt", "reason": "again", "interrupt_id": "ask"}],
             expect="interrupt.resumed")
    assert "already used" in s.ev("decision.failed")["error"]
    assert "interrupt.raised" not in s.types()
    assert s.core.interrupts == {}
    # a failed interrupt.resumed decision settles the origin's call (I9; docs/protocol.md, Triggers)
    assert s.ev("tool.completed")["call_id"] == calls[0]
    assert s.ev("tool.completed")["error"] == "decision_failed"


def test_I1_interrupt_id_open_on_another_branch_is_an_invalid_decision():
    s = Sim()
    s.pause_on_tool("send_email", interrupt_id="ask")
    s.start("b", parent=None)
    s.reply_tools("search")
    s.decide([{"type": "interrupt", "reason": "x", "interrupt_id": "ask"}], expect="tool.execute")
    assert "already used" in s.ev("decision.failed")["error"]
    assert list(s.core.interrupts) == ["ask"]
    assert s.interrupt("ask").anchor == "msg-2"


def test_I1_minted_ids_skip_ids_the_app_chose():
    s = Sim()
    s.pause_on_tool("send_email", interrupt_id="int-1")
    s.resume("int-1")
    s.decide([{"type": "interrupt", "reason": "again"}])
    assert s.ev("interrupt.raised")["interrupt_id"] == "int-2"


# ---- I2 Anchor -----------------------------------------------------------------------------------


def test_I2_anchor_is_the_tip_when_the_decision_is_applied():
    s = Sim()
    s.start("hello")
    s.reply_tools("send_email")
    s.decide([{"type": "message", "content": "I need approval"}, INTERRUPT])
    assert s.types() == ["message.created", "interrupt.raised"]
    assert s.ev("message.created")["message"]["id"] == "msg-3"
    assert s.ev("interrupt.raised")["anchor"] == "msg-3"


def test_I2_parks_the_anchor_and_its_descendants_not_its_ancestors():
    s = Sim()
    s.pause_on_tool("search", "send_email", interrupt_on=1)  # call-1 runs, anchor msg-2
    s.finish_tool("call-1")  # recorded below the anchor (I6)
    assert s.head == "msg-3" and s.show()["parked"] is True
    s.switch("msg-2")
    assert s.ev("branch.switched")["parked"] is True
    s.switch("msg-1")  # above the anchor
    assert s.ev("branch.switched")["parked"] is False and s.show()["parked"] is False


def test_I2_several_interrupts_open_on_different_branches():
    s = Sim()
    s.pause_on_tool("send_email")  # int-1 at msg-2
    s.start("b", parent=None)  # msg-3
    s.reply_tools("send_email")  # msg-4
    s.decide([{"type": "interrupt", "reason": "other"}])
    assert s.ev("interrupt.raised")["anchor"] == "msg-4"
    assert [i["interrupt_id"] for i in s.show()["interrupts"]] == ["int-1", "int-2"]
    s.switch("msg-2")
    assert s.ev("branch.switched")["interrupt_ids"] == ["int-1"]
    s.switch("msg-4")
    assert s.ev("branch.switched")["interrupt_ids"] == ["int-2"]


# ---- I3 Global -----------------------------------------------------------------------------------


def global_with_two_branches() -> Sim:
    """session.create; two roots sent while session.created is being decided; its decision
    raises an interrupt: global, since session.created has no tip."""
    s = Sim()
    s.create()
    s.send("a")  # msg-1
    s.send("b", parent=None)  # msg-2, the active head
    assert s.trigger["type"] == "session.created"
    s.decide([{"type": "interrupt", "reason": "setup", "payload": {"form": "tos"}}])
    return s


def test_I3_interrupt_from_session_created_is_global_and_parks_every_branch():
    s = global_with_two_branches()
    assert s.types() == ["interrupt.raised", "decision.held", "decision.held"]
    assert "anchor" not in s.ev("interrupt.raised")
    held = [e for e in s.last.events if e["type"] == "decision.held"]
    assert [(e["trigger"], e["head"]) for e in held] == [
        ({"type": "message.created", "message_id": "msg-1"}, "msg-1"),
        ({"type": "message.created", "message_id": "msg-2"}, "msg-2")]
    assert s.enqueued() == [] and s.deciding is None
    assert s.show()["parked"] is True and s.show()["interrupts"][0]["anchor"] is None


def test_I3_global_interrupt_refuses_every_message_create_and_parks_every_switch():
    s = global_with_two_branches()
    for parent in (None, "msg-1", "msg-2"):
        s.send("x", parent=parent)
        ev = s.ev("input.refused")
        assert ev["code"] == "branch_parked" and ev["interrupt_ids"] == ["int-1"]
    s.send("x")  # parent omitted
    assert s.ev("input.refused")["code"] == "branch_parked"
    s.switch("msg-1")
    assert s.ev("branch.switched")["parked"] is True
    assert s.ev("branch.switched")["interrupt_ids"] == ["int-1"]
    assert "decision.released" not in s.types()


def test_I3_global_interrupt_on_a_session_without_messages_refuses_a_new_root():
    s = Sim()
    s.create()
    s.decide([{"type": "interrupt", "reason": "setup"}])
    assert s.show()["parked"] is True
    s.send("first")
    ev = s.ev("input.refused")
    assert ev["code"] == "branch_parked" and ev["interrupt_ids"] == ["int-1"]
    assert s.state.messages == {}


def test_I3_I9_I10_global_resume_is_delivered_and_releases_the_active_branch_then_the_other():
    s = global_with_two_branches()
    s.resume("int-1", {"accepted": True})
    ev = s.ev("interrupt.resumed")
    assert ev["delivered"] is True and ev["payload"] == {"accepted": True}
    t = s.trigger
    assert t["type"] == "interrupt.resumed" and t["head"] is None
    assert t["origin"] == {"type": "session.created", "session": "s1", "head": None,
                           "budget": None, "metadata": None}
    assert t["payload"] == {"accepted": True} and t["timed_out"] is False
    assert "call_id" not in t
    assert s.proposed == []
    assert "decision.released" not in s.types()
    s.decide()
    # released right after the resume's decision: only the active branch (msg-2)
    assert s.types() == ["decision.released"]
    assert s.ev("decision.released")["trigger"] == {"type": "message.created", "message_id": "msg-2"}
    assert s.trigger["type"] == "message.created" and s.trigger["message"]["id"] == "msg-2"
    assert s.held_refs("msg-1") == [("message.created", None)]
    s.decide()
    assert s.enqueued_work("llm") == ["llm-1"]
    s.switch("msg-1")
    assert s.ev("branch.switched")["parked"] is False
    assert s.ev("decision.released")["trigger"]["message_id"] == "msg-1"
    assert s.trigger["message"]["id"] == "msg-1" and s.proposed == [{"type": "llm.call"}]
    assert s.held("msg-1") == []


# ---- I4 Voiding ----------------------------------------------------------------------------------


def test_I4_park_voids_llm_calls_of_the_branch_but_not_tools_or_other_branches():
    s = Sim()
    s.start("b")  # msg-1, llm-1: another branch
    s.start("a", parent=None)  # msg-2, llm-2: the client's branch
    calls = s.reply_tools("search", "search", "search", call_id="llm-2")  # msg-3
    for _ in calls:
        s.decide(expect="tool.execute")
    s.finish_tool(calls[0])  # msg-4
    s.decide([{"type": "llm.call"}])  # the app starts the model early: llm-3
    s.finish_tool(calls[1])  # msg-5
    assert s.trigger["pending"] == [calls[2], "llm-3"]
    s.decide([{"type": "interrupt", "reason": "review"}])
    assert s.types() == ["interrupt.raised", "llm.voided"]
    assert s.ev("llm.voided") | {"at": 0} == {"type": "llm.voided", "at": 0, "call_id": "llm-3",
                                              "interrupt_id": "int-1"}
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("llm", "llm-3", 1)]
    assert s.running_llm() == ["llm-1"]  # the other branch's call keeps going
    assert s.work(calls[2]).status == "running"  # the running tool keeps going
    assert s.interrupt("int-1").voided_llm is True
    assert sorted(p["call_id"] for p in s.show()["pending"]) == [calls[2], "llm-1"]
    # the other branch's reply is recorded and decided as usual
    s.finish_llm("llm-1", content="b answer")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-1"
    assert s.trigger["type"] == "llm.completed" and s.trigger["head"] == "msg-6"
    s.decide()
    assert s.ev("turn.completed")["head"] == "msg-6"
    # the tool on the parked branch is recorded (I6)
    s.finish_tool(calls[2])
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    # the voided call's result is never recorded
    tr = s.finish_llm("llm-3", content="late", attempt=1)
    assert tr.dropped == "already_settled" and tr.events == [] and tr.new_messages == []


def _voided_two_calls() -> Sim:
    """Two tool calls; the app starts the model after the first; the second's completion
    raises an interrupt, voiding that LLM call (llm-2)."""
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(calls[0])
    s.decide([{"type": "llm.call"}])
    s.finish_tool(calls[1])
    assert s.proposed == []  # llm-2 is pending
    s.decide([INTERRUPT])
    assert s.ev("llm.voided")["call_id"] == "llm-2"
    return s


def test_I4_voided_llm_result_is_dropped_before_and_after_the_resume():
    s = _voided_two_calls()
    tr = s.finish_llm("llm-2", content="early", attempt=1)
    assert tr.dropped == "already_settled" and tr.new_messages == []
    s.resume("int-1")
    # "go on as if never paused": the origin proposed nothing, plus the voided call
    assert s.trigger["type"] == "interrupt.resumed" and s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.enqueued_work("llm") == ["llm-3"]
    tr = s.finish_llm("llm-2", content="late", attempt=1)
    assert tr.dropped == "already_settled" and tr.events == [] and tr.new_messages == []
    s.finish_llm("llm-3", content="final")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-4"
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-5"
    assert [m["content"] for m in s.show()["messages"] if m["role"] == "assistant"][-1] == "final"


def test_I4_resume_proposes_at_most_one_llm_call():
    s = Sim()
    s.send("hello")
    s.decide()
    # the origin (message.created) proposes llm.call, and the interrupt voids the one just started
    s.decide([{"type": "llm.call"}, INTERRUPT], expect="message.created")
    assert s.types() == ["llm.started", "interrupt.raised", "llm.voided"]
    assert [f.op for f in s.last.effects] == ["enqueue", "index_add", "cancel", "listing"]  # parked
    s.resume("int-1")
    assert s.proposed == [{"type": "llm.call"}]
    assert s.trigger["origin"]["type"] == "message.created"


# ---- I5 Refusal ----------------------------------------------------------------------------------


def test_I5_message_under_parked_branch_is_refused():
    s = Sim()
    s.pause_on_tool("search", "send_email", interrupt_on=1)  # anchor msg-2
    before = dict(s.state.messages)
    tr = s.send("are you there?", entry_id="8-1")  # parent omitted: the head, the anchor
    ev = s.ev("input.refused")
    assert ev["code"] == "branch_parked" and ev["interrupt_ids"] == ["int-1"]
    assert ev["input"] == {"entry": "8-1", "type": "message.create"}
    assert tr.new_messages == [] and tr.effects == [] and s.state.messages == before
    s.send("x", parent="msg-2")
    assert s.ev("input.refused")["code"] == "branch_parked"
    s.finish_tool("call-1")  # msg-3, below the anchor
    s.send("x", parent="msg-3")
    assert s.ev("input.refused")["interrupt_ids"] == ["int-1"]


def test_I5_branch_parked_is_checked_before_turn_in_progress_and_duplicate_id():
    s = Sim()
    s.pause_on_tool("send_email")
    s.send("x", parent="msg-2", message_id="msg-1")  # tip of a running turn, used id
    assert s.ev("input.refused")["code"] == "branch_parked"


def test_I5_unknown_parent_is_checked_before_branch_parked():
    s = global_with_two_branches()
    s.send("x", parent="nope")
    assert s.ev("input.refused")["code"] == "unknown_parent"


# ---- I6 Recording while parked -------------------------------------------------------------------


def test_I6_tool_finishing_while_parked_is_recorded_and_its_follow_on_held():
    s = Sim()
    s.pause_on_tool("search", "send_email", interrupt_on=1)  # call-1 runs; int-1 on call-2
    s.finish_tool("call-1", result="found")
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    assert s.ev("message.created")["message"] == {"id": "msg-3", "parent_id": "msg-2", "role": "tool",
                                                  "content": "found", "tool_call_id": "call-1"}
    assert s.ev("decision.held") | {"at": 0} == {
        "type": "decision.held", "at": 0, "trigger": {"type": "tool.completed", "call_id": "call-1"},
        "head": "msg-3"}
    assert s.enqueued() == [] and s.deciding is None
    [held] = s.held("msg-1")
    assert held.trigger["pending"] == ["call-2"] and held.proposed == []
    assert s.head == "msg-3"  # the head follows the recorded message
    # resume: the origin's call is settled by hand; its completion queues behind the held one
    s.resume("int-1", {"approved": True})
    assert s.trigger["call_id"] == "call-2" and s.proposed == [{"type": "tool.execute"}]
    s.decide([{"type": "tool.result", "result": "sent"}])
    assert s.types() == ["message.created", "tool.completed", "decision.held",
                         "decision.released", "decision.released"]
    released = [e["trigger"]["call_id"] for e in s.last.events if e["type"] == "decision.released"]
    assert released == ["call-1", "call-2"]
    assert s.trigger["call_id"] == "call-1" and s.proposed == []
    s.decide()
    assert s.trigger["call_id"] == "call-2" and s.trigger["pending"] == []
    assert s.proposed == [{"type": "llm.call"}]
    s.decide()
    # exactly one model call after the pause
    assert [e["call_id"] for e in s.of("llm.started")] == ["llm-1", "llm-2"]
    assert s.deciding is None


def test_I6_deferred_tool_result_while_parked_is_recorded_and_held():
    s = Sim()
    s.pause_on_tool("approval", "send_email", interrupt_on=1)  # call-1 deferred
    assert s.work("call-1").status == "deferred"
    s.tool_result("call-1", result={"approved": True})
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    assert s.ev("decision.held")["trigger"] == {"type": "tool.completed", "call_id": "call-1"}
    assert s.enqueued() == []


# ---- I6a Decisions in flight ---------------------------------------------------------------------


def engine_park(s: Sim, turn: str | None, reason: str = "budget") -> None:
    """Park the way the engine itself does (a budget stop, I3/I6a).

    No input sequence leaves a decide job in flight when a branch parks: decisions are one at a
    time and only a decision raises an interrupt (the budget stop is not in the machine yet), so
    this calls the core's own path, `interrupts.raise_interrupt`, with no origin trigger, inside
    one transition committed like any other."""
    ctx = s.ctx()
    tx = Tx(s.state, ctx, s.session)
    interrupts.raise_interrupt(tx, None, tx.c.turns[turn] if turn else None,
                               InterruptAction(reason=reason, payload={"used": 1, "limit": 1}))
    s.commit(finish(tx), ctx)


def test_I6a_decide_in_flight_is_voided_when_a_global_park_happens():
    s = Sim()
    s.send("hello")
    s.decide(expect="session.created")
    d = s.deciding
    assert d is not None and d.item.trigger["type"] == "message.created"
    trigger, work = d.item.trigger, d.work
    engine_park(s, None)
    assert s.types() == ["interrupt.raised", "decision.held"]
    assert s.ev("decision.held")["trigger"] == {"type": "message.created", "message_id": "msg-1"}
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("decide", work, 1)]
    assert s.deciding is None and s.enqueued() == []
    # its decision, arriving late, is dropped unapplied
    tr = s.outcome("decide", work, 1, value={"actions": [{"type": "llm.call"}]})
    assert tr.dropped == "stale_decision" and tr.events == [] and s.running_llm() == []
    s.resume("int-1", {"budget": {"llm_calls": 10}})
    assert s.ev("interrupt.resumed")["delivered"] is True
    s.decide([], expect="interrupt.resumed")
    assert s.ev("decision.released")["trigger"]["message_id"] == "msg-1"
    # delivered again, exactly as it was fired
    assert s.trigger == trigger and s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.enqueued_work("llm") == ["llm-1"]


def test_I6a_decide_in_flight_is_voided_when_its_branch_is_anchored_parked():
    s = Sim()
    s.start("hello")
    s.reply_tools("search", "search")
    d = s.deciding
    assert d is not None and d.item.trigger["call_id"] == "call-1"
    engine_park(s, "msg-1")
    assert s.ev("interrupt.raised")["anchor"] == "msg-2"
    # the one in flight first, then the queued one, in order
    assert [e["trigger"]["call_id"] for e in s.last.events if e["type"] == "decision.held"] == [
        "call-1", "call-2"]
    assert s.cancelled()[0].job == "decide"
    s.resume("int-1")
    assert s.proposed == []  # no origin
    s.decide()
    assert [e["trigger"]["call_id"] for e in s.last.events if e["type"] == "decision.released"] == [
        "call-1", "call-2"]
    assert s.trigger["call_id"] == "call-1" and s.proposed == [{"type": "tool.execute"}]


def test_I6a_worker_may_append_messages_under_its_own_anchor():
    s = Sim()
    s.start("hello")
    s.reply_tools("send_email")
    s.decide([INTERRUPT, {"type": "message", "content": "waiting for approval"}])
    assert s.types() == ["interrupt.raised", "message.created"]
    assert s.ev("interrupt.raised")["anchor"] == "msg-2"
    msg = s.ev("message.created")["message"]
    assert msg == {"id": "msg-3", "parent_id": "msg-2", "role": "assistant",
                   "content": "waiting for approval"}
    assert s.head == "msg-3" and s.show()["parked"] is True
    s.send("ok?")  # only client messages are refused
    assert s.ev("input.refused")["code"] == "branch_parked"


# ---- I7 The rest stays live ----------------------------------------------------------------------


def test_I7_edit_above_the_anchor_dispatches_and_the_interrupt_stays():
    s = Sim()
    s.pause_on_tool("send_email")  # anchor msg-2
    s.send("edited first message", parent=None)
    assert s.types() == ["message.created"]
    assert s.ev("message.created")["message"]["id"] == "msg-3"
    assert s.trigger["type"] == "message.created" and s.trigger["message"]["id"] == "msg-3"
    s.decide()
    assert s.types() == ["llm.started"] and enqueue_turns(s, s.last) == ["msg-3"]
    view = s.show()
    assert view["parked"] is False and view["head"] == "msg-3"
    assert [i["interrupt_id"] for i in view["interrupts"]] == ["int-1"]


def test_I7_fork_from_the_parked_turns_own_message_above_the_anchor_dispatches():
    s = Sim()
    s.pause_on_tool("send_email")  # msg-1 user, msg-2 anchor
    s.send("rephrased", parent="msg-1")
    assert s.types() == ["message.created"] and s.trigger["type"] == "message.created"
    assert "int-1" in s.core.interrupts


# ---- I8 Switching back ---------------------------------------------------------------------------


def test_I8_switch_back_into_parked_branch_reenters_parked_state():
    s = Sim()
    s.pause_on_tool("send_email")
    edit_away(s)
    s.switch("msg-2")
    assert s.ev("branch.switched") | {"at": 0} == {"type": "branch.switched", "at": 0, "head": "msg-2",
                                                   "parked": True, "interrupt_ids": ["int-1"],
                                                   "input": {"entry": "1-3", "type": "branch.switch",
                                                             "head": "msg-2"}}
    assert s.show()["parked"] is True
    s.send("hello?")
    assert s.ev("input.refused")["code"] == "branch_parked"
    # the interrupt is still there to answer, and the turn is active again: delivered
    s.resume("int-1", {"approved": False})
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["type"] == "interrupt.resumed"


def test_I8_switch_to_an_ancestor_of_the_anchor_is_not_parked():
    s = Sim()
    s.pause_on_tool("send_email")
    s.switch("msg-1")
    assert s.ev("branch.switched")["parked"] is False
    assert s.ev("branch.switched")["interrupt_ids"] == []
    # msg-1 is in the interrupt's turn: the turn is still the active one
    s.resume("int-1")
    assert s.ev("interrupt.resumed")["delivered"] is True


# ---- I9 Resume -----------------------------------------------------------------------------------


def test_I9_resume_of_the_active_turn_delivers_interrupt_resumed_at_once():
    s = Sim()
    _, calls, _ = s.pause_on_tool("send_email", payload={"q": "Send?"})
    origin = s.interrupt("int-1").origin
    assert origin is not None
    tr = s.resume("int-1", {"approved": True}, principal="alice", entry_id="2-2")
    assert s.types() == ["interrupt.resumed"]
    assert s.ev("interrupt.resumed") | {"at": 0} == {
        "type": "interrupt.resumed", "at": 0, "interrupt_id": "int-1", "reason": "confirm",
        "request": {"q": "Send?"}, "payload": {"approved": True}, "delivered": True, "timed_out": False,
        "input": {"entry": "2-2", "type": "interrupt.resume", "interrupt_id": "int-1"},
    }  # an unsigned principal is not reported
    assert [f.op for f in tr.effects] == ["index_remove", "enqueue", "listing"]  # active again
    assert s.trigger == {"type": "interrupt.resumed", "session": "s1", "head": "msg-2",
                         "interrupt_id": "int-1", "reason": "confirm", "request": {"q": "Send?"},
                         "payload": {"approved": True}, "timed_out": False,
                         "origin": origin.trigger, "call_id": calls[0]}
    assert origin.trigger["type"] == "tool.execute" and origin.trigger["call_id"] == calls[0]
    assert s.proposed == [{"type": "tool.execute"}]  # the origin's proposed
    assert s.core.interrupts == {} and s.show()["parked"] is False
    s.decide()
    assert s.ev("tool.started")["call_id"] == calls[0]


def test_I9_resume_without_payload_delivers_null_payload():
    s = Sim()
    s.pause_on_tool("send_email")
    s.resume("int-1")
    assert s.ev("interrupt.resumed")["payload"] is None and s.trigger["payload"] is None
    assert "principal" not in s.ev("interrupt.resumed")


def test_I9_tool_result_without_call_id_after_resume_settles_the_origins_call():
    s = Sim()
    _, calls, _ = s.pause_on_tool("search", "send_email", interrupt_on=1)
    s.resume("int-1", {"approved": False})
    s.decide([{"type": "tool.error", "error": "user declined"}])
    assert s.ev("tool.completed")["call_id"] == calls[1]
    assert s.ev("tool.completed")["error"] == "user declined"
    assert s.work(calls[0]).status == "running"


def test_I9_failed_resume_decision_settles_the_origins_call():
    s = Sim()
    _, calls, _ = s.pause_on_tool("send_email")
    s.resume("int-1")
    s.decide_fail("decide crashed")
    assert s.types() == ["decision.failed", "message.created", "tool.completed"]
    assert s.ev("decision.failed")["trigger"] == {"type": "interrupt.resumed", "call_id": calls[0],
                                                  "interrupt_id": "int-1"}
    assert s.ev("tool.completed")["error"] == "decision_failed"
    assert s.trigger["type"] == "tool.completed" and s.proposed == [{"type": "llm.call"}]


def test_I9_resume_while_the_branch_is_not_active_delivers_nothing_and_holds_the_origin():
    s = Sim()
    _, calls, _ = s.pause_on_tool("send_email", "search")  # int-1 on call-1; call-2 held
    assert s.held_refs("msg-1") == [("tool.execute", calls[1])]
    edit_away(s)
    mark = s.mark()
    tr = s.resume("int-1", {"approved": True})
    assert s.types() == ["interrupt.resumed", "decision.held"]
    ev = s.ev("interrupt.resumed")
    assert ev["delivered"] is False and ev["payload"] == {"approved": True}
    assert s.enqueued(tr=tr) == [] and s.deciding is None
    assert s.ev("decision.held") | {"at": 0} == {
        "type": "decision.held", "at": 0, "trigger": {"type": "tool.execute", "call_id": calls[0]},
        "head": "msg-2"}
    # the origin goes back among the held decisions, after those held before
    assert s.held_refs("msg-1") == [("tool.execute", calls[1]), ("tool.execute", calls[0])]
    assert s.core.interrupts == {}
    # the branch is not parked any more, but nothing goes on until it is active again
    s.switch("msg-2")
    assert s.types() == ["branch.switched", "decision.released", "decision.released"]
    assert s.ev("branch.switched")["parked"] is False
    assert [e["trigger"]["call_id"] for e in s.of("decision.released", mark)] == [calls[1], calls[0]]
    assert s.trigger["call_id"] == calls[1]
    s.decide()
    # the origin is decided afresh: exactly as it was fired, without the dropped payload
    assert s.trigger["type"] == "tool.execute" and s.trigger["call_id"] == calls[0]
    assert "payload" not in s.trigger and s.proposed == [{"type": "tool.execute"}]
    s.decide([INTERRUPT])  # typically: asks again
    assert s.ev("interrupt.raised")["interrupt_id"] == "int-2"


def test_I9_not_delivered_origin_keeps_the_voided_llm_call():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "message", "content": "let me check"}, {"type": "llm.call"}, INTERRUPT])
    assert s.ev("llm.voided")["call_id"] == "llm-1"
    edit_away(s)
    s.resume("int-1")
    assert s.ev("interrupt.resumed")["delivered"] is False
    [held] = s.held("msg-1")
    assert held.trigger["type"] == "message.created" and held.proposed == [{"type": "llm.call"}]
    s.switch("msg-2")
    assert s.trigger["type"] == "message.created" and s.proposed == [{"type": "llm.call"}]


def test_I9_resume_of_an_interrupt_whose_turn_is_elsewhere_while_head_is_in_it():
    """Head inside the turn (its client message) counts as the turn being active."""
    s = Sim()
    s.pause_on_tool("send_email")
    edit_away(s)
    s.switch("msg-1")
    s.resume("int-1")
    assert s.ev("interrupt.resumed")["delivered"] is True


# ---- I10 Release ---------------------------------------------------------------------------------


def test_I10_held_triggers_are_released_in_order_right_after_the_resume_decision():
    s = Sim()
    _, calls, _ = s.pause_on_tool("send_email", "search", "search")  # int-1 on call-1
    assert s.types() == ["interrupt.raised", "decision.held", "decision.held"]
    assert s.held_refs("msg-1") == [("tool.execute", calls[1]), ("tool.execute", calls[2])]
    s.resume("int-1")
    assert "decision.released" not in s.types()  # not at the resume: after its decision
    s.decide(expect="interrupt.resumed")
    assert s.types() == ["tool.started", "decision.released", "decision.released"]
    assert [e["trigger"]["call_id"] for e in s.last.events if e["type"] == "decision.released"] == [
        calls[1], calls[2]]
    assert all(e["head"] == "msg-2" for e in s.last.events if e["type"] == "decision.released")
    assert s.held("msg-1") == []
    assert s.settle_decides() == ["tool.execute", "tool.execute"]
    assert [e["call_id"] for e in s.of("tool.started")] == calls


def test_I10_new_triggers_queue_behind_held_ones_even_when_unparked():
    s = Sim()
    _, calls, _ = s.pause_on_tool("search", "send_email", "search", interrupt_on=1)
    # call-1 runs; int-1 on call-2; call-3's tool.execute held
    edit_away(s)
    s.resume("int-1")  # not delivered: call-3, then call-2 (origin) held
    s.finish_tool(calls[0])  # unparked, not active: behind the held ones
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    recorded = s.ev("message.created")["message"]["id"]
    assert s.enqueued() == []
    assert s.held_refs("msg-1") == [("tool.execute", calls[2]), ("tool.execute", calls[1]),
                                    ("tool.completed", calls[0])]
    s.switch(recorded)
    assert s.settle_decides(lambda t, p: [{"type": "tool.result", "result": "x"}]
                            if t["type"] == "tool.execute" else p) == [
        "tool.execute", "tool.execute", "tool.completed", "tool.completed", "tool.completed"]
    # only the last completion proposed the model
    assert [e["call_id"] for e in s.of("llm.started")] == ["llm-1", "llm-2", "llm-3"]


def test_I10_switch_to_a_still_parked_turn_releases_nothing():
    s = Sim()
    s.pause_on_tool("send_email", "search")
    edit_away(s)
    s.switch("msg-2")
    assert s.types() == ["branch.switched"]
    assert s.held_refs("msg-1") == [("tool.execute", "call-2")]


# ---- I11 Stale and duplicate ---------------------------------------------------------------------


def test_I11_resume_of_unknown_interrupt_is_ignored():
    s = Sim()
    s.pause_on_tool("send_email")
    before = s.core
    tr = s.resume("int-7", {"x": 1}, entry_id="6-6")
    assert s.types() == ["input.ignored"]
    ev = s.ev("input.ignored")
    assert ev["code"] == "unknown_interrupt"
    assert ev["input"] == {"entry": "6-6", "type": "interrupt.resume", "interrupt_id": "int-7"}
    assert tr.effects == [] and s.core == before


def test_I11_the_same_resume_applied_twice_delivers_once():
    s = Sim()
    s.pause_on_tool("send_email")
    s.resume("int-1", {"approved": True})
    s.decide()
    tr = s.resume("int-1", {"approved": True})
    assert s.types() == ["input.ignored"] and s.ev("input.ignored")["code"] == "already_resumed"
    assert tr.effects == []
    assert len(s.of("interrupt.resumed")) == 1
    assert [e["call_id"] for e in s.of("tool.started")] == ["call-1"]


def test_I11_resume_on_a_missing_session_is_ignored():
    s = Sim()
    tr = s.resume("int-1")
    assert s.ev("input.ignored")["code"] == "unknown_interrupt" and tr.state.core is None


def test_I11_replayed_resume_entry_is_ignored_duplicate():
    s = Sim()
    s.pause_on_tool("send_email")
    s.resume("int-1", key="k-resume", duplicate=True)
    assert s.ev("input.ignored")["code"] == "duplicate"
    assert "int-1" in s.core.interrupts  # nothing applied


# ---- I12 No compute while parked -----------------------------------------------------------------


def test_I12_parked_branch_queues_no_work():
    s = Sim()
    _, calls, _ = s.pause_on_tool("search", "approval", "send_email", "search", interrupt_on=2)
    start = len(s.transitions) - 1  # the transition that raised the interrupt
    assert s.work(calls[0]).status == "running" and s.work(calls[1]).status == "deferred"
    s.finish_tool(calls[0])
    s.tool_result(calls[1], result="approved")
    s.send("hurry")  # refused
    s.start("another thing", parent=None)  # live branch: its work may run
    s.switch("msg-4")  # back into the parked branch
    s.finish_llm(s.running_llm()[0], content="other answer")
    s.settle_decides()
    s.switch("msg-2")
    turns = [t for tr in s.transitions[start:] for t in enqueue_turns(s, tr)]
    assert turns == ["msg-5", "msg-5", "msg-5"]  # the live branch's decide, LLM call, decide
    assert s.work(calls[2]).status == "new" and s.work(calls[3]).status == "new"
    assert s.held_refs("msg-1") == [("tool.execute", calls[3]), ("tool.completed", calls[0]),
                                    ("tool.completed", calls[1])]
    # once resumed, work goes on
    s.resume("int-1")
    assert enqueue_turns(s, s.last) == ["msg-1"]


# ---- two interrupts on one branch ------------------------------------------------------------------


def two_interrupts() -> Sim:
    """One branch parked by two interrupts, int-1 (anchor msg-2) and int-2 (anchor msg-3).

    No input sequence opens two: the only decisions a parked turn gets are interrupt.resumed,
    whose own interrupt is then cleared. So int-2 is added to the state as if the decision of
    the held tool.completed(call-1) had raised it (its origin), anchored at that turn's tip."""
    s = Sim()
    _, calls, _ = s.pause_on_tool("search", "search", "send_email", interrupt_on=2)
    s.finish_tool(calls[0])  # msg-3; tool.completed(call-1) held
    origin = s.core.turns["msg-1"].held.pop()
    assert origin.trigger["call_id"] == "call-1"
    s.core.interrupts["int-2"] = Interrupt(id="int-2", reason="second", payload=None, anchor="msg-3",
                                           turn="msg-1", origin=origin, raised_at=s.now)
    s.finish_tool(calls[1])  # msg-4; tool.completed(call-2) held
    assert s.held_refs("msg-1") == [("tool.completed", "call-2")]
    assert s.show()["parked"] is True
    return s


def test_I9_I10_two_interrupts_resume_one_then_the_other():
    s = two_interrupts()
    s.resume("int-1", {"approved": True})
    # delivered although int-2 still parks the branch
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["interrupt_id"] == "int-1" and s.proposed == [{"type": "tool.execute"}]
    s.decide([{"type": "tool.result", "result": "sent"}])
    # recorded; its follow-on held; nothing released: the branch is still parked
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    assert s.ev("tool.completed")["call_id"] == "call-3"
    assert s.show()["parked"] is True and [i["interrupt_id"] for i in s.show()["interrupts"]] == ["int-2"]
    s.send("x")
    assert s.ev("input.refused")["interrupt_ids"] == ["int-2"]
    assert s.held_refs("msg-1") == [("tool.completed", "call-2"), ("tool.completed", "call-3")]
    assert s.deciding is None
    s.resume("int-2")
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["origin"]["type"] == "tool.completed" and s.trigger["call_id"] == "call-1"
    assert s.proposed == []  # its origin proposed nothing (call-2 and call-3 were pending)
    s.decide()
    assert [e["trigger"]["call_id"] for e in s.last.events if e["type"] == "decision.released"] == [
        "call-2", "call-3"]
    assert s.trigger["call_id"] == "call-2" and s.proposed == []
    s.decide()
    assert s.trigger["call_id"] == "call-3" and s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert [e["call_id"] for e in s.of("llm.started")] == ["llm-1", "llm-2"]
    assert s.show()["parked"] is False


def test_I12_two_interrupts_a_resume_decision_with_work_is_held_until_the_last_resume():
    s = two_interrupts()
    s.resume("int-1", {"approved": True})
    mark = len(s.transitions)
    s.decide()  # proposed: tool.execute of call-3, but int-2 still parks the branch
    assert s.types() == ["decision.held"]
    assert s.ev("decision.held")["trigger"] == {"type": "interrupt.resumed", "call_id": "call-3",
                                                "interrupt_id": "int-1"}
    assert s.enqueued() == [] and s.work("call-3").status == "new"
    s.resume("int-2")
    s.decide()
    assert [e["trigger"]["type"] for e in s.last.events if e["type"] == "decision.released"] == [
        "tool.completed", "interrupt.resumed"]
    assert s.trigger["call_id"] == "call-2"
    s.decide()
    # decided afresh, exactly as it was fired
    assert s.trigger["type"] == "interrupt.resumed" and s.trigger["payload"] == {"approved": True}
    s.decide()
    assert s.ev("tool.started")["call_id"] == "call-3"
    assert enqueue_turns(s, s.transitions[mark]) == []
