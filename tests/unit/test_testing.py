"""`parley.testing` (what an app's author writes tests with): whole turns of real apps, in
process, with no Redis anywhere. Each case is one a user would check of their own app."""

from typing import Any

import pytest

from parley import ScriptedModel
from parley.testing import AppRunner, InputNotApplied, Unsettled

SEED = "Email bob@example.com: the launch moved to Friday."


def test_the_seed_app_asks_before_it_sends_and_a_yes_sends():
    run = AppRunner("examples.seed_app").session()
    run.send(SEED)
    [question] = run.questions
    assert (question.reason, question.payload) == ("confirm", {"message": "Send the email?"})
    assert run.reply is None and not run.tool_calls[0].settled
    run.resume(question, {"approved": True})
    assert run.reply == "Done. send_email: sent"
    [call] = run.tool_calls
    assert (call.name, call.content, call.error) == ("send_email", "sent", None)
    assert run.questions == [] and run.of("turn.completed")


def test_a_no_is_a_tool_error_the_model_reads():
    run = AppRunner("examples.seed_app").session()
    run.send(SEED).resume(None, {"approved": False})
    assert run.tool_calls[0].error == "declined"
    assert run.reply == "Done. send_email (error): declined"


def test_an_approval_is_the_engines_question_and_only_its_approvers_answer_it(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch):
    paid = tmp_path / "paid"
    monkeypatch.setenv("PARLEY_TEST_PAID_LOG", str(paid))
    run = AppRunner("tests.apps.approvals_app").session()
    run.send('call pay {"to": "acme", "amount": 120}')
    [question] = run.questions
    assert (question.reason, question.call_id, question.resumable_by) == ("approval", "call-1", ["alice"])
    with pytest.raises(InputNotApplied) as refused:
        run.resume(question, {"approved": True}, principal="mallory")
    assert refused.value.code == "forbidden" and not paid.exists()
    run.resume(question, {"approved": True}, principal="alice")
    assert run.tool_calls[0].content == "paid 120 to acme"
    assert paid.read_text().count("acme") == 1


def test_a_tool_that_asks_runs_again_with_each_answer():
    run = AppRunner("tests.apps.scenarios").session()
    run.send('call transfer {"amount": 5}')
    [first] = run.questions
    assert (first.reason, first.call_id) == ("which_account", "call-1")
    with pytest.raises(InputNotApplied) as wrong:
        run.resume(first, "cash")  # its response_schema refuses it, as a dispatcher would
    assert wrong.value.code == "invalid_resume"
    run.resume(first, "savings")
    [second] = run.questions
    assert second.reason == "confirm" and second.payload == {"account": "savings", "amount": 5}
    run.resume(second, True)
    assert run.tool_calls[0].content == "moved 5 from savings"
    with pytest.raises(InputNotApplied) as late:
        run.resume(first, "checking")
    assert late.value.code == "already_resumed"


def test_the_clock_stands_still_until_the_test_moves_it():
    runner = AppRunner("tests.apps.scenarios")
    run = runner.session()
    run.send("email bob [deadline-3s] hi")
    [question] = run.questions
    assert question.deadline_ms == runner.now_ms + 3000
    runner.advance(2)
    assert run.questions == [question]
    runner.advance(1)
    assert run.questions == [] and run.of("interrupt.resumed")[0]["timed_out"] is True
    assert run.tool_calls[0].error == "declined"


def test_a_decide_that_raises_is_a_failure_with_the_apps_frame():
    run = AppRunner("tests.apps.scenarios").session()
    run.send("[decide-raises] hi")
    [failed] = run.failures
    assert failed["type"] == "decision.failed"
    assert failed["exception"]["type"] == "RuntimeError"
    assert failed["exception"]["frames"][-1].startswith("tests/apps/scenarios.py:")


def test_a_scripted_model_replaces_the_apps_own():
    model = ScriptedModel().when(r"add (?P<a>\d+) and (?P<b>\d+)", "add")
    run = AppRunner("tests.apps.scenarios", llm=model).session()
    run.send("add 2 and 40")
    [call] = run.tool_calls
    assert (call.name, call.arguments) == ("add", {"a": "2", "b": "40"})
    assert call.content == "240"  # the scripted model's arguments are strings: "2" + "40"


def test_async_tools_and_decide_run_too():
    run = AppRunner("tests.apps.async_app").session()
    run.send('call pick {"options": ["a", "b"]}')
    run.resume(None, "b")
    assert run.tool_calls[0].content == "picked b"


def test_a_sub_agent_runs_as_a_child_session_of_the_same_runner():
    run = AppRunner("tests.apps.agents").session()
    run.send('call research {"topic": "otters"}')
    [child] = run.children
    [question] = child.questions  # the child's own question, asked in the child
    assert question.payload == {"publish": True}
    child.resume(question, {"approved": True})
    assert child.tool_calls[0].content == "published otters"
    assert run.tool_calls[0].settled and run.reply is not None


def test_an_input_the_engine_refuses_raises_with_its_code():
    run = AppRunner("examples.seed_app").session()
    with pytest.raises(InputNotApplied) as refused:
        run.send("hello", parent_id="msg-99")
    assert refused.value.outcome == "refused" and refused.value.code == "unknown_parent"
    with pytest.raises(ValueError, match="exactly one open"):
        run.resume(payload=True)


def test_an_app_that_never_settles_stops_with_unsettled():
    runner = AppRunner("tests.apps.scenarios", llm=lambda request: {
        "content": "", "tool_calls": [{"id": "x", "name": "add", "arguments": {"a": 1, "b": 1}}]},
        max_steps=50)
    with pytest.raises(Unsettled, match="50 steps"):
        runner.session().send("loop")


def test_what_the_model_streams_is_kept_in_order_and_adds_up_to_the_reply():
    from parley import stream_delta

    def streaming_model(request: dict[str, Any]) -> dict[str, Any]:
        text = "You said: " + request["messages"][-1]["content"]
        for start in range(0, len(text), 4):
            stream_delta(text[start:start + 4])
        return {"content": text, "tool_calls": []}

    run = AppRunner("examples.seed_app", llm=streaming_model).session()
    run.send("hello there")
    assert "".join(d.text for d in run.deltas) == run.reply == "You said: hello there"
    assert [d.seq for d in run.deltas] == list(range(1, len(run.deltas) + 1))
    assert {(d.call_id, d.attempt) for d in run.deltas} == {("llm-1", 1)}
