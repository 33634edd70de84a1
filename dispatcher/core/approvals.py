"""Approvals the engine enforces: a gated tool's call runs only once approved, for its digest.

A call of a tool declared `needs_approval` (`ToolInfo.approval`) reaches `work.run_call` like
any other, from a decision's `tool.execute` — whoever made that decision: the app's decide, the
proposed actions, or an outcome a compromised worker forged. There `gate` lets it run only
with an approval of this call, bound to the digest of its name and arguments, given by an
allowed principal and not used yet. Otherwise the call stays waiting and the engine asks: once
the decision's other actions are applied (`ask_pending`), it raises its own interrupt (reason
`approval`) about the call, resumable only by the approvers. The answer is recorded on the call
(`answered`); the resume proposes running it (yes) or settling it as a tool error (no, or the
deadline). No action of a decision can say "approved": only a resume of that interrupt can.
"""

from typing import Any

from parley.dispatcher.core import interrupts
from parley.dispatcher.core.transition import Tx
from parley.schemas.actions import InterruptAction
from parley.schemas.approvals import (
    APPROVAL_REASON,
    TIMED_OUT_ANSWER,
    ApprovalPolicy,
    answer_approves,
    call_digest,
    denial_error,
    question,
)
from parley.schemas.state import CallApproval, Interrupt, QueuedTrigger, Work

#: the `why` of the `interrupt.cancelled` of a question whose call was settled without it
WITHDRAWN = "call_settled"


def gate(tx: Tx, w: Work, policy: ApprovalPolicy) -> bool:
    """Whether the gated call `w` may run now (its approval is then used up). When it may not,
    it is asked about after the decision, unless its question is already open."""
    a = w.approval
    if a is not None and a.granted and not a.used and a.digest == call_digest(w.name or "", w.arguments) \
            and (policy.approvers is None or a.by in policy.approvers):
        a.used = True
        return True
    if not asking(tx, w) and w.id not in tx.asks:
        tx.asks.append(w.id)
    return False


def asking(tx: Tx, w: Work) -> bool:
    """Whether the call's approval question is open (the call waits for its answer)."""
    a = w.approval
    return a is not None and a.granted is None and a.interrupt_id in tx.c.interrupts


def ask_pending(tx: Tx) -> None:
    """Ask about every gated call the decision just applied tried to run."""
    asks, tx.asks = tx.asks, []
    for cid in asks:
        w = tx.c.work.get(cid)
        if w is not None and w.kind == "tool" and w.status == "new" and not asking(tx, w):
            ask(tx, w)


def ask(tx: Tx, w: Work) -> Interrupt:
    """Raise the engine's approval interrupt for `w`, anchored at its turn's tip.

    Its origin is the call's own `tool.execute` (proposing to run it), whatever trigger's
    decision tried to run it: the resume is about this call, so it settles it either way."""
    policy = tx.app.tools[w.name or ""].approval
    assert policy is not None
    turn = tx.c.turns[w.turn]
    digest = call_digest(w.name or "", w.arguments)
    trigger = {"type": "tool.execute", "session": tx.session, "head": turn.tip, "call_id": w.id,
               "name": w.name, "arguments": w.arguments or {}}
    origin = QueuedTrigger(trigger=trigger, proposed=[{"type": "tool.execute", "call_id": w.id}],
                           turn=turn.id)
    action = InterruptAction(
        reason=APPROVAL_REASON, payload=question(w.id, w.name or "", w.arguments, digest, policy),
        timeout_s=policy.timeout_s, default=dict(TIMED_OUT_ANSWER) if policy.timeout_s else None,
        resumable_by=list(policy.approvers) if policy.approvers is not None else None,
        response_schema=policy.schema)
    rec = interrupts.raise_interrupt(tx, origin, turn, action)
    rec.approves = w.id
    w.approval = CallApproval(interrupt_id=rec.id, digest=digest)
    tx.count("approval", "asked")
    return rec


def withdraw(tx: Tx, w: Work) -> None:
    """The call `w` was settled while its question was open (a decision answered it with
    `tool.result` or `tool.error`, or failed): the question goes, as a closed session's do
    (`interrupt.cancelled`, why `call_settled`), so it parks nothing any more; a late answer to
    it is ignored `already_resumed`."""
    assert w.approval is not None
    interrupts.withdraw(tx, tx.c.interrupts[w.approval.interrupt_id], WITHDRAWN)
    tx.count("approval", "withdrawn")


def answered(tx: Tx, rec: Interrupt, payload: Any, timed_out: bool, principal: str | None
             ) -> list[dict[str, Any]]:
    """Record the answer to approval interrupt `rec` on its call; what the resume proposes:
    run the call when an allowed principal said yes, else settle it as not approved. A call
    that is no longer open (settled meanwhile) proposes nothing."""
    w = tx.c.work.get(rec.approves or "")
    if w is None or w.approval is None or w.approval.interrupt_id != rec.id:
        return []
    allowed = rec.resumable_by is None or principal in rec.resumable_by
    granted = not timed_out and allowed and answer_approves(payload)
    w.approval.granted, w.approval.by = granted, principal
    tx.count("approval", "granted" if granted else "timed_out" if timed_out else "denied")
    if granted:
        return [{"type": "tool.execute", "call_id": w.id}]
    return [{"type": "tool.error", "call_id": w.id, "error": denial_error(payload, timed_out)}]


def audit(w: Work) -> dict[str, Any] | None:
    """What a gated call's `tool.started` / `tool.deferred` event says of the approval it ran
    under: which question, which digest, who said yes."""
    a = w.approval
    if a is None or not a.used:
        return None
    ref = {"interrupt_id": a.interrupt_id, "digest": a.digest}
    return ref if a.by is None else ref | {"principal": a.by}
