"""Closing a session: it refuses every later input and runs nothing more.

Today only a dispatcher closes a session: the child of a sub-agent call whose parent stopped
waiting (its time limit passed, or its call was settled otherwise). Everything still open is
stopped here, in one place, so a closed session holds no work, no trigger, no interrupt;
`inputs.apply_input` refuses what comes next (`session_closed`) and `outcomes.apply_outcome`
drops what is still on its way.
"""

from parley.dispatcher.core import work
from parley.dispatcher.core.effects import IndexRemove
from parley.dispatcher.core.retention import retire
from parley.dispatcher.core.transition import Tx
from parley.schemas.codes import SessionStatus
from parley.schemas.jobs import JobKind
from parley.schemas.state import Core


def is_closed(core: Core | None) -> bool:
    return core is not None and core.status == SessionStatus.CLOSED


def close_session(tx: Tx, reason: str) -> None:
    """Stop everything the session runs and mark it closed: open calls (their queued jobs are
    taken off their queues, children closed in turn), the decide in flight, queued and held
    triggers, open interrupts (out of the index, so nobody is asked to answer them)."""
    c = tx.c
    for w in list(c.work.values()):
        work.abandon(tx, w)
    c.work.clear()
    if c.deciding is not None:
        tx.cancel(JobKind.DECIDE, c.deciding.work, c.deciding.attempt)
        c.deciding = None
    c.queue.clear()
    for rec in c.interrupts.values():
        tx.effect(IndexRemove(seq=tx.next_seq(), interrupt_id=rec.id))
        # the question is gone: whoever was told of it (an inbox, the feed's notifiers) is told so
        tx.emit("interrupt.cancelled", interrupt_id=rec.id, reason=rec.reason, request=rec.payload,
                why=reason)
    c.interrupts.clear()
    # No turn completes: nothing of it ran to its end. The held gauge follows (turns.finish).
    c.turns.clear()
    c.status = SessionStatus.CLOSED
    tx.emit("session.closed", reason=reason)
    retire(tx)  # archived, and its keys deleted once its retention ends
