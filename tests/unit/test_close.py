"""A client's `session.close` in the pure core (docs/protocol.md, `session.close`): what closing
stops, what it records, and how a closed session answers what comes after it."""

from typing import Any

import pytest

from parley.dispatcher.core import AppInfo, Close, IndexRemove, Report, Retire, ToolInfo
from parley.schemas.codec import InputError
from parley.schemas.ids import subagent_deadline

from .harness import Sim, make_app
from .test_subagents import AGENT, call_subagent, child_sim, only, parent_sim, spawn_entry


def close(sim: Sim, reason: str | None = None, **kw: Any) -> Any:
    value: dict[str, Any] = {"type": "session.close"}
    if reason is not None:
        value["reason"] = reason
    return sim.input(value, **kw)


def started() -> Sim:
    """A session whose first message's model call is running."""
    sim = Sim(make_app(has_decide=False))
    sim.send("hi")
    assert sim.running_llm() == ["llm-1"]
    return sim


# ---- the close itself ------------------------------------------------------------------------


def test_a_clients_close_says_why_and_who_and_when():
    sim = started()
    close(sim, "misbehaving", entry_id="7-1", signed_by="alice")
    closed = sim.ev("session.closed")
    assert (closed["reason"], closed["principal"]) == ("misbehaving", "alice")
    assert closed["input"] == {"entry": "7-1", "type": "session.close"}
    assert sim.core.status == "closed" and sim.core.closed_at == closed["at"] == sim.now
    assert sim.last.input_outcome == ("session.close", "applied", "")


def test_a_close_without_a_reason_is_closed_and_unsigned_names_no_one():
    sim = started()
    close(sim)
    closed = sim.ev("session.closed")
    # unsigned: no principal written (a null field is left out of the stored event)
    assert closed["reason"] == "closed" and "principal" not in closed and "input" in closed


@pytest.mark.parametrize("reason", ["", "x" * 257, None])
def test_a_reason_is_a_string_of_1_to_256_characters(reason: str | None):
    sim = started()
    with pytest.raises(InputError, match="reason"):
        sim.entry({"type": "session.close", "reason": reason})
    sim.entry({"type": "session.close", "reason": "x" * 256})  # the longest


def test_a_producer_cannot_close_for_a_parent_call():
    sim = started()
    sim.input({"type": "session.close", "reason": "x",
               "parent": {"session": "p", "call_id": "call-1", "attempt": 1}})
    refusal = sim.ev("input.refused")
    assert refusal["code"] == "engine_only" and "parent" in refusal["message"]
    assert sim.core.status == "open"


def test_closing_a_session_that_does_not_exist_is_ignored_and_creates_nothing():
    sim = Sim()
    close(sim, "gone")
    assert sim.ev("input.ignored")["code"] == "unknown_session" and sim.state.core is None


# ---- what closing stops ------------------------------------------------------------------------


def test_a_model_call_in_flight_is_voided_and_its_late_reply_never_applied():
    sim = started()
    close(sim)
    assert [(fx.job, fx.work, fx.attempt) for fx in sim.cancelled()] == [("llm", "llm-1", 1)]
    assert sim.types() == ["session.closed"]  # no turn completes
    assert sim.core.work == {} and sim.core.turns == {}
    sim.finish_llm("llm-1", "a reply", attempt=1)
    assert sim.last.dropped == "session_closed" and sim.last.events == [] and sim.last.new_messages == []
    assert sim.last.counts == {("result_dropped", "session_closed"): 1}


def test_a_decide_in_flight_is_voided_and_its_decision_dropped():
    sim = Sim()
    sim.send("hi")
    deciding = sim.deciding
    assert deciding is not None
    close(sim)
    assert [(fx.job, fx.work) for fx in sim.cancelled()] == [("decide", deciding.work)]
    sim.outcome("decide", deciding.work, deciding.attempt, value={"actions": []})
    assert sim.last.dropped == "session_closed" and sim.last.events == []


