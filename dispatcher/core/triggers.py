"""Triggers: fired, queued, held while their branch is parked, released in order.

A session decides one trigger at a time, in the order fired (docs/protocol.md,
"Triggers"). A trigger of a parked turn is *held* on its turn and goes back on the
queue, in the order held, once the turn is active and unparked (I6, I10).
"""

from typing import Any

from parley.dispatcher.core.transition import Tx
from parley.schemas.state import QueuedTrigger, Turn


def trigger_ref(item: QueuedTrigger) -> dict[str, Any]:
    """How events name a trigger: its type and the ids it is about."""
    t = item.trigger
    ref: dict[str, Any] = {"type": t["type"]}
    for key in ("call_id", "interrupt_id"):
        if t.get(key) is not None:
            ref[key] = t[key]
    if isinstance(t.get("message"), dict):
        ref["message_id"] = t["message"]["id"]
    return ref


def default_call(item: QueuedTrigger) -> str | None:
    """The call a trigger is about: what tool.* actions without a `call_id` act on."""
    call = item.trigger.get("call_id")
    return call if isinstance(call, str) else None


def proposes_llm(actions: list[dict[str, Any]]) -> bool:
    return any(a.get("type") == "llm.call" for a in actions)


def must_wait(tx: Tx, item: QueuedTrigger, turn: Turn | None) -> bool:
    """I10: while a turn has held triggers (or is parked), its triggers queue behind them;
    only a fresh interrupt.resumed goes past (I9)."""
    return turn is not None and not item.bypass and bool(turn.held or tx.parking(turn.tip))


def fire(tx: Tx, trigger_type: str, turn: Turn | None, proposed: list[dict[str, Any]],
         bypass: bool = False, **fields: Any) -> None:
    trigger = {"type": trigger_type, "session": tx.session, "head": turn.tip if turn else None, **fields}
    item = QueuedTrigger(trigger=trigger, proposed=proposed, turn=turn.id if turn else None, bypass=bypass)
    tx.count("trigger", trigger_type)
    if must_wait(tx, item, turn):
        assert turn is not None
        item = hold(tx, item, turn)
    else:
        tx.c.queue.append(item)
    one_model_call(tx, item)


def one_model_call(tx: Tx, newest: QueuedTrigger) -> None:
    """At most one model call is proposed among a turn's undecided triggers. A proposal was
    right when its trigger fired (nothing pending then), but an earlier decision may have
    started work since, whose completion proposes again: the newest proposal replaces those
    still waiting (queued or held). One already out at a decide job is never changed: the
    newest withholds its own until that decision ends (`hand_back_model_call`)."""
    if newest.turn is None or not proposes_llm(newest.proposed):
        return
    out = tx.c.deciding.item if tx.c.deciding is not None else None
    for waiting, i, item in _waiting(tx, newest.turn):
        if not proposes_llm(item.proposed):
            continue
        if item is not newest:
            waiting[i] = _without_model_call(item)
        elif out is not None and out.turn == newest.turn and proposes_llm(out.proposed):
            waiting[i] = _without_model_call(item).model_copy(update={"llm_withheld": True})


def hand_back_model_call(tx: Tx, decided: QueuedTrigger) -> None:
    """`decided`, which proposed a model call, is done (applied or failed). When nothing of its
    turn is open now, the newest trigger that withheld its own call gets it back, so the turn
    still goes on to the model with what completed meanwhile."""
    if decided.turn is None or not proposes_llm(decided.proposed):
        return
    withheld = [(seq, i) for seq, i, item in _waiting(tx, decided.turn) if item.llm_withheld]
    # Work of the turn still open (a model call, or a tool whose completion will propose
    # its own): nothing to hand back, as when the trigger fired.
    busy = any(w.turn == decided.turn for w in tx.c.work.values())
    for n, (seq, i) in enumerate(withheld):
        item = seq[i].model_copy(update={"llm_withheld": False})
        if n == len(withheld) - 1 and not busy:
            item = item.model_copy(update={"proposed": [*item.proposed, {"type": "llm.call"}]})
        seq[i] = item


def _waiting(tx: Tx, turn_id: str) -> list[tuple[list[QueuedTrigger], int, QueuedTrigger]]:
    """The turn's undecided triggers not yet out: (the list holding it, its index, it), the
    session's queue first, then the turn's held ones."""
    turn = tx.c.turns.get(turn_id)
    return [(seq, i, item) for seq in (tx.c.queue, turn.held if turn is not None else [])
            for i, item in enumerate(seq) if item.turn == turn_id]


def _without_model_call(item: QueuedTrigger) -> QueuedTrigger:
    return item.model_copy(update={"proposed": [a for a in item.proposed if a.get("type") != "llm.call"]})


def hold(tx: Tx, item: QueuedTrigger, turn: Turn) -> QueuedTrigger:
    """Hold `item` on its turn; the trigger as held."""
    if item.bypass:  # the I9 exception covers the fresh delivery only, never a later release
        item = item.model_copy(update={"bypass": False})
    turn.held.append(item)
    tx.emit("decision.held", trigger=trigger_ref(item), head=turn.tip)
    return item


def release(tx: Tx, turn: Turn | None) -> None:
    """I10: held triggers go on, in the order held, once the turn is active and unparked."""
    if turn is None or not turn.held or not tx.is_active(turn) or tx.parking(turn.tip):
        return
    # "Go on as if never paused" asks for one model call at most: when several released
    # triggers propose one (a call voided by a global pause, and a completion recorded
    # while parked that found nothing pending), only the last keeps it.
    proposing = [i for i, item in enumerate(turn.held) if proposes_llm(item.proposed)]
    for i, item in enumerate(turn.held):
        if i in proposing[:-1]:
            item = _without_model_call(item)
        tx.emit("decision.released", trigger=trigger_ref(item), head=turn.tip)
        tx.c.queue.append(item)
    turn.held = []
