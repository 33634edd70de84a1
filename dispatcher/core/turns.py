"""The end of every transition: decide what is queued, complete the turns left idle.

A turn is complete when nothing of it is left: no open call, no queued, held or
deciding trigger, no open interrupt. A sub-agent's child reports to its parent then.
"""

from parley.dispatcher.core.closing import close_session
from parley.dispatcher.core.decisions import pump
from parley.dispatcher.core.effects import Stat, listing_move
from parley.dispatcher.core.retention import track_idle
from parley.dispatcher.core.transition import Transition, Tx
from parley.dispatcher.core.work import report
from parley.schemas.codes import CloseReason
from parley.schemas.listing import listed


def finish(tx: Tx) -> Transition:
    """Run what every transition ends with, and return it."""
    if tx.core is not None:
        pump(tx)
        complete_turns(tx)
        delta = tx.held_count() - tx.held_before
        if delta:  # the fleet-wide gauge of held decisions, kept exactly by the outbox
            tx.effect(Stat(seq=tx.next_seq(), field="held", delta=delta))
        list_session(tx)
        track_idle(tx)
    return tx.result()


def list_session(tx: Tx) -> None:
    """Keep the list of sessions (`parley sessions`) exact: when this transition created the
    session or changed its listing status (an interrupt opened: parked; the last one answered:
    active; closed), the outbox moves it, in the MULTI of its other effects. A transition that
    changes nothing of the listing asks for nothing."""
    after = listed(tx.core)
    if after is not None and after != tx.listed_before:
        tx.effect(listing_move(tx.next_seq(), tx.listed_before, after))


def complete_turns(tx: Tx) -> None:
    c = tx.c
    busy: set[str | None] = {w.turn for w in c.work.values()}
    busy.update(item.turn for item in c.queue)
    busy.update(i.turn for i in c.interrupts.values())
    if c.deciding is not None:
        busy.add(c.deciding.item.turn)
    for turn in list(c.turns.values()):
        if turn.id not in busy and not turn.held:
            del c.turns[turn.id]
            tx.emit("turn.completed", head=turn.tip)
            if report(tx, turn):
                # A child that answered its parent runs nothing more (only the engine starts
                # its turns): it is closed, so it is archived and expires like any session.
                close_session(tx, CloseReason.REPORTED, by_parent=True)
                return
