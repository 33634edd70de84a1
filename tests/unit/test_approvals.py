"""Approvals the engine enforces (docs/protocol.md, "Approvals"), on the pure core: a call of a
tool with `needs_approval` runs only after the engine's own question about that call, bound to
the digest of its arguments, was answered yes by an allowed principal, once. Whatever decides
(the app, its proposed actions, a forged outcome) can ask to run it; nothing but that answer
lets it run."""

from typing import Any

import pytest

from parley.dispatcher.core import ToolInfo
from parley.schemas.approvals import (
    DEFAULT_RESPONSE_SCHEMA,
    ApprovalPolicy,
    PolicyError,
    call_digest,
    parse_policy,
)

from .harness import TOOLS, Sim, make_app

PAY = {"to": "acme", "amount": 120}
APPROVERS = ApprovalPolicy(approvers=("alice", "bob"))


def sim(policy: ApprovalPolicy = APPROVERS, decide_on: set[str] | None = None) -> Sim:
    """An app with a gated `pay` beside the harness's tools; `decide_on`: None, no decide."""
    tools = dict(TOOLS, pay=ToolInfo(approval=policy))
    app = make_app(has_decide=decide_on is not None, decide_on=decide_on or set(), tools=tools)
    return Sim(app)


def model_asks(s: Sim, *calls: tuple[str, dict[str, Any]]) -> list[str]:
    """A turn whose model reply asks for `calls` (name, arguments): their call ids."""
    s.start("pay acme")
    s.finish_llm(tool_calls=[{"name": n, "arguments": a} for n, a in calls])
    return [c["id"] for c in s.ev("message.created")["message"]["tool_calls"]]


def question(s: Sim) -> dict[str, Any]:
    [raised] = s.of("interrupt.raised")[-1:]
    return raised


def tool_jobs(s: Sim) -> list[str]:
    """Every tool job enqueued so far."""
    return [f.work for f in s.effects if getattr(f, "job", None) == "tool"]


# ---- asking ---------------------------------------------------------------------------------


def test_a_gated_call_proposed_for_execution_is_asked_about_not_run():
    s = sim()
    [call] = model_asks(s, ("pay", PAY))
    raised = question(s)
    digest = call_digest("pay", PAY)
    assert raised["reason"] == "approval"
    assert raised["payload"] == {"message": "Run pay?", "call_id": call, "tool": "pay",
                                 "arguments": PAY, "digest": digest}
    rec = s.interrupt(raised["interrupt_id"])
    assert rec.resumable_by == ["alice", "bob"] and rec.approves == call
    assert rec.response_schema == DEFAULT_RESPONSE_SCHEMA
    # the index (inbox, `parley interrupts`) carries who may answer and the answer's form
    [add] = s.index_adds()
    assert add.resumable_by == ["alice", "bob"] and add.response_schema == DEFAULT_RESPONSE_SCHEMA
    assert tool_jobs(s) == [] and "tool.started" not in s.types()
    assert s.work(call).status == "new" and s.work(call).approval.digest == digest
    assert s.show()["parked"] is True
    assert s.last.counts[("approval", "asked")] == 1


def test_the_right_approver_saying_yes_runs_the_call_once_with_its_digest():
    s = sim()
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    s.resume(iid, {"approved": True}, signed_by="bob")
    assert s.last.counts[("approval", "granted")] == 1
    [job] = s.enqueued("tool")
    assert job.work == call and job.args == {"name": "pay", "arguments": PAY,
                                             "approval": call_digest("pay", PAY)}
    assert s.ev("tool.started")["approval"] == {"interrupt_id": iid, "digest": call_digest("pay", PAY),
                                                "principal": "bob"}
    assert s.ev("interrupt.resumed")["principal"] == "bob"
    assert s.work(call).approval.used is True
    # the same answer sent again runs nothing more
    s.resume(iid, {"approved": True}, signed_by="bob")
    assert s.ev("input.ignored")["code"] == "already_resumed" and s.enqueued("tool") == []
    s.finish_tool(call, "paid")
    assert tool_jobs(s) == [call]


@pytest.mark.parametrize("who", [None, "mallory"], ids=["unsigned", "not-an-approver"])
def test_a_resume_by_anyone_but_an_approver_is_refused_and_runs_nothing(who: str | None):
    s = sim()
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    s.resume(iid, {"approved": True}, **({"signed_by": who} if who else {}))
    assert s.ev("input.refused")["code"] == "forbidden"
    assert iid in s.core.interrupts and s.work(call).approval.granted is None
    assert tool_jobs(s) == []


