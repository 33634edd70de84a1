"""Rules I3 (budgets: the engine's own global pause; docs/protocol.md, Budgets) and I6a (decisions
in flight when the engine parks) of docs/rules.md, on the pure core. Each test's name carries the
rules it checks."""

from typing import Any

from .harness import Sim, make_app

NO_LIMIT: dict[str, Any] = {"llm_calls": None, "tool_calls": None, "tokens": None}


def budget_payload(used: dict[str, int], limit: dict[str, Any], exceeded: str) -> dict[str, Any]:
    return {"used": {"llm_calls": 0, "tool_calls": 0, "tokens": 0, **used},
            "limit": {**NO_LIMIT, **limit}, "exceeded": exceeded}


def llm_stop() -> Sim:
    """llm_calls=1: one turn runs to its end with one model call; the second client message's
    proposed llm.call is blocked by the budget (int-1)."""
    s = Sim()
    s.open_session(budget={"llm_calls": 1})
    s.start("x")  # msg-1, llm-1
    s.finish_llm(content="a")  # msg-2
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-2"
    s.send("y")  # msg-3
    s.decide(expect="message.created")
    return s


# ---- llm_calls ---------------------------------------------------------------------------------------


def test_I3_llm_calls_budget_blocks_the_second_llm_call_before_it_starts():
    s = llm_stop()
    assert s.types() == ["interrupt.raised"]
    assert s.ev("interrupt.raised") | {"at": 0} == {
        "type": "interrupt.raised", "at": 0, "interrupt_id": "int-1", "reason": "budget",
        "payload": budget_payload({"llm_calls": 1}, {"llm_calls": 1}, "llm_calls")}
    # blocked before it starts: no llm.started, no LLM job, nothing counted
    assert s.enqueued() == [] and s.running_llm() == []
    assert [e["call_id"] for e in s.of("llm.started")] == ["llm-1"]
    assert s.core.used["llm_calls"] == 1
    [fx] = s.index_adds()
    assert fx.interrupt_id == "int-1" and fx.reason == "budget" and fx.anchor is None
    assert fx.deadline is None
    view = s.show()
    assert view["parked"] is True and view["interrupts"][0]["anchor"] is None
    assert view["interrupts"][0]["reason"] == "budget"
    # the turn is not over: it waits for the resume
    assert s.of("turn.completed")[-1]["head"] == "msg-2" and "msg-3" in s.core.turns


def test_I3_budget_resume_with_a_raised_limit_delivers_the_blocked_decision_and_finishes():
    s = llm_stop()
    s.resume("int-1", {"budget": {"llm_calls": 5}})
    assert s.types() == ["interrupt.resumed"]
    assert s.ev("interrupt.resumed") | {"at": 0} == {
        "type": "interrupt.resumed", "at": 0, "interrupt_id": "int-1", "reason": "budget",
        "request": {"used": {"llm_calls": 1, "tool_calls": 0, "tokens": 0},
                    "limit": {"llm_calls": 1, "tool_calls": None, "tokens": None}, "exceeded": "llm_calls"},
        "payload": {"budget": {"llm_calls": 5}}, "delivered": True, "timed_out": False,
        "input": {"entry": "1-4", "type": "interrupt.resume", "interrupt_id": "int-1"}}
    assert s.core.budget == {"llm_calls": 5}
    t = s.trigger
    assert t["type"] == "interrupt.resumed" and t["head"] == "msg-3"
    assert t["origin"]["type"] == "message.created" and t["origin"]["message"]["id"] == "msg-3"
    assert s.proposed == [{"type": "llm.call"}]  # the blocked decision
    s.decide()
    assert s.ev("llm.started") | {"at": 0} == {"type": "llm.started", "at": 0, "call_id": "llm-2",
                                               "head": "msg-3"}
    assert s.enqueued_work("llm") == ["llm-2"]
    s.finish_llm("llm-2", content="b")
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-4"
    assert s.core.used["llm_calls"] == 2
    view = s.show()
    assert view["parked"] is False and view["interrupts"] == [] and view["pending"] == []


