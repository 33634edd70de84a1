"""Interrupts: raise one, park what it covers, resume it (docs/rules.md, I1-I13).

An anchored interrupt parks its branch from the anchor down; a global one parks the
whole session. Parking voids the region's model calls and decide job in flight and
holds its queued triggers (I4, I6a); resuming delivers `interrupt.resumed` to the
interrupt's turn if it is active, or holds its origin to be decided afresh (I9).
"""

from typing import Any

from parley.dispatcher.core import budgets
from parley.dispatcher.core.effects import IndexAdd, IndexRemove
from parley.dispatcher.core.transition import Tx
from parley.dispatcher.core.triggers import fire, hold, one_model_call, proposes_llm, release
from parley.schemas.actions import InterruptAction
from parley.schemas.jobs import JobKind
from parley.schemas.state import Interrupt, QueuedTrigger, Turn


def raise_interrupt(tx: Tx, origin: QueuedTrigger | None, turn: Turn | None, action: InterruptAction,
                    anchored: bool = True, system: bool = False, call: str | None = None) -> Interrupt:
    """Open an interrupt at the turn's tip (I2; global when not anchored, I3) and park. `call`:
    the tool call whose code asked it (core/asks.py), which its answer goes to."""
    c = tx.c
    iid = action.interrupt_id or tx.mint("int")  # I1
    anchor = turn.tip if turn is not None and anchored else None
    now = tx.ctx.now_ms
    rec = Interrupt(id=iid, reason=action.reason, payload=action.payload, anchor=anchor,
                    turn=turn.id if turn else None, origin=origin, raised_at=now,
                    timeout_s=action.timeout_s,
                    deadline=now + int(action.timeout_s * 1000) if action.timeout_s else None,
                    default=action.default, resumable_by=action.resumable_by, system=system,
                    response_schema=action.response_schema, call=call,
                    trace=tx.trace_of(turn.id) if turn is not None else None)
    c.interrupts[iid] = rec
    tx.count("interrupt_raised", "global" if anchor is None else "anchored")
    tx.emit("interrupt.raised", interrupt_id=iid, reason=rec.reason, payload=rec.payload, anchor=anchor,
            **({"call_id": call} if call is not None else {}))
    tx.effect(IndexAdd(seq=tx.next_seq(), interrupt_id=iid, reason=rec.reason, anchor=anchor,
                       raised_at=rec.raised_at, deadline=rec.deadline,
                       parent=c.parent["session"] if c.parent else None, payload=rec.payload,
                       default=rec.default, resumable_by=rec.resumable_by, metadata=c.metadata,
                       response_schema=rec.response_schema))
    park(tx, rec)
    return rec


def raise_budget(tx: Tx, exceeded: str, turn: Turn | None, origin: QueuedTrigger | None) -> Interrupt:
    """I3: the engine's own global `budget` interrupt."""
    action = InterruptAction(reason="budget", payload=budgets.stop_payload(tx, exceeded))
    return raise_interrupt(tx, origin, turn, action, anchored=False, system=True)


def origin_of(item: QueuedTrigger) -> QueuedTrigger:
    """The origin a new interrupt records. Asked again while deciding a resume, it is the
    resume's own origin — not the resume, which would nest one level deeper per question
    — proposing what the resume proposed, without the interrupt a budget stop had blocked
    (raised now: proposing it again would ask forever)."""
    if item.trigger["type"] != "interrupt.resumed" or not isinstance(item.trigger.get("origin"), dict):
        return item
    return QueuedTrigger(trigger=item.trigger["origin"], turn=item.turn,
                         proposed=[a for a in item.proposed if a.get("type") != "interrupt"])


# ---- parking (I4, I6a) ---------------------------------------------------------------------------