@pytest.mark.parametrize(("answer", "error"), [
    ({"approved": False}, "approval_denied"),
    ({"approved": False, "message": "too much"}, "approval_denied: too much"),
])
def test_a_no_settles_the_call_as_a_tool_error_with_the_approvers_reason(answer: Any, error: str):
    s = sim()
    [call] = model_asks(s, ("pay", PAY))
    s.resume(question(s)["interrupt_id"], answer, signed_by="alice")
    assert s.ev("tool.completed") | {"at": 0, "message_id": ""} == {
        "type": "tool.completed", "at": 0, "call_id": call, "name": "pay", "message_id": "",
        "error": error}
    assert s.last.counts[("approval", "denied")] == 1
    assert tool_jobs(s) == [] and call not in s.core.work


def test_an_answer_of_the_wrong_shape_is_refused_and_the_question_stays_open():
    s = sim()
    model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    for payload in ({"approved": "yes"}, {"aproved": True}, None):
        s.resume(iid, payload, signed_by="alice")
        assert s.ev("input.refused")["code"] == "invalid_resume"
    assert iid in s.core.interrupts and tool_jobs(s) == []


def test_an_unanswered_approval_is_denied_at_its_deadline_never_approved():
    s = sim(ApprovalPolicy(approvers=("alice",), timeout_s=60))
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    assert s.interrupt(iid).default == {"approved": False}
    s.deadline(iid)
    assert s.ev("interrupt.resumed")["timed_out"] is True
    assert s.ev("tool.completed")["error"] == "approval_timed_out"
    assert s.last.counts[("approval", "timed_out")] == 1
    assert tool_jobs(s) == [] and call not in s.core.work


def test_without_approvers_any_accepted_resume_approves_and_is_audited_as_unsigned():
    s = sim(ApprovalPolicy())
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    assert s.interrupt(iid).resumable_by is None
    s.resume(iid, {"approved": True})
    assert s.enqueued_work("tool") == [call]
    assert s.ev("tool.started")["approval"] == {"interrupt_id": iid, "digest": call_digest("pay", PAY)}


# ---- what a decision cannot do ----------------------------------------------------------------


def test_a_decide_that_executes_the_call_without_asking_gets_the_question_instead():
    """A forged or buggy decide returns the execution straight away: the engine asks."""
    s = sim(decide_on={"tool.execute"})
    s.start("pay acme")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    call = s.trigger["call_id"]
    s.decide([{"type": "tool.execute"}], expect="tool.execute")
    assert question(s)["payload"]["call_id"] == call
    assert tool_jobs(s) == [] and s.work(call).status == "new"
    # not settled as `not_executed`: it waits for its answer
    assert "tool.completed" not in s.types()


def test_a_decide_that_starts_a_new_call_of_a_gated_tool_gets_a_question_for_it():
    s = sim(decide_on={"tool.execute"})
    [call] = model_asks(s, ("search", {"q": "x"}))
    evil = {"to": "EVIL", "amount": 10_000}
    s.decide([{"type": "tool.execute"}, {"type": "tool.execute", "name": "pay", "arguments": evil}],
             expect="tool.execute")
    # the search runs; the new pay call is asked about, after, so no work starts on a parked branch
    assert s.enqueued_work("tool") == [call]
    raised = question(s)
    assert raised["payload"]["arguments"] == evil
    assert raised["payload"]["digest"] == call_digest("pay", evil) != call_digest("pay", PAY)
    assert tool_jobs(s) == [call]


def test_an_approval_of_one_call_never_runs_a_call_with_other_arguments():
    """After the approval, the app swaps the call for one with other arguments: that one is
    asked about anew, and the approved one, never run, settles."""
    s = sim(decide_on={"interrupt.resumed"})
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    s.resume(iid, {"approved": True}, signed_by="alice")
    assert s.trigger["reason"] == "approval" and s.trigger["call_id"] == call
    assert s.proposed == [{"type": "tool.execute", "call_id": call}]
    edited = {"to": "acme", "amount": 999}
    s.decide([{"type": "tool.execute", "name": "pay", "arguments": edited}])
    assert tool_jobs(s) == []
    assert s.ev("tool.completed")["call_id"] == call and s.ev("tool.completed")["error"] == "not_executed"
    again = question(s)
    assert again["interrupt_id"] != iid and again["payload"]["arguments"] == edited