def running_tools() -> tuple[Sim, str, str]:
    """A turn with two tool jobs running."""
    sim = Sim(make_app(has_decide=False))
    sim.send("go")
    first, second = sim.reply_tools("search", "send_email")
    return sim, first, second


def test_running_tools_are_cancelled_and_their_results_recorded_late_once_never_applied():
    sim, first, second = running_tools()
    close(sim)
    assert [(fx.job, fx.work) for fx in sim.cancelled()] == [("tool", first), ("tool", second)]
    messages = dict(sim.state.messages)
    sim.finish_tool(first, {"found": 3}, attempt=1)
    assert sim.types() == ["tool.late"]
    late = sim.ev("tool.late")
    assert (late["call_id"], late["name"], late["result"]) == (first, "search", {"found": 3})
    assert "error" not in late
    sim.finish_tool(second, error="smtp down", attempt=1)
    late = sim.ev("tool.late")
    assert (late["call_id"], late["name"], late["error"]) == (second, "send_email", "smtp down")
    assert "result" not in late
    # never applied: no tool message, no trigger, no job, and each is recorded once
    # (the one effect: the archive gets the session again, with the late result in it, at the
    # same closed_at and expiry)
    assert sim.state.messages == messages
    [retire] = sim.last.effects
    assert isinstance(retire, Retire) and (retire.closed_at, retire.expires_at) == (
        sim.core.closed_at, sim.core.closed_at + sim.lifecycle.retention_ms)
    sim.finish_tool(first, "again", attempt=1)
    assert sim.last.events == [] and sim.last.dropped == "session_closed"
    assert sim.core.running_at_close == {}


def test_a_running_tool_whose_worker_dies_after_the_close_is_recorded_late_as_lost_not_retried():
    sim = Sim(make_app(has_decide=False, tools={"search": ToolInfo(idempotent=True)}))
    sim.send("go")
    [call] = sim.reply_tools("search")
    close(sim)
    sim.outcome("tool", call, 1, ok=False, error="worker_lost", lost=True)
    late = sim.ev("tool.late")
    assert (late["call_id"], late["error"]) == (call, "worker_lost")
    # an idempotent tool is not run again for a closed session (the one effect: the archive copy)
    assert [fx.op for fx in sim.last.effects] == ["retire"]
    sim.finish_tool(call, "it finished after all", attempt=1)  # the first word was the last
    assert sim.last.events == []


def test_a_result_of_another_attempt_or_a_call_not_running_is_not_recorded():
    sim, first, _second = running_tools()
    close(sim)
    sim.finish_tool(first, "stale", attempt=2)
    assert sim.last.events == [] and sim.last.dropped == "session_closed"
    sim.finish_tool("call-9", "never made", attempt=1)
    assert sim.last.events == []
    sim.outcome("llm", first, 1, value={"content": "x"})  # the other kind of work
    assert sim.last.events == []


def test_a_deferred_call_is_closed_and_a_later_result_refused():
    sim = Sim(make_app(has_decide=False))
    sim.send("go")
    [call] = sim.reply_tools("approval")
    assert sim.work(call).status == "deferred"
    close(sim)
    assert sim.cancelled() == [] and sim.core.running_at_close == {}  # nothing ran: nothing to cancel
    sim.tool_result(call, result="yes")
    assert sim.ev("input.refused")["code"] == "session_closed"


def test_an_open_interrupt_with_a_deadline_is_cancelled_out_of_the_index_and_never_fires():
    sim = Sim()
    sim.pause_on_tool("send_email", timeout_s=30, default={"approved": False})
    close(sim, "enough")
    cancelled = sim.ev("interrupt.cancelled")
    assert (cancelled["interrupt_id"], cancelled["why"]) == ("int-1", "enough")
    # IndexRemove takes the interrupt out of the index and its deadline out of the deadlines
    assert [fx.interrupt_id for fx in sim.last.effects if isinstance(fx, IndexRemove)] == ["int-1"]
    assert sim.types() == ["interrupt.cancelled", "session.closed"] and sim.core.interrupts == {}
    sim.deadline("int-1")  # posted anyway (a sweep that read the deadline before it went)
    assert sim.last.dropped == "session_closed" and sim.last.events == [] and sim.last.counts == {}
    sim.resume("int-1", {"approved": True})
    assert sim.ev("input.ignored")["code"] == "session_closed"