def test_I3_blocked_decision_comes_back_whole_as_the_resumes_proposed_and_nothing_of_it_applied():
    s = Sim()
    s.open_session(budget={"llm_calls": 0})
    s.send("x")
    blocked = [{"type": "message", "content": "thinking"}, {"type": "llm.call", "model": "big"}]
    s.decide(blocked, expect="message.created")
    assert s.types() == ["interrupt.raised"]  # the message action is not applied either
    assert s.ev("interrupt.raised")["payload"] == budget_payload({}, {"llm_calls": 0}, "llm_calls")
    assert list(s.state.messages) == ["msg-1"]
    s.resume("int-1", {"budget": {"llm_calls": 1}})
    assert s.proposed == blocked
    s.decide()
    assert s.types() == ["message.created", "llm.started"]
    assert s.ev("llm.started")["head"] == "msg-2"
    assert s.llm_request(s.enqueued("llm")[0])["model"] == "big"


def test_I3_budget_resume_without_raising_the_limit_is_not_delivered_and_raises_again_at_once():
    s = llm_stop()
    tr = s.resume("int-1", {"note": "go on"})
    assert s.types() == ["interrupt.resumed", "interrupt.raised"]
    ev = s.ev("interrupt.resumed")
    assert ev["interrupt_id"] == "int-1" and ev["delivered"] is False and ev["timed_out"] is False
    assert ev["payload"] == {"note": "go on"}
    raised = s.ev("interrupt.raised")
    assert raised["interrupt_id"] == "int-2" and raised["reason"] == "budget"
    assert "anchor" not in raised  # a global interrupt: no anchor, and no null written
    assert raised["payload"] == budget_payload({"llm_calls": 1}, {"llm_calls": 1}, "llm_calls")
    assert [f.op for f in tr.effects] == ["index_remove", "index_add"]
    assert s.enqueued() == [] and s.deciding is None and s.running_llm() == []
    assert list(s.core.interrupts) == ["int-2"] and s.core.budget == {"llm_calls": 1}
    # the blocked decision is kept for the next resume
    rec = s.interrupt("int-2")
    assert rec.origin is not None and rec.origin.proposed == [{"type": "llm.call"}]
    s.resume("int-2", {"budget": {"llm_calls": 2}})
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["interrupt_id"] == "int-2" and s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.enqueued_work("llm") == ["llm-2"]


def test_I3_budget_resume_raising_another_limit_only_raises_again():
    s = llm_stop()
    s.resume("int-1", {"budget": {"tool_calls": 9, "tokens": 1000}})
    assert s.types() == ["interrupt.resumed", "interrupt.raised"]
    assert s.ev("interrupt.resumed")["delivered"] is False
    assert s.core.budget == {"llm_calls": 1, "tool_calls": 9, "tokens": 1000}
    assert s.ev("interrupt.raised")["payload"] == budget_payload(
        {"llm_calls": 1}, {"llm_calls": 1, "tool_calls": 9, "tokens": 1000}, "llm_calls")


def test_I3_budget_interrupt_refuses_every_message_create_a_new_root_included():
    s = llm_stop()
    before = dict(s.state.messages)
    for parent in (None, "msg-1", "msg-2", "msg-3"):
        tr = s.send("more", parent=parent)
        ev = s.ev("input.refused")
        assert ev["code"] == "branch_parked" and ev["interrupt_ids"] == ["int-1"]
        assert tr.new_messages == [] and tr.effects == []
    s.send("more")  # parent omitted: the active head
    assert s.ev("input.refused")["interrupt_ids"] == ["int-1"]
    assert s.state.messages == before
    s.switch("msg-1")
    assert s.ev("branch.switched")["parked"] is True
    assert s.ev("branch.switched")["interrupt_ids"] == ["int-1"]


# ---- tool_calls ----------------------------------------------------------------------------------------


def tool_stop() -> tuple[Sim, list[str]]:
    """tool_calls=1: call-1 runs; the tool.execute of call-2 is blocked by the budget."""
    s = Sim()
    s.open_session(budget={"tool_calls": 1})
    s.start("x")
    calls = s.reply_tools("search", "search")
    s.decide(expect="tool.execute")
    assert s.ev("tool.started")["call_id"] == calls[0]
    assert s.trigger["call_id"] == calls[1]
    s.decide(expect="tool.execute")
    return s, calls


