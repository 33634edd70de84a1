"""Work outcomes: one handler per outcome kind, routed by `_HANDLERS`.

Results arrive late, twice, for an old attempt or for work a pause voided; each such
outcome is *dropped* (`DropOutcome`, mapped in `apply_outcome`) and changes nothing
(docs/guarantees.md, late results). Work lost with its worker is retried when running it
again is safe: decide jobs, model calls and idempotent tools (docs/design.md, lost work).
"""

from collections.abc import Callable

from pydantic import ValidationError

from parley.dispatcher.core import asks, budgets, decisions, work
from parley.dispatcher.core.closing import is_closed
from parley.dispatcher.core.context import Context
from parley.dispatcher.core.interrupts import resume
from parley.dispatcher.core.retention import retire
from parley.dispatcher.core.transition import Transition, Tx
from parley.dispatcher.core.turns import finish
from parley.schemas.actions import decision_from_app
from parley.schemas.codes import DropReason
from parley.schemas.ids import call_of_deadline
from parley.schemas.llm import InvalidLlmReply, parse_llm_reply
from parley.schemas.results import WorkOutcome
from parley.schemas.state import SessionState, Work


class DropOutcome(Exception):
    """The outcome changes nothing. `counted`: a worker's late result, which the
    `parley_results_dropped_total` metric counts (a dispatcher's own outcomes are not)."""

    def __init__(self, reason: DropReason, *, counted: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.counted = counted


def apply_outcome(state: SessionState, outcome: WorkOutcome, ctx: Context, *,
                  owned: bool = False) -> Transition:
    """Apply one work outcome; a late, stale or voided one changes nothing.
    `owned`: as for `apply_input`."""
    tx = Tx(state, ctx, outcome.session, owned)
    tx.touch(outcome.trace)  # applying it is the job's child, in its turn's trace
    try:
        if tx.core is None:
            raise DropOutcome(DropReason.NO_SESSION)
        if is_closed(tx.core):  # it runs nothing more: a worker's late result is counted
            _record_late(tx, outcome)
            raise DropOutcome(DropReason.SESSION_CLOSED, counted=outcome.kind != "deadline")
        _HANDLERS[outcome.kind](tx, outcome)
    except DropOutcome as drop:
        tx.out.dropped = drop.reason
        if drop.counted:
            tx.count("result_dropped", drop.reason)
    return finish(tx)


def _record_late(tx: Tx, outcome: WorkOutcome) -> None:
    """A call that was running when the session closed has finished: its result is recorded on
    the session (`tool.late`), once, and applied never. Any other outcome (a model reply, a
    decision, another attempt's result) leaves no trace but the dropped count."""
    w = tx.c.running_at_close.get(outcome.work)
    if w is None or outcome.kind != "tool" or outcome.attempt != w.attempt or outcome.source != w.child:
        return
    del tx.c.running_at_close[w.id]
    told = {"result": outcome.value} if outcome.ok else {"error": outcome.error or "tool failed"}
    tx.emit("tool.late", call_id=w.id, name=w.name, **told)
    # the archive copied the session at its close: it is copied again with this result in it
    # (same closed_at and expiry: an archive consumer replaces its copy)
    retire(tx)


def _deadline(tx: Tx, outcome: WorkOutcome) -> None:
    """An interrupt's timeout_s passed unanswered: it is resumed with its `default`. Or a
    sub-agent call's time limit passed before its child reported."""
    call = call_of_deadline(outcome.work)
    if call is not None:
        _subagent_deadline(tx, call)
        return
    rec = tx.c.interrupts.get(outcome.work)
    if rec is None or rec.deadline is None:
        raise DropOutcome(DropReason.ALREADY_RESUMED)
    resume(tx, rec, rec.default, True, None)


def _subagent_deadline(tx: Tx, call_id: str) -> None:
    w = tx.c.work.get(call_id)
    if w is None or w.child is None or w.status != "running":
        raise DropOutcome(DropReason.ALREADY_SETTLED)  # the child reported first
    work.time_out(tx, w)


def _decide(tx: Tx, outcome: WorkOutcome) -> None:
    c = tx.c
    deciding = c.deciding
    if deciding is None or deciding.work != outcome.work or deciding.attempt != outcome.attempt:
        raise DropOutcome(DropReason.STALE_DECISION)
    if outcome.unrun or (outcome.lost and deciding.attempt < work.MAX_ATTEMPTS):
        # decide has no side effects: run it again
        tx.count("work_given_back" if outcome.unrun else "work_retried", "decide")
        deciding.attempt += 1
        decisions.enqueue_decide(tx, deciding)
        return
    c.deciding = None
    if not outcome.ok:
        decisions.decision_failed(tx, deciding.item, outcome.error or "decide failed", outcome.exception)
        return
    try:
        decision = decision_from_app(outcome.value)
    except (ValidationError, ValueError) as exc:
        decisions.decision_failed(tx, deciding.item, f"invalid decision: {exc}")
        return
    decisions.apply_decision(tx, deciding.item, decision)


def _running(tx: Tx, outcome: WorkOutcome) -> Work:
    """The running work this outcome settles, or DropOutcome."""
    w = tx.c.work.get(outcome.work)
    if w is not None and w.child != outcome.source:
        # an agent call is settled only by its own child's report, and a tool job's result
        # never claims to come from a child
        raise DropOutcome(DropReason.WRONG_SOURCE, counted=True)
    if w is None:
        raise DropOutcome(DropReason.ALREADY_SETTLED, counted=True)
    if w.attempt != outcome.attempt or w.status != "running" or w.kind != outcome.kind:
        raise DropOutcome(DropReason.STALE_ATTEMPT, counted=True)
    return w


def _retried(tx: Tx, w: Work, outcome: WorkOutcome) -> bool:
    """Work lost with its worker runs again when that is safe: model calls and idempotent
    tools without `needs_approval`, up to MAX_ATTEMPTS (other tools settle as `worker_lost`).
    Work its taker gave back unrun (signed: entries.py checked) is issued again, whatever it
    is: nothing ran, so a run now is still its first (and a gated call's approval, used up by
    the issue, is still unspent by any run)."""
    tool = tx.app.tools.get(w.name or "") if w.kind == "tool" else None
    if outcome.unrun:
        tx.count("work_given_back", w.kind)
        if w.kind == "llm":
            work.enqueue_llm(tx, w)
        elif tool is not None:
            work.enqueue_tool(tx, w, tool)
        else:
            return False  # its tool is gone from the app: settled as the outcome says
        return True
    if not outcome.lost or work.lost_attempts(w) >= work.MAX_ATTEMPTS:
        return False
    if w.kind == "llm":
        tx.count("work_retried", w.kind)
        work.enqueue_llm(tx, w)
        return True
    if tool is not None and tool.idempotent and tool.approval is None:
        # (a gated tool's approval let it run once: lost, it settles `worker_lost`, and a
        # retry would be a run nobody approved)
        tx.count("work_retried", w.kind)
        work.enqueue_tool(tx, w, tool)
        return True
    return False


def _tool(tx: Tx, outcome: WorkOutcome) -> None:
    w = _running(tx, outcome)
    if outcome.interrupt is not None and w.child is None:
        asks.ask(tx, w, outcome.interrupt)  # its code asked a question: it waits for the answer
        return
    if _retried(tx, w, outcome):
        return
    if w.child is not None and outcome.usage:
        for kind in budgets.BUDGET_KINDS:  # the parent's budget counts what its sub-agent used
            budgets.use(tx, kind, max(0, int(outcome.usage.get(kind, 0))))
    # A job's result, or a child's own report (`_running` checked the source): nothing to close.
    if outcome.ok:
        work.settle(tx, w, result=outcome.value, close=None)
    else:
        work.settle(tx, w, error=outcome.error or "tool failed", close=None, exception=outcome.exception)


def _llm(tx: Tx, outcome: WorkOutcome) -> None:
    w = _running(tx, outcome)
    if _retried(tx, w, outcome):
        return
    if not outcome.ok:
        work.fail_llm(tx, w, outcome.error or "llm failed", outcome.exception)
        return
    try:
        reply = parse_llm_reply(outcome.value)
    except InvalidLlmReply as exc:
        work.fail_llm(tx, w, str(exc))
        return
    work.record_llm(tx, w, reply)


_HANDLERS: dict[str, Callable[[Tx, WorkOutcome], None]] = {
    "deadline": _deadline,
    "decide": _decide,
    "llm": _llm,
    "tool": _tool,
}