def test_an_approval_is_bound_to_its_call_not_to_equal_arguments_of_another():
    s = sim()
    [first] = model_asks(s, ("pay", PAY))
    s.resume(question(s)["interrupt_id"], {"approved": True}, signed_by="alice")
    s.finish_tool(first, "paid")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    [second] = [c["id"] for c in s.ev("message.created")["message"]["tool_calls"]]
    assert question(s)["payload"]["call_id"] == second
    assert tool_jobs(s) == [first]


def test_the_app_deciding_the_approvals_resume_as_proposed_runs_it():
    s = sim(decide_on={"interrupt.resumed"})
    [call] = model_asks(s, ("pay", PAY))
    s.resume(question(s)["interrupt_id"], {"approved": False}, signed_by="alice")
    assert s.proposed == [{"type": "tool.error", "call_id": call, "error": "approval_denied"}]
    s.decide()
    assert s.ev("tool.completed")["error"] == "approval_denied" and tool_jobs(s) == []


def test_parallel_gated_calls_are_asked_one_after_the_other():
    s = sim()
    first, second = model_asks(s, ("pay", PAY), ("pay", {"to": "b", "amount": 1}))
    assert question(s)["payload"]["call_id"] == first
    assert [q.trigger["call_id"] for q in s.held(s.work(first).turn)] == [second]
    s.resume(question(s)["interrupt_id"], {"approved": True}, signed_by="alice")
    assert question(s)["payload"]["call_id"] == second
    assert s.enqueued_work("tool") == [first]


def test_an_approval_given_while_its_branch_is_not_active_runs_it_when_the_branch_is_back():
    """I9: nothing is delivered, but the answer stands: the call runs when its turn goes on."""
    s = sim()
    [call] = model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    anchor = s.interrupt(iid).anchor
    s.start("something else", parent=None)
    s.resume(iid, {"approved": True}, signed_by="alice")
    assert s.ev("interrupt.resumed")["delivered"] is False and tool_jobs(s) == []
    s.switch(anchor)
    assert s.enqueued_work("tool") == [call]


def test_closing_the_session_cancels_the_question_and_runs_nothing():
    s = sim()
    model_asks(s, ("pay", PAY))
    iid = question(s)["interrupt_id"]
    s.input({"type": "session.close"})
    assert s.ev("interrupt.cancelled")["interrupt_id"] == iid
    s.resume(iid, {"approved": True}, signed_by="alice")
    assert tool_jobs(s) == []


def test_a_tool_result_action_may_settle_a_gated_call_without_running_it():
    """Approval guards execution only: a decision that answers the call itself runs nothing."""
    s = sim(decide_on={"tool.execute"})
    s.start("pay acme")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    s.decide([{"type": "tool.result", "result": "cached"}], expect="tool.execute")
    assert s.of("interrupt.raised") == [] and tool_jobs(s) == []


def test_a_gated_sub_agent_or_deferred_tool_is_asked_about_before_it_starts():
    tools = dict(TOOLS, ask_hr=ToolInfo(deferred=True, approval=ApprovalPolicy()))
    s = Sim(make_app(has_decide=False, tools=tools))
    s.start("x")
    s.finish_llm(tool_calls=[{"name": "ask_hr", "arguments": {"q": 1}}])
    assert "tool.deferred" not in s.types()
    s.resume(question(s)["interrupt_id"], {"approved": True})
    assert s.ev("tool.deferred")["approval"]["digest"] == call_digest("ask_hr", {"q": 1})


# ---- the declaration and the digest -------------------------------------------------------------


def test_the_digest_is_canonical_json_of_name_and_arguments():
    assert call_digest("pay", {"a": 1, "b": [1, 2]}) == call_digest("pay", {"b": [1, 2], "a": 1})
    assert call_digest("pay", {"a": 1}) != call_digest("pay", {"a": 2})
    assert call_digest("pay", {"a": 1}) != call_digest("refund", {"a": 1})
    assert call_digest("pay", None) == call_digest("pay", {})
    import hashlib
    assert call_digest("p", {"x": 1}) == "sha256:" + hashlib.sha256(
        b'{"arguments":{"x":1},"name":"p"}').hexdigest()


def test_declarations_parse_to_policies():
    assert parse_policy(None) is None and parse_policy(False) is None
    assert parse_policy(True) == ApprovalPolicy()
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
              "required": ["approved", "note"]}
    assert parse_policy({"approvers": ["alice"], "timeout_s": 5, "message": "Pay?",
                         "response_schema": schema}) == ApprovalPolicy(("alice",), 5.0, "Pay?", schema)