def test_I3_tool_calls_budget_blocks_tool_execute_before_it_starts():
    s, calls = tool_stop()
    assert s.types() == ["interrupt.raised"]
    ev = s.ev("interrupt.raised")
    assert ev["reason"] == "budget" and "anchor" not in ev
    assert ev["payload"] == budget_payload({"llm_calls": 1, "tool_calls": 1}, {"tool_calls": 1},
                                           "tool_calls")
    assert s.enqueued() == []
    assert [e["call_id"] for e in s.of("tool.started")] == [calls[0]]
    assert s.work(calls[1]).status == "new"
    assert s.work(calls[0]).status == "running"  # a tool already running keeps going (I4)
    # it is recorded when it ends; its follow-on is held (I6)
    s.finish_tool(calls[0], result="found")
    assert s.types() == ["message.created", "tool.completed", "decision.held"]
    assert s.ev("decision.held")["trigger"] == {"type": "tool.completed", "call_id": calls[0]}
    assert s.enqueued() == []


def test_I3_I10_tool_calls_budget_resume_runs_the_blocked_call_then_releases_the_held():
    s, calls = tool_stop()
    s.finish_tool(calls[0], result="found")  # msg-3, held
    s.resume("int-1", {"budget": {"tool_calls": 3}})
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["type"] == "interrupt.resumed" and s.trigger["call_id"] == calls[1]
    assert s.trigger["origin"]["type"] == "tool.execute"
    assert s.proposed == [{"type": "tool.execute"}]
    s.decide()
    assert s.types() == ["tool.started", "decision.released"]
    assert s.ev("tool.started")["call_id"] == calls[1]
    assert s.ev("decision.released")["trigger"] == {"type": "tool.completed", "call_id": calls[0]}
    assert s.enqueued_work("tool") == [calls[1]]
    assert s.trigger["call_id"] == calls[0] and s.proposed == []  # calls[1] still pending then
    s.decide()
    s.finish_tool(calls[1])
    assert s.proposed == [{"type": "llm.call"}]
    s.decide()
    s.finish_llm(content="end")
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-5"
    assert s.core.used == {"llm_calls": 2, "tool_calls": 2}


def test_I3_tool_calls_budget_resume_without_raising_the_limit_raises_again():
    s, calls = tool_stop()
    s.resume("int-1", {"budget": {"llm_calls": 10}})
    assert s.types() == ["interrupt.resumed", "interrupt.raised"]
    assert s.ev("interrupt.resumed")["delivered"] is False
    assert s.ev("interrupt.raised")["payload"]["exceeded"] == "tool_calls"
    assert s.enqueued() == [] and s.work(calls[1]).status == "new"


# ---- tokens --------------------------------------------------------------------------------------------


def test_I3_I6_tokens_reaching_the_limit_records_the_reply_and_holds_its_follow_ons():
    s = Sim()
    s.open_session(budget={"tokens": 100})
    s.start("x")
    s.finish_llm(value={"content": "c", "tool_calls": [{"id": "m", "name": "search", "arguments": {}}],
                        "usage": {"tokens": 100}})
    assert s.types() == ["message.created", "llm.completed", "interrupt.raised", "decision.held"]
    msg = s.ev("message.created")["message"]
    assert msg == {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "c",
                   "tool_calls": [{"id": "call-1", "name": "search", "arguments": {}}]}
    ev = s.ev("interrupt.raised")
    assert ev["interrupt_id"] == "int-1" and "anchor" not in ev and ev["reason"] == "budget"
    assert ev["payload"] == budget_payload({"llm_calls": 1, "tokens": 100}, {"tokens": 100}, "tokens")
    assert s.ev("decision.held") | {"at": 0} == {
        "type": "decision.held", "at": 0, "trigger": {"type": "tool.execute", "call_id": "call-1"},
        "head": "msg-2"}
    assert s.enqueued() == [] and s.deciding is None
    assert s.held_refs("msg-1") == [("tool.execute", "call-1")]
    # a resume that leaves the tokens spent raises again
    s.resume("int-1", {"budget": {"tokens": 100}})
    assert s.types() == ["interrupt.resumed", "interrupt.raised"]
    assert s.ev("interrupt.resumed")["delivered"] is False
    assert s.ev("interrupt.raised")["payload"]["exceeded"] == "tokens"
    assert s.held_refs("msg-1") == [("tool.execute", "call-1")]
    # a higher limit releases the held follow-on, right after the resume's decision
    s.resume("int-2", {"budget": {"tokens": 1000}})
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["type"] == "interrupt.resumed" and s.trigger["head"] == "msg-2"
    assert s.trigger["origin"] is None and s.proposed == []
    assert "decision.released" not in s.types()
    s.decide()
    assert s.types() == ["decision.released"]
    assert s.ev("decision.released")["trigger"] == {"type": "tool.execute", "call_id": "call-1"}
    assert s.trigger["type"] == "tool.execute" and s.trigger["call_id"] == "call-1"
    s.decide()
    assert s.ev("tool.started")["call_id"] == "call-1"
    assert s.held("msg-1") == []


