"""The example app examples/expenses_app.py (typed actions, `@tool`, `instructions`, an async
tool, `interrupt()` in a tool, `needs_approval`), through whole turns with `parley.testing`:
what its docstring promises a user, one case each."""

from typing import Any

import pytest

from examples import expenses_app
from parley.testing import AppRunner, InputNotApplied, SessionRun


def session() -> SessionRun:
    return AppRunner("examples.expenses_app").session()


def test_the_app_loads_with_its_declarations():
    app = AppRunner("examples.expenses_app").app
    assert app.instructions == expenses_app.instructions
    assert set(app.tools) == {"policy_limit", "file_expense", "reimburse"}
    assert app.tools["file_expense"].timeout_s == 30


def test_the_model_is_sent_the_instructions():
    seen: list[dict[str, Any]] = []

    def model(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return expenses_app.llm(request)

    AppRunner("examples.expenses_app", llm=model).session().send("limit for taxi")
    assert seen and all(r["instructions"] == expenses_app.instructions for r in seen)


def test_the_async_tool_answers_the_policy_limit():
    run = session().send("limit for hotel")
    assert run.tool_calls[0].content == "250.0"
    assert run.reply == "Done. policy_limit: 250.0"


def test_a_small_expense_asks_for_its_receipt_from_inside_the_tool_and_is_filed_with_it():
    run = session().send("expense 42.50 taxi to the airport")
    [question] = run.questions
    assert (question.reason, question.call_id) == ("receipt", "call-1")
    assert question.response_schema == expenses_app.RECEIPT
    assert not run.tool_calls[0].settled
    with pytest.raises(InputNotApplied) as refused:
        run.resume(question, {"receipt": ""})  # the tool's schema refuses it
    assert refused.value.code == "invalid_resume" and run.questions == [question]
    run.resume(question, {"receipt": "R-1001"})
    assert run.tool_calls[0].content == "filed 42.50 EUR for taxi to the airport with receipt R-1001"
    assert run.questions == [] and run.of("turn.completed")


def test_a_large_expense_is_reviewed_first_then_asks_for_its_receipt():
    run = session().send("expense 900 flight to Lisbon")
    [review] = run.questions
    assert (review.reason, review.response_schema) == ("review", expenses_app.APPROVED)
    run.resume(review, {"approved": True})
    [receipt] = run.questions  # the reviewed call runs, and its code asks
    assert receipt.reason == "receipt"
    run.resume(receipt, {"receipt": "R-2"})
    assert run.tool_calls[0].content == "filed 900 EUR for flight to Lisbon with receipt R-2"


def test_a_declined_review_is_a_tool_error_and_nothing_is_filed():
    run = session().send("expense 900 flight to Lisbon")
    run.resume(None, {"approved": False, "note": "over budget"})
    assert run.tool_calls[0].error == "declined by finance: over budget"
    assert run.questions == [] and run.reply == "Done. file_expense (error): declined by finance: over budget"


def test_reimbursing_waits_for_an_approval_and_a_no_pays_nothing():
    run = session().send("reimburse 42.50")
    [approval] = run.questions
    assert (approval.reason, approval.call_id) == ("approval", "call-1")
    assert approval.payload["message"] == "Reimburse this expense?"
    run.resume(approval, {"approved": False})
    assert run.tool_calls[0].content is None and run.tool_calls[0].error


def test_reimbursing_runs_once_approved():
    run = session().send("reimburse 42.50")
    run.resume(None, {"approved": True})
    assert run.tool_calls[0].content == "reimbursed 42.50 EUR"