def park(tx: Tx, rec: Interrupt) -> None:
    """I4, I6a: void the region's LLM calls and decide in flight; hold its queued triggers."""
    _void_llm_calls(tx, rec)
    c = tx.c
    deciding = c.deciding
    if deciding is not None and deciding.item.turn is not None:
        turn = c.turns[deciding.item.turn]
        if tx.in_region(turn.tip, rec.anchor):
            c.deciding = None
            tx.cancel(JobKind.DECIDE, deciding.work, deciding.attempt)
            hold(tx, deciding.item, turn)
    keep: list[QueuedTrigger] = []
    for item in c.queue:
        owner = c.turns.get(item.turn) if item.turn else None
        if owner is not None and not item.bypass and tx.in_region(owner.tip, rec.anchor):
            hold(tx, item, owner)
        else:
            keep.append(item)
    c.queue = keep


def _void_llm_calls(tx: Tx, rec: Interrupt) -> None:
    c = tx.c
    for w in list(c.work.values()):
        if w.kind != "llm" or not tx.in_region(c.turns[w.turn].tip, rec.anchor):
            continue
        del c.work[w.id]
        tx.count("llm_voided", "park")
        tx.emit("llm.voided", call_id=w.id, interrupt_id=rec.id)
        tx.cancel(JobKind.LLM, w.id, w.attempt)
        call = {"type": "llm.call", **(w.arguments or {})}
        if w.turn == rec.turn or w.origin is None:
            rec.voided_llm = True  # comes back as the resume's llm.call
            rec.voided_call = call
        else:
            # Another turn's call (a global pause): its trigger is decided again later,
            # proposing just that call (what its decision had already applied stays).
            redo = hold(tx, w.origin.model_copy(update={"proposed": [call]}), c.turns[w.turn])
            one_model_call(tx, redo)


# ---- resuming (I9, I11) --------------------------------------------------------------------------


def resume(tx: Tx, rec: Interrupt, payload: Any, timed_out: bool, principal: str | None,
           source: dict[str, Any] | None = None) -> None:
    """Close the interrupt and deliver its resume (or hold its origin when its turn is not
    active). `principal` is the dispatcher-verified signer, or None (unsigned, or a deadline);
    `source` the reference of the resume's input entry (None for a deadline)."""
    c = tx.c
    tx.out.waits.append(max(0, tx.ctx.now_ms - rec.raised_at) / 1000)
    del c.interrupts[rec.id]
    c.resumed.append(rec.id)
    tx.effect(IndexRemove(seq=tx.next_seq(), interrupt_id=rec.id))
    turn = c.turns.get(rec.turn) if rec.turn else None
    if rec.call is not None:
        from parley.dispatcher.core import asks  # it raises its questions through this module

        asks.answered(tx, rec, payload)  # the answer goes to the call, which runs again
    proposed = _resume_proposed(tx, rec, turn, payload, timed_out, principal)
    if rec.system:
        budgets.apply_new_limits(tx, payload)
        if _still_spent(tx, rec, turn, proposed, payload, timed_out, principal, source):
            return
    delivered = rec.anchor is None or (turn is not None and tx.is_active(turn))
    # (a tool's question is answered to its call, whatever parks the branch now)
    _emit_resumed(tx, rec, payload, delivered or rec.call is not None, timed_out, principal, source)
    origin = rec.origin
    if rec.call is not None and not proposed:
        # A tool's question: its answer went to the call. No trigger, unless the pause voided a
        # model call to propose again (below); what the park held goes on now (I10).
        release(tx, turn)
        release(tx, tx.turn_of(c.head))
        return
    if delivered:
        # `reason` and `request` say which question this answers: an app that asks one
        # question still sees the engine's own (a budget stop), and must tell them apart.
        fields: dict[str, Any] = {"interrupt_id": rec.id, "reason": rec.reason, "request": rec.payload,
                                  "payload": payload, "timed_out": timed_out,
                                  "origin": origin.trigger if origin else None}
        if origin is not None and origin.trigger.get("call_id") is not None:
            fields["call_id"] = origin.trigger["call_id"]
        fire(tx, "interrupt.resumed", turn, proposed, bypass=True, **fields)
    elif origin is not None and turn is not None:
        # I9: nothing delivered; the origin is decided afresh when the branch is active again.
        one_model_call(tx, hold(tx, origin.model_copy(update={"proposed": proposed}), turn))