def test_I3_tokens_reply_without_tool_calls_holds_llm_completed_until_the_resume():
    s = Sim()
    s.open_session(budget={"tokens": 50})
    s.start("x")
    s.finish_llm(value={"content": "long", "usage": {"tokens": 80}})
    assert s.types() == ["message.created", "llm.completed", "interrupt.raised", "decision.held"]
    assert s.ev("decision.held")["trigger"] == {"type": "llm.completed", "message_id": "msg-2"}
    assert s.core.used["tokens"] == 80
    assert s.of("turn.completed") == []
    s.resume("int-1", {"budget": {"tokens": 500}})
    s.decide(expect="interrupt.resumed")
    assert s.ev("decision.released")["trigger"] == {"type": "llm.completed", "message_id": "msg-2"}
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-2"
    assert s.show()["parked"] is False


def test_I3_tokens_below_the_limit_do_not_stop():
    s = Sim()
    s.open_session(budget={"tokens": 100})
    s.start("x")
    s.finish_llm(value={"content": "a", "usage": {"tokens": 99}})
    assert "interrupt.raised" not in s.types()
    s.decide(expect="llm.completed")
    s.start("y")
    assert s.enqueued_work("llm") == ["llm-2"]  # 99 < 100: the model may still be called
    s.finish_llm(value={"content": "b", "usage": {"tokens": 1}})
    assert s.ev("interrupt.raised")["payload"]["used"]["tokens"] == 100


def test_I3_a_spent_tokens_budget_blocks_the_next_llm_call_before_it_starts():
    s = Sim()
    s.open_session(budget={"tokens": 0})
    s.send("x")
    s.decide(expect="message.created")
    assert s.types() == ["interrupt.raised"]
    assert s.ev("interrupt.raised")["payload"] == budget_payload({}, {"tokens": 0}, "tokens")
    assert s.enqueued() == [] and s.of("llm.started") == []
    s.resume("int-1", {"budget": {"tokens": 10}})
    assert s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.ev("llm.started")["call_id"] == "llm-1"

def test_I3_I4_tokens_stop_voids_a_call_of_the_same_turn_and_the_resume_proposes_it_again():
    s = Sim()
    s.open_session(budget={"tokens": 100})
    s.start("x")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(calls[0])
    s.decide([{"type": "llm.call"}])  # llm-2
    s.finish_tool(calls[1])
    s.decide([{"type": "llm.call"}])  # llm-3
    assert s.running_llm() == ["llm-2", "llm-3"]
    s.finish_llm("llm-2", value={"content": "r", "usage": {"tokens": 100}})
    assert s.types() == ["message.created", "llm.completed", "interrupt.raised", "llm.voided",
                         "decision.held"]
    assert s.ev("llm.voided")["call_id"] == "llm-3"
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("llm", "llm-3", 1)]
    s.resume("int-1", {"budget": {"tokens": 1000}})
    assert s.proposed == [{"type": "llm.call"}]  # "go on as if never paused"
    s.decide()
    assert s.enqueued_work("llm") == ["llm-4"]


# ---- a global park across branches (I4, I6a) ---------------------------------------------------------


