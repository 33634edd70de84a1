"""A tool's own questions: `parley.interrupt()` called in a tool's code (workers/asking.py).

A tool job whose code asks, with no answer yet at that place, posts the question as its
outcome (`WorkOutcome.interrupt`) instead of a result. The call stays open, `asking`: the
question is raised as an interrupt anchored at the call's turn tip, and parks the branch as a
decision's interrupt does (I4). Its resume records the answer on the call (`Work.answers`) and
the tool runs again from its start as a new attempt, its questions so far returning their
answers in order. A call settled while it asks (a decision's `tool.result`, the session's
close) takes its question with it (`interrupt.cancelled`, why `call_settled`).
"""

from typing import Any

from pydantic import ValidationError

from parley.dispatcher.core import interrupts, work
from parley.dispatcher.core.decisions import InvalidDecision, typed_answer
from parley.dispatcher.core.transition import Tx
from parley.schemas.actions import InterruptAction
from parley.schemas.approvals import APPROVAL_REASON
from parley.schemas.state import Interrupt, Work

#: what a call whose question cannot be raised is settled with (the tool error, before the reason)
INVALID = "invalid_interrupt"


def ask(tx: Tx, w: Work, question: dict[str, Any]) -> None:
    """The running call `w` asked `question`: it waits, and the question parks its branch. A
    question the engine cannot raise fails the call, as a decision's would fail the decision."""
    try:
        action = _action(question)
    except (ValidationError, InvalidDecision, ValueError) as exc:
        work.settle(tx, w, error=f"{INVALID}: {exc}")
        return
    w.status = "asking"
    interrupts.raise_interrupt(tx, None, tx.c.turns[w.turn], action, call=w.id)


def _action(question: dict[str, Any]) -> InterruptAction:
    """The question as an interrupt, checked as the same fields of a decision's are (a worker's
    check is the app's convenience: the engine trusts none of it)."""
    if "interrupt_id" in question or "type" in question:
        raise ValueError("a tool's question names neither `type` nor `interrupt_id` (the engine "
                         "mints its id)")
    action = InterruptAction.model_validate({"type": "interrupt", **question})
    if action.reason == APPROVAL_REASON:
        raise ValueError(f"reason {APPROVAL_REASON!r} is the engine's own; declare `needs_approval` "
                         "on the tool instead")
    if action.response_schema is not None:
        typed_answer("the question", action)
    return action


def answered(tx: Tx, rec: Interrupt, payload: Any) -> None:
    """The resume of the question `rec` a call asked: the call runs again with this answer after
    the ones it has. A call settled meanwhile (its question was withdrawn then) runs nothing."""
    w = tx.c.work.get(rec.call or "")
    if w is None or w.status != "asking":
        return
    tool = tx.app.tools.get(w.name or "")
    if tool is None:  # gone from the app since it asked: settled as any call of an unknown tool
        work.settle(tx, w, error="unknown_tool")
        return
    w.answers.append(payload)
    w.status = "running"
    work.enqueue_tool(tx, w, tool)