@pytest.mark.parametrize(("value", "says"), [
    ("yes", "must be True, False or a dict"),
    ({"approver": ["alice"]}, "unknown keys ['approver']"),
    ({"approvers": "alice"}, "`approvers` must be a non-empty list"),
    ({"approvers": []}, "`approvers` must be a non-empty list"),
    ({"approvers": [""]}, "`approvers` must be a non-empty list"),
    ({"timeout_s": 0}, "`timeout_s` must be a number of seconds > 0"),
    ({"timeout_s": True}, "`timeout_s` must be a number of seconds > 0"),
    ({"message": ""}, "`message` must be a string"),
    ({"response_schema": {"type": "object"}}, "whose `required` lists `approved`"),
    ({"response_schema": {"type": "object", "properties": {"approved": {"type": "string"}},
                          "required": ["approved"]}}, "a property of type boolean"),
])
def test_a_declaration_the_engine_could_not_enforce_is_refused(value: Any, says: str):
    with pytest.raises(PolicyError, match=None) as caught:
        parse_policy(value)
    assert says in str(caught.value)


# ---- found in review ----------------------------------------------------------------------------


def test_a_gated_idempotent_tool_lost_with_its_worker_is_not_run_again_on_the_same_approval():
    """An approval lets a call run once: a `lost` outcome (which a worker may post) settles it
    `worker_lost` instead of retrying it, whatever `idempotent` says."""
    s = Sim(make_app(has_decide=False, tools=dict(TOOLS, refund=ToolInfo(idempotent=True,
                                                                         approval=APPROVERS))))
    s.start("x")
    s.finish_llm(tool_calls=[{"name": "refund", "arguments": PAY}])
    [call] = [c["id"] for c in s.ev("message.created")["message"]["tool_calls"]]
    s.resume(question(s)["interrupt_id"], {"approved": True}, signed_by="alice")
    s.outcome("tool", call, s.work(call).attempt, ok=False, error="worker_lost", lost=True)
    assert tool_jobs(s) == [call]
    assert s.ev("tool.completed")["error"] == "worker_lost"


def test_a_call_settled_while_its_question_is_open_withdraws_the_question():
    """The app settles the call another way (here on the resume of its own interrupt): the
    approval question goes with it, so it parks the branch no longer."""
    s = sim(decide_on={"tool.execute", "interrupt.resumed"})
    s.start("x")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    call = s.trigger["call_id"]
    s.decide([{"type": "tool.execute"}, {"type": "interrupt", "reason": "confirm"}])
    confirm = next(i for i, rec in s.core.interrupts.items() if rec.reason == "confirm")
    approval = next(i for i, rec in s.core.interrupts.items() if rec.reason == "approval")
    asked = s.interrupt(approval).payload
    s.resume(confirm, {"ok": True})
    s.decide([{"type": "tool.result", "result": "done by hand"}])
    assert s.ev("interrupt.cancelled") | {"at": 0} == {
        "type": "interrupt.cancelled", "at": 0, "interrupt_id": approval, "reason": "approval",
        "request": asked, "why": "call_settled"}
    assert s.core.interrupts == {} and s.show()["parked"] is False
    assert any(f.interrupt_id == approval for f in s.last.effects if type(f).__name__ == "IndexRemove")
    s.settle_decides()
    s.resume(approval, {"approved": True}, signed_by="alice")  # too late: ignored, runs nothing
    assert s.ev("input.ignored")["code"] == "already_resumed"
    assert tool_jobs(s) == [] and call not in s.core.work


def test_a_no_after_a_model_call_the_question_voided_starts_one_model_call_not_two():
    s = sim(decide_on={"tool.execute"})
    s.start("x")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    s.decide([{"type": "tool.execute"}, {"type": "llm.call"}])
    assert s.of("llm.voided")  # the question parked the branch the model call was on
    s.resume(question(s)["interrupt_id"], {"approved": False}, signed_by="alice")
    s.settle_decides()
    assert len(s.running_llm()) == 1


def test_a_decision_may_not_raise_an_interrupt_with_the_engines_approval_reason():
    s = sim(decide_on={"tool.execute"})
    [call] = model_asks(s, ("search", {"q": "x"}))
    s.decide([{"type": "interrupt", "reason": "approval", "payload": {"call_id": call}}])
    assert "reason 'approval' is the engine's own" in s.ev("decision.failed")["error"]
    assert s.core.interrupts == {}
