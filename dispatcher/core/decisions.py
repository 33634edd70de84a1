"""Decisions: one trigger decided at a time, each decision validated whole, then applied.

`pump` takes the next queued trigger to a decide job (or applies its proposed actions
when the app does not decide that type). A decision is checked before anything of it is
applied (docs/protocol.md, "Actions"); an invalid one fails as `decision.failed` and
changes nothing else. Each action type has its own small applier, routed by `_APPLY`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parley.dispatcher.core import approvals, budgets, interrupts, work
from parley.dispatcher.core.transition import Tx
from parley.dispatcher.core.triggers import (
    default_call,
    hand_back_model_call,
    hold,
    must_wait,
    release,
    trigger_ref,
)
from parley.schemas import answers
from parley.schemas.actions import (
    RECORDING_ACTIONS,
    Action,
    Decision,
    InterruptAction,
    LlmCall,
    MessageAction,
    ToolError,
    ToolExecute,
    ToolResult,
)
from parley.schemas.approvals import APPROVAL_REASON
from parley.schemas.jobs import JobKind
from parley.schemas.results import AppException
from parley.schemas.state import Deciding, QueuedTrigger, Turn

#: actions that start work: a parked branch starts none (I12)
WORK_ACTIONS = frozenset({"llm.call", "tool.execute"})
#: triggers about one call: a decision that leaves it waiting settles it, so no turn waits forever
CALL_TRIGGERS = ("tool.execute", "interrupt.resumed")


class InvalidDecision(ValueError):
    """A decision that breaks an action rule; its message is the `decision.failed` error."""


# ---- one at a time -------------------------------------------------------------------------------


def pump(tx: Tx) -> None:
    """Decide queued triggers until one waits for its decide job (or none is left)."""
    c = tx.c
    while c.deciding is None and c.queue:
        item = c.queue.pop(0)
        turn = c.turns.get(item.turn) if item.turn else None
        if must_wait(tx, item, turn):
            assert turn is not None
            hold(tx, item, turn)
            continue
        if tx.app.needs_decide(item.trigger["type"]):
            c.deciding = Deciding(work=tx.mint("dec"), attempt=1, item=item)
            enqueue_decide(tx, c.deciding)
        else:
            apply_decision(tx, item, Decision.model_validate({"actions": item.proposed}))


def enqueue_decide(tx: Tx, deciding: Deciding) -> None:
    item = deciding.item
    tx.enqueue(JobKind.DECIDE, deciding.work, deciding.attempt,
               {"trigger": item.trigger, "proposed": {"actions": item.proposed}},
               tx.ctx.limits.decide_timeout_s, turn=item.turn)


# ---- validating ----------------------------------------------------------------------------------


@dataclass
class _Check:
    """The state of one decision's validation: what its earlier actions opened or closed."""

    tx: Tx
    item: QueuedTrigger
    turn: Turn | None
    seen_interrupt: bool = False
    settled: set[str] = field(default_factory=set)
    executed: set[str] = field(default_factory=set)
    new_ids: set[str] = field(default_factory=set)

    def action(self, where: str, action: Action) -> None:
        if self.seen_interrupt and action.type not in RECORDING_ACTIONS:
            raise InvalidDecision(f"{where}: only recording actions may follow an interrupt")
        if isinstance(action, InterruptAction):
            self.interrupt(where, action)
            return
        if self.turn is None:
            raise InvalidDecision(f"{where}: the trigger has no branch to act on")
        if isinstance(action, ToolResult | ToolError):
            self.settles(where, action.call_id or default_call(self.item))
        elif isinstance(action, ToolExecute):
            self.tool_execute(where, action)

    def interrupt(self, where: str, action: InterruptAction) -> None:
        if action.reason == APPROVAL_REASON:
            # the engine's own questions: one a decision raised would look like an approval
            # to an approver, and approve nothing
            raise InvalidDecision(f"{where}: reason {APPROVAL_REASON!r} is the engine's own; declare "
                                  "`needs_approval` on the tool instead")
        iid = action.interrupt_id
        c = self.tx.c
        if iid is not None and (iid in c.interrupts or iid in c.resumed or iid in self.new_ids):
            raise InvalidDecision(f"{where}: interrupt id {iid!r} is already used (I1)")
        if iid is not None:
            self.new_ids.add(iid)
        if action.response_schema is not None:
            typed_answer(where, action)
        self.seen_interrupt = True

    def settles(self, where: str, cid: str | None) -> None:
        if cid is None:
            raise InvalidDecision(f"{where}: no call to settle")
        w = work.open_tool(self.tx, cid)
        if w is None or cid in self.settled | self.executed:
            raise InvalidDecision(f"{where}: call {cid!r} is not open")
        if w.turn != self.item.turn:
            raise InvalidDecision(f"{where}: call {cid!r} belongs to another turn")
        self.settled.add(cid)

    def tool_execute(self, where: str, action: ToolExecute) -> None:
        """Either an existing call (`call_id?`) or a new one (`name`, `arguments?`): a field of
        the other form would be silently dropped, running something the app did not ask for."""
        if action.name is None:
            if action.arguments is not None:
                raise InvalidDecision(f"{where}: `arguments` needs a `name` (a new call); an "
                                      "existing call runs with its own arguments")
            self.executes(where, action.call_id or default_call(self.item))
        elif action.call_id is not None:
            raise InvalidDecision(f"{where}: `call_id` and `name` exclude each other: `call_id` runs "
                                  "an existing call, `name` starts a new one")

    def executes(self, where: str, cid: str | None) -> None:
        w = work.open_tool(self.tx, cid)
        if cid is None or w is None or w.status != "new" or cid in self.settled | self.executed:
            raise InvalidDecision(f"{where}: call {cid!r} is not waiting to run")
        if w.turn != self.item.turn:
            raise InvalidDecision(f"{where}: call {cid!r} belongs to another turn")
        self.executed.add(cid)