# ---- after the close -----------------------------------------------------------------------------


def test_later_inputs_are_refused_or_ignored_session_closed():
    sim = started()
    close(sim)
    refused = {"message.create": lambda: sim.send("more"), "branch.switch": lambda: sim.switch("msg-1"),
               "tool.result": lambda: sim.tool_result("call-1", result=1)}
    for kind, send in refused.items():
        send()
        assert sim.ev("input.refused")["code"] == "session_closed", kind
    for send in (lambda: sim.resume("int-1"), lambda: close(sim, "again")):
        send()
        assert sim.ev("input.ignored")["code"] == "session_closed"
    sim.create()
    assert sim.ev("input.ignored")["code"] == "session_exists"
    assert sim.core.status == "closed" and len(sim.of("session.closed")) == 1


# ---- sub-agents --------------------------------------------------------------------------------


def test_closing_a_parent_closes_its_children_and_records_a_report_that_still_comes_as_late():
    sim = parent_sim()
    call = call_subagent(sim)
    child = sim.work(call).child
    close(sim)
    closing = only(sim.last.effects, Close)
    assert (closing.child, closing.call_id, closing.attempt, closing.reason) == (child, call, 1, "abandoned")
    assert subagent_deadline(call) in [getattr(fx, "timer", None) for fx in sim.last.effects]
    sim.outcome("tool", call, 1, ok=True, value="found", source="someone:else")  # not its child
    assert sim.last.events == []
    sim.outcome("tool", call, 1, ok=True, value="found", source=child)
    late = sim.ev("tool.late")
    assert (late["call_id"], late["name"], late["result"]) == (call, "research", "found")


def test_a_client_closing_a_child_fails_its_parents_call_at_once():
    child = child_sim()
    child.input(spawn_entry(), engine=True)
    close(child, "runaway")  # a producer may not write to a child, but may close it
    report = only(child.last.effects, Report)
    assert (report.outcome.session, report.outcome.work, report.outcome.attempt) == ("p", "call-1", 1)
    assert (report.outcome.ok, report.outcome.error, report.outcome.source) == \
        (False, "subagent_closed", "p:sub-1")
    assert child.ev("session.closed")["reason"] == "runaway"
    close(child)  # once
    assert child.last.effects == []
    # the parent's side: its call fails with that error, and its turn goes on
    parent = parent_sim()
    call = call_subagent(parent)
    parent.outcome("tool", call, 1, ok=False, error="subagent_closed", source=parent.work(call).child)
    assert parent.ev("tool.completed")["error"] == "subagent_closed" and parent.enqueued_work("llm")


def test_a_child_that_reported_or_is_closed_by_its_parent_reports_nothing_more():
    reported = Sim(make_app(has_decide=False, tools={}), session="p:sub-1",
                   agents={AGENT: AppInfo(has_decide=False)})
    reported.input(spawn_entry(), engine=True)
    reported.finish_llm("llm-1", "the answer")
    assert only(reported.last.effects, Report).outcome.ok is True
    close(reported)
    assert not [fx for fx in reported.last.effects if isinstance(fx, Report)]
    by_parent = child_sim()
    by_parent.input(spawn_entry(), engine=True)
    by_parent.input({"type": "session.close", "reason": "timeout",
                     "parent": {"session": "p", "call_id": "call-1", "attempt": 1}}, engine=True)
    closed = by_parent.ev("session.closed")
    assert "input" not in closed and "principal" not in closed  # the engine's close
    assert not [fx for fx in by_parent.last.effects if isinstance(fx, Report)]  # nobody waits
