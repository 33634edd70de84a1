"""A tool's own questions (`parley.interrupt()` in its code), on the pure core: the call waits,
its question parks the branch as a decision's interrupt does, and each answer runs the tool
again from its start with the answers so far, as a new attempt (dispatcher/core/asks.py)."""

from typing import Any

import pytest

from parley.dispatcher.core import MAX_ATTEMPTS, ToolInfo
from parley.schemas.approvals import ApprovalPolicy
from parley.schemas.codes import DropReason

from .harness import TOOLS, Sim, make_app

ASK = {"reason": "which_account", "payload": {"accounts": ["a", "b"]}}


def sim(decide_on: set[str] | None = None, **tools: ToolInfo) -> Sim:
    app = make_app(has_decide=decide_on is not None, decide_on=decide_on or set(),
                   tools=dict(TOOLS, book=ToolInfo(idempotent=True), **tools))
    return Sim(app)


def asking_call(s: Sim, name: str = "book") -> str:
    """A turn whose model asked for one `name` call, now running as attempt 1."""
    s.start("book it")
    [call] = s.reply_tools(name)
    assert s.work(call).status == "running" and s.work(call).attempt == 1
    return call


def ask(s: Sim, call: str, question: dict[str, Any] | None = None) -> str:
    """The running call's job posts a question; the interrupt id it raised."""
    w = s.work(call)
    s.outcome("tool", call, w.attempt, ok=False, error="asked", interrupt=question or ASK)
    return str(s.ev("interrupt.raised")["interrupt_id"])


def tool_jobs(s: Sim) -> list[tuple[str, int, list[Any] | None]]:
    return [(f.work, f.attempt, f.args.get("answers")) for f in s.effects
            if getattr(f, "job", None) == "tool"]


def test_a_question_parks_the_branch_at_the_calls_turn_and_the_call_waits():
    s = sim()
    call = asking_call(s)
    tip = s.turn(s.work(call).turn).tip
    iid = ask(s, call)
    raised = s.ev("interrupt.raised")
    assert raised == {**raised, "reason": "which_account", "payload": {"accounts": ["a", "b"]},
                      "anchor": tip, "call_id": call}
    assert s.work(call).status == "asking"
    assert s.interrupt(iid).call == call
    assert "tool.completed" not in s.types()  # the call is not settled: it waits for the answer
    assert s.enqueued("tool") == []  # and nothing runs for it meanwhile


def test_the_answer_runs_the_tool_again_with_it_and_asks_decide_nothing():
    s = sim(decide_on={"interrupt.resumed", "tool.completed"})
    call = asking_call(s)
    iid = ask(s, call)
    s.resume(iid, {"account": "b"})
    resumed = s.ev("interrupt.resumed")
    assert resumed["call_id"] == call and resumed["delivered"] is True
    assert resumed["payload"] == {"account": "b"} and resumed["request"] == ASK["payload"]
    assert s.deciding is None  # the answer went to the tool, not to a trigger
    assert tool_jobs(s)[-1] == (call, 2, [{"account": "b"}])
    assert s.work(call).status == "running" and s.work(call).answers == [{"account": "b"}]


def test_several_questions_in_order_then_the_result_settles_the_call():
    s = sim()
    call = asking_call(s)
    first = ask(s, call)
    s.resume(first, "a")
    second = ask(s, call, {"reason": "how_much", "payload": None})
    assert second != first
    s.resume(second, 30)
    assert tool_jobs(s) == [(call, 1, None), (call, 2, ["a"]), (call, 3, ["a", 30])]
    s.finish_tool(call, {"booked": "a", "amount": 30})
    completed = s.ev("tool.completed")
    assert completed["call_id"] == call and "error" not in completed
    assert s.running_llm()  # the turn goes on: the model sees the result


def test_a_late_copy_of_the_question_changes_nothing():
    s = sim()
    call = asking_call(s)
    iid = ask(s, call)
    # posted twice (a worker rode out a Redis restart): while it asks, the call is not running
    s.outcome("tool", call, 1, ok=False, error="asked", interrupt=ASK)
    assert s.last is not None and s.last.dropped == DropReason.STALE_ATTEMPT
    s.resume(iid, "a")
    s.outcome("tool", call, 1, ok=False, error="asked", interrupt=ASK)  # and after the answer
    assert s.last is not None and s.last.dropped == DropReason.STALE_ATTEMPT
    assert len(s.of("interrupt.raised")) == 1


def test_a_deadline_answers_with_the_default():
    s = sim()
    call = asking_call(s)
    iid = ask(s, call, {**ASK, "timeout_s": 5, "default": "a"})
    s.deadline(iid)
    assert s.ev("interrupt.resumed")["timed_out"] is True
    assert tool_jobs(s)[-1] == (call, 2, ["a"])


def test_a_typed_question_refuses_an_answer_of_the_wrong_shape():
    s = sim()
    call = asking_call(s)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    iid = ask(s, call, {**ASK, "response_schema": schema})
    s.resume(iid, {"n": "x"})
    assert s.last is not None and s.last.input_outcome is not None
    assert s.last.input_outcome[2] == "invalid_resume"
    assert s.work(call).status == "asking"
    s.resume(iid, {"n": 3})
    assert tool_jobs(s)[-1] == (call, 2, [{"n": 3}])


