"""Closing a session: it refuses every later input and runs nothing more.

A client closes a session with `session.close` (docs/protocol.md); a dispatcher closes the
child of a sub-agent call whose parent stopped waiting (its time limit passed, the call was
settled otherwise, or the parent itself was closed). Everything still open is stopped here,
in one place, so a closed session holds no work, no trigger, no interrupt; `inputs.apply_input`
refuses or ignores what comes next (`session_closed`) and `outcomes.apply_outcome` drops what is
still on its way, recording the results of calls that were running as `tool.late`.
"""

from dataclasses import dataclass
from typing import Any

from parley.dispatcher.core import work
from parley.dispatcher.core.effects import IndexRemove
from parley.dispatcher.core.retention import retire
from parley.dispatcher.core.transition import Tx
from parley.schemas.codes import CallError, SessionStatus
from parley.schemas.jobs import JobKind
from parley.schemas.state import Core


@dataclass(frozen=True, slots=True)
class ClosedBy:
    """A client's close, as `session.closed` names it: its entry (an input reference) and
    its verified signer (None: unsigned)."""

    input: dict[str, Any]
    principal: str | None


def is_closed(core: Core | None) -> bool:
    return core is not None and core.status == SessionStatus.CLOSED


def close_session(tx: Tx, reason: str, by: ClosedBy | None = None, *, by_parent: bool = False) -> None:
    """Stop everything the session runs and mark it closed: open calls (their queued jobs are
    taken off their queues, a running model call is stopped by its worker, children closed in
    turn), the decide in flight, queued and held triggers, open interrupts (out of the index
    and the deadlines, so nobody is asked to answer them). `by`: a client's close (None: the
    engine's). `by_parent`: the parent's call stopped waiting for this child and closes it, so
    nothing is reported back; any other close of a child that has not reported fails its
    parent's call at once (a client's, the idle sweep's)."""
    c = tx.c
    c.running_at_close = {w.id: w for w in c.work.values() if w.kind == "tool" and w.status == "running"}
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
        tx.interrupt_span(rec, "cancelled", **{"parley.interrupt.why": reason})
    c.interrupts.clear()
    # No turn completes: nothing of it ran to its end. The held gauge follows (turns.finish).
    c.turns.clear()
    if not by_parent and c.parent is not None and not c.reported:
        # A sub-agent's child closed by anyone but its parent (a client, the idle sweep): the
        # parent's call still waits for a report, so it fails now rather than at its time limit.
        c.reported = True
        work.post_report(tx, c.parent, ok=False, error=CallError.SUBAGENT_CLOSED, usage=dict(c.used))
    c.status = SessionStatus.CLOSED
    told = {"input": by.input, "principal": by.principal} if by is not None else {}
    tx.emit("session.closed", reason=reason, **told)
    retire(tx)  # archived, and its keys deleted once its retention ends