def _resume_proposed(tx: Tx, rec: Interrupt, turn: Turn | None, payload: Any, timed_out: bool,
                     principal: str | None) -> list[dict[str, Any]]:
    """What the resume proposes: its origin's proposed actions (for the engine's approval
    question, what its answer says to do with the call), and the model call the pause voided
    unless one is already coming ("go on as if never paused": one call at most)."""
    if rec.approves is not None:
        from parley.dispatcher.core import approvals  # it raises its questions through this module

        proposed = approvals.answered(tx, rec, payload, timed_out, principal)
    else:
        proposed = [dict(a) for a in (rec.origin.proposed if rec.origin else [])]
    held_llm = turn is not None and any(proposes_llm(h.proposed) for h in turn.held)
    if rec.voided_llm and not held_llm and not proposes_llm(proposed):
        call = dict(rec.voided_call or {"type": "llm.call"})
        # Before an approval's settle (a no): the call is then pending when the settle's
        # tool.completed looks, so that proposes no second one.
        proposed = [call, *proposed] if rec.approves is not None else [*proposed, call]
    return proposed


def _still_spent(tx: Tx, rec: Interrupt, turn: Turn | None, proposed: list[dict[str, Any]],
                 payload: Any, timed_out: bool, principal: str | None,
                 source: dict[str, Any] | None) -> bool:
    """I3: a budget resume that leaves a limit spent is not delivered: it raises again at once."""
    origin = rec.origin
    origin_call = origin.trigger.get("call_id") if origin else None
    still = budgets.actions_exceed(tx, proposed, origin_call) or (
        "tokens" if budgets.tokens_spent(tx) else None)
    if still is None:
        return False
    _emit_resumed(tx, rec, payload, False, timed_out, principal, source)
    again = origin.model_copy(update={"proposed": proposed}) if origin else None
    new = raise_budget(tx, still, turn, again)
    if again is None and rec.voided_llm:
        new.voided_llm, new.voided_call = True, rec.voided_call
    return True


def withdraw(tx: Tx, rec: Interrupt, why: str) -> None:
    """Take back the open interrupt `rec`, unanswered: it parks nothing any more and whoever
    was told of it is told so (`interrupt.cancelled`, `why`); a late answer to it is ignored
    `already_resumed`. Its turn may go on now (I10)."""
    del tx.c.interrupts[rec.id]
    tx.c.resumed.append(rec.id)
    tx.effect(IndexRemove(seq=tx.next_seq(), interrupt_id=rec.id))
    tx.emit("interrupt.cancelled", interrupt_id=rec.id, reason=rec.reason, request=rec.payload, why=why)
    tx.interrupt_span(rec, "cancelled", **{"parley.interrupt.why": why})
    release(tx, tx.c.turns.get(rec.turn) if rec.turn else None)


def _emit_resumed(tx: Tx, rec: Interrupt, payload: Any, delivered: bool, timed_out: bool,
                  principal: str | None, source: dict[str, Any] | None) -> None:
    tx.count("interrupt_resumed", "delivered" if delivered else "not_delivered")
    optional = {"principal": principal, "input": source, "call_id": rec.call}
    tx.emit("interrupt.resumed", interrupt_id=rec.id, reason=rec.reason, request=rec.payload,
            payload=payload, delivered=delivered, timed_out=timed_out,
            **{k: v for k, v in optional.items() if v is not None})
    tx.interrupt_span(rec, "timed_out" if timed_out else "resumed", **{
        "parley.interrupt.principal": principal, "parley.interrupt.default_used": timed_out,
        "parley.interrupt.delivered": delivered})
