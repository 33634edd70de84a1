"""A job given back unrun by the worker that took it (its `unrun` outcome, signed with the job's
token: entries.py checks the signature) is issued again, whatever it is: nothing ran. A plain
`lost` (which needs no signature) is retried only where running again is safe."""

from typing import Any

from parley.dispatcher.core import ToolInfo
from parley.dispatcher.core.work import MAX_ATTEMPTS

from .harness import TOOLS, Sim, make_app
from .test_approvals import PAY, question, sim

GIVEN_BACK: dict[str, Any] = {"ok": False, "error": "given_back", "lost": True, "unrun": True}


def jobs_of(s: Sim, work: str) -> list[int]:
    """The attempts of `work` the last transition enqueued."""
    return [fx.attempt for fx in s.last.effects if getattr(fx, "work", None) == work and fx.op == "enqueue"]


def test_a_tool_that_is_not_idempotent_given_back_unrun_is_issued_again_not_settled():
    s = Sim(make_app(has_decide=False, tools=TOOLS))
    s.send("go")
    [call] = s.reply_tools("send_email")
    s.outcome("tool", call, 1, **GIVEN_BACK)
    assert jobs_of(s, call) == [2] and s.work(call).status == "running"
    assert "tool.completed" not in [e["type"] for e in s.last.events]
    assert s.last.counts == {("work_given_back", "tool"): 1}
    # the same tool lost with its worker (no word that it did not run) settles as worker_lost
    s.outcome("tool", call, 2, ok=False, error="worker_lost", lost=True)
    assert jobs_of(s, call) == [] and s.ev("tool.completed")["error"] == "worker_lost"


def test_giving_back_is_not_counted_against_the_lost_work_attempts():
    s = Sim(make_app(has_decide=False, tools={"search": ToolInfo(idempotent=True)}))
    s.send("go")
    [call] = s.reply_tools("search")
    for attempt in range(1, MAX_ATTEMPTS + 2):
        s.outcome("tool", call, attempt, **GIVEN_BACK)
        assert jobs_of(s, call) == [attempt + 1]
    s.finish_tool(call, "found")
    assert s.ev("tool.completed")["call_id"] == call and "error" not in s.ev("tool.completed")


def test_an_approved_call_given_back_unrun_runs_once_on_its_approval():
    """Its approval was used up by the issue, and no run spent it: the call is issued again,
    carrying the approval's digest, and its result settles it."""
    s = sim()
    s.start("x")
    s.finish_llm(tool_calls=[{"name": "pay", "arguments": PAY}])
    [call] = [c["id"] for c in s.ev("message.created")["message"]["tool_calls"]]
    s.resume(question(s)["interrupt_id"], {"approved": True}, signed_by="alice")
    first = s.work(call).attempt
    s.outcome("tool", call, first, **GIVEN_BACK)
    [again] = [fx for fx in s.last.effects if getattr(fx, "work", None) == call]
    assert again.attempt == first + 1 and again.args["approval"] == s.work(call).approval.digest
    assert not [i for i in s.core.interrupts.values() if i.reason == "approval"]  # not asked again
    s.finish_tool(call, "paid")
    assert s.ev("tool.completed")["call_id"] == call and "error" not in s.ev("tool.completed")


def test_a_model_call_and_a_decide_given_back_are_issued_again():
    s = Sim(make_app(has_decide=False, tools=TOOLS))
    s.send("go")
    [llm] = s.running_llm()
    s.outcome("llm", llm, 1, **GIVEN_BACK)
    assert jobs_of(s, llm) == [2]
    d = Sim(make_app(tools=TOOLS))
    d.send("go")
    deciding = d.deciding
    assert deciding is not None
    d.outcome("decide", deciding.work, deciding.attempt, **GIVEN_BACK)
    assert d.deciding is not None and d.deciding.attempt == deciding.attempt + 1
    assert d.last.counts == {("work_given_back", "decide"): 1}