def test_I3_I4_budget_stop_voids_llm_calls_of_other_branches_whose_triggers_are_held_then_released():
    s = Sim()
    s.open_session(budget={"llm_calls": 2})
    b = s.start("b")  # msg-1, llm-1: another branch
    a = s.start("a", parent=None)  # msg-2, llm-2: the active branch
    assert (a, b) == ("msg-2", "msg-1") and s.running_llm() == ["llm-1", "llm-2"]
    calls = s.reply_tools("search", call_id="llm-2")  # msg-3
    s.decide(expect="tool.execute")
    s.finish_tool(calls[0])  # msg-4
    assert s.proposed == [{"type": "llm.call"}]
    s.decide(expect="tool.completed")  # blocked: llm_calls 2 + 1 > 2
    assert s.types() == ["interrupt.raised", "llm.voided", "decision.held"]
    assert s.ev("interrupt.raised")["payload"]["exceeded"] == "llm_calls"
    assert s.ev("llm.voided") | {"at": 0} == {"type": "llm.voided", "at": 0, "call_id": "llm-1",
                                              "interrupt_id": "int-1"}
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("llm", "llm-1", 1)]
    assert s.ev("decision.held") | {"at": 0} == {
        "type": "decision.held", "at": 0,
        "trigger": {"type": "message.created", "message_id": "msg-1"}, "head": "msg-1"}
    assert s.held_refs(b) == [("message.created", None)]
    assert s.running_llm() == [] and s.enqueued() == []
    # the voided call's result is never recorded
    tr = s.finish_llm("llm-1", content="late", attempt=1)
    assert tr.dropped == "already_settled" and tr.events == [] and tr.new_messages == []
    # the resume goes to the blocked decision's turn (the active one)
    s.resume("int-1", {"budget": {"llm_calls": 10}})
    assert s.ev("interrupt.resumed")["delivered"] is True
    assert s.trigger["head"] == "msg-4" and s.trigger["call_id"] == calls[0]
    assert s.proposed == [{"type": "llm.call"}]  # the other branch's call is not proposed here
    s.decide()
    assert s.types() == ["llm.started"]  # b is not active: its trigger stays held
    assert s.ev("llm.started") | {"at": 0} == {"type": "llm.started", "at": 0, "call_id": "llm-3",
                                               "head": "msg-4"}
    assert s.held_refs(b) == [("message.created", None)]
    # not stranded: released once the branch is active
    s.switch(b)
    assert s.types() == ["branch.switched", "decision.released"]
    assert s.ev("branch.switched")["parked"] is False
    assert s.ev("decision.released")["trigger"] == {"type": "message.created", "message_id": "msg-1"}
    assert s.trigger["type"] == "message.created" and s.trigger["message"]["id"] == "msg-1"
    assert s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.ev("llm.started") | {"at": 0} == {"type": "llm.started", "at": 0, "call_id": "llm-4",
                                               "head": "msg-1"}
    assert s.held(b) == []


def test_I3_I4_inline_blocked_decision_voids_the_other_branchs_llm_call_in_the_same_transition():
    # only tool.execute runs decide: tool.completed's proposed llm.call is applied at once
    s = Sim(app=make_app(decide_on={"tool.execute"}))
    s.create(budget={"llm_calls": 2})
    s.send("b")  # msg-1, llm-1
    s.send("a", parent=None)  # msg-2, llm-2
    assert s.running_llm() == ["llm-1", "llm-2"] and s.deciding is None
    calls = s.reply_tools("search", call_id="llm-2")
    s.decide(expect="tool.execute")
    s.finish_tool(calls[0])
    assert s.types() == ["message.created", "tool.completed", "interrupt.raised", "llm.voided",
                         "decision.held"]
    assert s.ev("llm.voided")["call_id"] == "llm-1"
    assert s.ev("decision.held")["trigger"] == {"type": "message.created", "message_id": "msg-1"}
    assert s.enqueued() == [] and s.running_llm() == []
    rec = s.interrupt("int-1")
    assert rec.anchor is None and rec.turn == "msg-2" and rec.voided_llm is False
    assert rec.origin is not None and rec.origin.trigger["type"] == "tool.completed"
    s.resume("int-1", {"budget": {"llm_calls": 4}})  # applied at once, no decide job
    assert s.types() == ["interrupt.resumed", "llm.started"]
    assert s.ev("llm.started")["head"] == "msg-4"
    s.switch("msg-1")
    assert s.types() == ["branch.switched", "decision.released", "llm.started"]
    assert s.ev("llm.started")["head"] == "msg-1"
    assert s.running_llm() == ["llm-3", "llm-4"]