def typed_answer(where: str, action: InterruptAction) -> None:
    """A response_schema must be a valid schema within the size limit, and the `default` a
    deadline would deliver must match it: else the interrupt could never be answered, or its
    deadline would deliver what no person could have sent."""
    assert action.response_schema is not None
    problem = answers.schema_problem(action.response_schema)
    if problem is not None:
        raise InvalidDecision(f"{where}: response_schema {problem}")
    if action.timeout_s is None and "default" not in action.model_fields_set:
        return
    wrong = answers.mismatch(action.response_schema, action.default)
    if wrong is not None:
        raise InvalidDecision(f"{where}: default does not match response_schema: {wrong.message} "
                              f"at {wrong.path}")


def validate(tx: Tx, item: QueuedTrigger, turn: Turn | None, decision: Decision) -> None:
    """A decision is validated whole before anything of it is applied."""
    check = _Check(tx, item, turn)
    for n, action in enumerate(decision.actions, 1):
        check.action(f"action {n} ({action.type})", action)


# ---- applying ------------------------------------------------------------------------------------


def apply_decision(tx: Tx, item: QueuedTrigger, decision: Decision) -> None:
    turn = tx.c.turns.get(item.turn) if item.turn else None
    try:
        validate(tx, item, turn, decision)
    except InvalidDecision as exc:
        decision_failed(tx, item, str(exc))
        return
    if turn is not None and tx.parking(turn.tip) and any(a.type in WORK_ACTIONS for a in decision.actions):
        # I12 before I6a: a parked branch starts no work, so a decision that would start
        # some is dropped unapplied and its trigger held, to be decided again after resume.
        hold(tx, item, turn)
        return
    exceeded = budgets.decision_exceeds(tx, decision, default_call(item))
    if exceeded is not None:
        # I3: a spent budget pauses the whole session; the blocked decision comes back
        # as the resume's proposed actions.
        blocked = item.model_copy(update={"proposed": decision.to_wire()["actions"]})
        interrupts.raise_budget(tx, exceeded, turn, blocked)
        return
    for action in decision.actions:
        tx.count("action", action.type)
        _APPLY[type(action)](tx, item, turn, action)
    # Gated calls it tried to run are asked about now, after the rest: an approval parks
    # the branch, and work started by the same decision must not start on a parked one (I12).
    approvals.ask_pending(tx)
    if item.trigger["type"] in CALL_TRIGGERS and not any(a.type == "interrupt" for a in decision.actions):
        # A decision that neither runs, settles nor asks about its call would leave the
        # turn waiting forever: the call is settled as the tool error `not_executed`.
        w = work.open_tool(tx, default_call(item))
        if w is not None and w.status == "new" and w.turn == item.turn and not approvals.asking(tx, w):
            work.settle(tx, w, error="not_executed")
    after_decision(tx, item)


def _llm_call(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: LlmCall) -> None:
    assert turn is not None
    work.start_llm(tx, turn, action.model, action.params, origin=item)


def _tool_execute(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: ToolExecute) -> None:
    assert turn is not None
    if action.name is not None:
        work.new_call(tx, turn, action.name, action.arguments or {})
        return
    cid = action.call_id or default_call(item)
    assert cid is not None
    work.run_call(tx, tx.c.work[cid])


def _tool_result(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: ToolResult) -> None:
    work.settle(tx, tx.c.work[action.call_id or default_call(item) or ""], result=action.result)


def _tool_error(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: ToolError) -> None:
    work.settle(tx, tx.c.work[action.call_id or default_call(item) or ""], error=action.error)


def _message(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: MessageAction) -> None:
    assert turn is not None
    tx.append(turn, {"role": "assistant", "content": action.content})


def _interrupt(tx: Tx, item: QueuedTrigger, turn: Turn | None, action: InterruptAction) -> None:
    interrupts.raise_interrupt(tx, interrupts.origin_of(item), turn, action)


_APPLY: dict[type[Any], Callable[[Tx, QueuedTrigger, Turn | None, Any], None]] = {
    LlmCall: _llm_call, ToolExecute: _tool_execute, ToolResult: _tool_result, ToolError: _tool_error,
    MessageAction: _message, InterruptAction: _interrupt,
}


def after_decision(tx: Tx, item: QueuedTrigger) -> None:
    hand_back_model_call(tx, item)
    if item.trigger["type"] == "interrupt.resumed":
        # I10: released right after the decision of the resume that unparked the turn.
        release(tx, tx.c.turns.get(item.turn) if item.turn else None)
        release(tx, tx.turn_of(tx.c.head))


def decision_failed(tx: Tx, item: QueuedTrigger, error: str, exception: AppException | None = None) -> None:
    """`exception`: what the app's decide raised, when it raised (in the event and on the
    settled call's tool message, for the app's author)."""
    tx.emit("decision.failed", trigger=trigger_ref(item), error=error,
            exception=exception.model_dump() if exception is not None else None)
    if item.trigger["type"] in CALL_TRIGGERS:
        # The call is settled as `decision_failed`, so a turn never waits forever.
        w = work.open_tool(tx, default_call(item))
        if w is not None and w.status == "new":
            work.settle(tx, w, error="decision_failed", exception=exception)
    after_decision(tx, item)
