"""The `interrupt` action with `timeout_s` and `default` (docs/protocol.md, Actions): past the
deadline, unanswered, the interrupt is resumed with `default` and `timed_out: true` (I9, I11 for
the races)."""

from typing import Any

from parley.dispatcher.core import IndexRemove, effect_to_dict

from .harness import Sim

TIMED: dict[str, Any] = {"timeout_s": 5, "default": {"approved": False}}


def timed_pause() -> tuple[Sim, list[str], str]:
    s = Sim()
    _turn, calls, iid = s.pause_on_tool("send_email", payload={"q": "Send?"}, **TIMED)
    return s, calls, iid


def test_interrupt_with_timeout_records_a_deadline_and_indexes_it():
    s, _calls, iid = timed_pause()
    raised_at = s.ev("interrupt.raised")["at"]
    rec = s.interrupt(iid)
    assert rec.raised_at == raised_at and rec.timeout_s == 5
    assert rec.deadline == raised_at + 5000
    assert rec.default == {"approved": False}
    [fx] = s.index_adds()
    assert effect_to_dict(fx) | {"seq": 0} == {
        "seq": 0, "op": "index_add", "interrupt_id": iid, "reason": "confirm", "anchor": "msg-2",
        "raised_at": raised_at, "deadline": raised_at + 5000, "parent": None, "payload": {"q": "Send?"},
        "default": {"approved": False}, "resumable_by": None, "metadata": None, "response_schema": None}
    # the event tells nothing of the deadline: the contract's fields only
    assert s.ev("interrupt.raised") | {"at": 0} == {
        "type": "interrupt.raised", "at": 0, "interrupt_id": iid, "reason": "confirm",
        "payload": {"q": "Send?"}, "anchor": "msg-2"}


def test_interrupt_with_a_fractional_timeout_gets_a_millisecond_deadline():
    s = Sim()
    s.pause_on_tool("send_email", timeout_s=0.25)
    raised_at = s.ev("interrupt.raised")["at"]
    assert s.index_adds()[0].deadline == raised_at + 250


def test_interrupt_without_timeout_has_no_deadline():
    s = Sim()
    _, _, iid = s.pause_on_tool("send_email")
    assert s.interrupt(iid).deadline is None
    assert s.index_adds()[0].deadline is None
    tr = s.deadline(iid)  # nothing to time out
    assert tr.dropped == "already_resumed" and tr.events == [] and tr.effects == []
    assert iid in s.core.interrupts


def test_I9_deadline_resumes_with_the_default_and_timed_out_true():
    s, calls, iid = timed_pause()
    origin = s.interrupt(iid).origin
    assert origin is not None
    tr = s.deadline(iid)
    assert tr.dropped is None
    assert s.types() == ["interrupt.resumed"]
    assert s.ev("interrupt.resumed") | {"at": 0} == {
        "type": "interrupt.resumed", "at": 0, "interrupt_id": iid, "reason": "confirm",
        "request": {"q": "Send?"}, "payload": {"approved": False}, "delivered": True, "timed_out": True}
    assert [f.op for f in tr.effects] == ["index_remove", "enqueue", "listing"]  # active again
    assert isinstance(tr.effects[0], IndexRemove) and tr.effects[0].interrupt_id == iid
    assert s.trigger == {"type": "interrupt.resumed", "session": "s1", "head": "msg-2",
                         "interrupt_id": iid, "reason": "confirm", "request": {"q": "Send?"},
                         "payload": {"approved": False}, "timed_out": True,
                         "origin": origin.trigger, "call_id": calls[0]}
    assert s.proposed == [{"type": "tool.execute"}]
    assert s.core.interrupts == {} and iid in s.core.resumed
    s.decide([{"type": "tool.error", "error": "not approved in time"}])
    assert s.ev("tool.completed")["error"] == "not approved in time"


def test_I9_deadline_without_default_resumes_with_null_payload():
    s = Sim()
    _, _, iid = s.pause_on_tool("send_email", timeout_s=1)
    s.deadline(iid)
    ev = s.ev("interrupt.resumed")
    assert ev["payload"] is None and ev["timed_out"] is True
    assert s.trigger["payload"] is None and s.trigger["timed_out"] is True


def test_I9_deadline_while_the_turn_is_not_active_is_not_delivered_and_holds_the_origin():
    s, calls, iid = timed_pause()
    s.start("edited", parent=None)  # msg-3: the client left the paused branch
    s.finish_llm(content="other")
    s.decide(expect="llm.completed")
    s.deadline(iid)
    assert s.types() == ["interrupt.resumed", "decision.held"]
    ev = s.ev("interrupt.resumed")
    assert ev["delivered"] is False and ev["timed_out"] is True
    assert ev["payload"] == {"approved": False}
    assert s.held_refs("msg-1") == [("tool.execute", calls[0])]
    assert s.deciding is None and s.enqueued() == []


def test_I11_deadline_after_a_human_resume_is_dropped():
    s, _, iid = timed_pause()
    s.resume(iid, {"approved": True})
    assert s.ev("interrupt.resumed")["timed_out"] is False
    d = s.deciding
    tr = s.deadline(iid)
    assert tr.dropped == "already_resumed"
    assert tr.events == [] and tr.effects == [] and tr.new_messages == []
    assert s.deciding == d and s.trigger["payload"] == {"approved": True}
    assert len(s.of("interrupt.resumed")) == 1


def test_I11_deadline_twice_resumes_once():
    s, _, iid = timed_pause()
    s.deadline(iid)
    tr = s.deadline(iid)
    assert tr.dropped == "already_resumed" and tr.events == [] and tr.effects == []
    assert len(s.of("interrupt.resumed")) == 1


def test_I11_human_resume_after_the_deadline_fired_is_ignored_already_resumed():
    s, _, iid = timed_pause()
    s.deadline(iid)
    tr = s.resume(iid, {"approved": True}, entry_id="9-1")
    assert s.types() == ["input.ignored"]
    assert s.ev("input.ignored") | {"at": 0} == {
        "type": "input.ignored", "at": 0, "code": "already_resumed",
        "input": {"entry": "9-1", "type": "interrupt.resume", "interrupt_id": iid}}
    assert tr.effects == []
    # the decision in flight still has the default
    assert s.trigger["payload"] == {"approved": False} and s.trigger["timed_out"] is True


def test_deadline_for_an_unknown_interrupt_or_session_changes_nothing():
    s, _, iid = timed_pause()
    tr = s.deadline("int-9")
    assert tr.dropped == "already_resumed" and tr.events == [] and iid in s.core.interrupts
    empty = Sim()
    tr = empty.deadline("int-1")
    assert tr.dropped == "no_session" and tr.events == [] and tr.state.core is None