def test_I6a_tokens_stop_voids_the_decide_in_flight_of_another_branch_and_holds_its_trigger():
    s = Sim()
    s.open_session(budget={"tokens": 100})
    b = s.start("b")  # msg-1, llm-1
    a = s.start("a", parent=None)  # msg-2, llm-2: the active branch
    s.reply_tools("search", call_id="llm-1")  # b: msg-3, call-1; its tool.execute is being decided
    d = s.deciding
    assert d is not None and d.item.turn == b and d.item.trigger["call_id"] == "call-1"
    trigger, work = d.item.trigger, d.work
    s.finish_llm("llm-2", value={"content": "big", "usage": {"tokens": 150}})  # a: msg-4
    assert s.types() == ["message.created", "llm.completed", "interrupt.raised", "decision.held",
                         "decision.held"]
    held = [(e["trigger"], e["head"]) for e in s.last.events if e["type"] == "decision.held"]
    assert held == [({"type": "tool.execute", "call_id": "call-1"}, "msg-3"),
                    ({"type": "llm.completed", "message_id": "msg-4"}, "msg-4")]
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("decide", work, 1)]
    assert s.deciding is None and s.enqueued() == []
    # the voided decision, arriving late, is dropped unapplied
    tr = s.outcome("decide", work, 1, value={"actions": [{"type": "tool.execute"}]})
    assert tr.dropped == "stale_decision" and tr.events == [] and tr.effects == []
    assert s.work("call-1").status == "new"
    s.resume("int-1", {"budget": {"tokens": 1000}})
    assert s.trigger["type"] == "interrupt.resumed" and s.trigger["head"] == "msg-4"
    s.decide()
    assert s.types() == ["decision.released"]  # a's only: b is not active
    assert s.ev("decision.released")["trigger"] == {"type": "llm.completed", "message_id": "msg-4"}
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-4" and a not in s.core.turns
    assert s.held_refs(b) == [("tool.execute", "call-1")]
    s.switch("msg-3")
    assert s.ev("decision.released")["trigger"] == {"type": "tool.execute", "call_id": "call-1"}
    assert s.trigger == trigger and s.proposed == [{"type": "tool.execute"}]  # exactly as fired
    s.decide()
    assert s.ev("tool.started")["call_id"] == "call-1"


def test_I6a_budget_raised_again_on_resume_voids_an_interrupt_resumed_decide_in_flight():
    s = Sim()
    s.open_session(budget={"llm_calls": 2})
    s.start("a")  # msg-1, llm-1
    calls = s.reply_tools("send_email")  # msg-2
    s.decide([{"type": "interrupt", "reason": "confirm"}])  # int-1, anchored at msg-2
    s.start("b", parent=None)  # msg-3, llm-2
    s.finish_llm("llm-2", content="b done")  # msg-4
    s.decide(expect="llm.completed")
    s.send("more")  # msg-5
    s.decide(expect="message.created")  # blocked: int-2, global
    assert s.ev("interrupt.raised")["interrupt_id"] == "int-2"
    s.switch("msg-2")
    assert s.ev("branch.switched")["interrupt_ids"] == ["int-2", "int-1"]
    s.resume("int-1", {"approved": True})  # delivered (I9) although int-2 parks the branch
    d = s.deciding
    assert d is not None and d.item.trigger["interrupt_id"] == "int-1"
    trigger, work = d.item.trigger, d.work
    # resuming the budget without raising it: the engine parks again at once
    s.resume("int-2")
    assert s.types() == ["interrupt.resumed", "interrupt.raised", "decision.held"]
    assert s.ev("interrupt.raised")["interrupt_id"] == "int-3"
    assert s.ev("decision.held") | {"at": 0} == {
        "type": "decision.held", "at": 0, "head": "msg-2",
        "trigger": {"type": "interrupt.resumed", "call_id": calls[0], "interrupt_id": "int-1"}}
    assert [(f.job, f.work, f.attempt) for f in s.cancelled()] == [("decide", work, 1)]
    assert s.deciding is None
    tr = s.outcome("decide", work, 1, value={"actions": [{"type": "tool.execute"}]})
    assert tr.dropped == "stale_decision" and s.work(calls[0]).status == "new"
    s.resume("int-3", {"budget": {"llm_calls": 9}})
    assert s.trigger["interrupt_id"] == "int-3" and s.trigger["head"] == "msg-5"
    s.decide()
    assert s.types() == ["llm.started", "decision.released"]
    assert s.ev("llm.started")["head"] == "msg-5"
    # delivered again exactly as it was fired, with the human's payload
    assert s.trigger == trigger and s.trigger["payload"] == {"approved": True}
    s.decide()
    assert s.ev("tool.started")["call_id"] == calls[0]