@pytest.mark.parametrize("question, why", [
    ({"reason": "approval", "payload": None}, "the engine's own"),
    ({**ASK, "interrupt_id": "mine"}, "interrupt_id"),
    ({"reason": "", "payload": None}, "reason"),
    ({**ASK, "response_schema": {"type": "nope"}}, "response_schema"),
    ({**ASK, "timeout_s": 5, "default": "x", "response_schema": {"type": "integer"}}, "default"),
    ({**ASK, "surprise": 1}, "surprise"),
])
def test_a_question_the_engine_cannot_raise_fails_the_call(question: dict[str, Any], why: str):
    s = sim()
    call = asking_call(s)
    w = s.work(call)
    s.outcome("tool", call, w.attempt, ok=False, error="asked", interrupt=question)
    completed = s.ev("tool.completed")
    assert completed["error"].startswith("invalid_interrupt: ") and why in completed["error"]
    assert not s.core.interrupts and call not in s.core.work


def test_closing_the_session_takes_the_question_and_its_call_with_it():
    s = sim()
    call = asking_call(s)
    iid = ask(s, call)
    s.input({"type": "session.close"})
    cancelled = s.ev("interrupt.cancelled")
    assert cancelled["interrupt_id"] == iid
    assert call not in s.core.running_at_close  # nothing runs: no late result is waited for
    s.resume(iid, "a")
    assert s.last is not None and s.last.input_outcome is not None and s.last.input_outcome[1] != "applied"
    assert len(tool_jobs(s)) == 1


def test_a_call_settled_while_it_asks_withdraws_its_question():
    s = sim(decide_on={"interrupt.resumed"}, pay=ToolInfo(approval=ApprovalPolicy()))
    s.start("book and pay")
    book, pay = s.reply_tools("book", "pay")  # book runs; pay is asked about (an approval)
    approval = str(s.ev("interrupt.raised")["interrupt_id"])
    question = ask(s, book)
    s.resume(approval, {"approved": True})
    # the approval's resume goes to decide, which settles the asking call itself (recording
    # actions apply on a parked branch; one that starts work would be held, I12)
    s.decide([{"type": "tool.result", "call_id": book, "result": "booked by hand"},
              {"type": "tool.error", "call_id": pay, "error": "not now"}])
    cancelled = s.ev("interrupt.cancelled")
    assert cancelled["interrupt_id"] == question and cancelled["why"] == "call_settled"
    assert question not in s.core.interrupts and book not in s.core.work
    s.resume(question, "a")  # a late answer runs nothing
    assert s.last is not None and s.last.input_outcome is not None
    assert s.last.input_outcome[2] == "already_resumed"
    assert [w for w, _, _ in tool_jobs(s)].count(book) == 1


def test_the_branch_is_parked_while_it_asks_and_not_after_the_answer():
    s = sim()
    call = asking_call(s)
    iid = ask(s, call)
    tip = s.turn(s.work(call).turn).tip
    s.send("and another thing", parent=tip)
    assert s.last is not None and s.last.input_outcome is not None
    assert s.last.input_outcome[2] == "branch_parked"  # parked as by a decision's interrupt (I4)
    s.resume(iid, "a")
    assert tool_jobs(s)[-1] == (call, 2, ["a"])
    s.send("and another thing", parent=tip)
    # no longer parked: refused only as a message on any running turn's tip is
    assert s.last is not None and s.last.input_outcome is not None
    assert s.last.input_outcome[2] == "turn_in_progress"
    s.finish_tool(call, "booked")
    s.finish_llm(content="booked")
    s.send("and another thing", parent=s.head)
    assert s.ev("message.created")


def test_an_answer_runs_the_tool_even_while_another_question_parks_the_branch():
    s = sim()
    s.start("two at once")
    first, second = s.reply_tools("book", "search")
    one = ask(s, first)
    two = ask(s, second, {"reason": "which_query", "payload": None})
    s.resume(two, "q")
    # tools in flight run on through a park; so does a re-run with its answer
    assert tool_jobs(s)[-1] == (second, 2, ["q"])
    assert s.work(first).status == "asking" and one in s.core.interrupts
    s.finish_tool(second, "found")
    assert not s.running_llm()  # the turn still waits for `first`
    s.resume(one, "a")
    s.finish_tool(first, "booked")
    assert s.running_llm()


def test_answered_questions_do_not_count_as_lost_attempts():
    s = sim()
    call = asking_call(s)
    for n in range(MAX_ATTEMPTS):
        s.resume(ask(s, call), n)
    w = s.work(call)
    assert w.attempt == MAX_ATTEMPTS + 1
    s.outcome("tool", call, w.attempt, ok=False, error="worker_lost", lost=True)
    # an idempotent tool lost with its worker runs again: its earlier attempts were re-runs
    assert tool_jobs(s)[-1] == (call, MAX_ATTEMPTS + 2, [0, 1, 2])


def test_a_tool_gone_from_the_app_when_answered_settles_as_unknown():
    s = sim()
    call = asking_call(s)
    iid = ask(s, call)
    s.app = make_app(has_decide=False, tools=dict(TOOLS))
    s.resume(iid, "a")
    assert s.ev("tool.completed")["error"] == "unknown_tool"
