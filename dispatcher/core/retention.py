"""When a session's keys leave Redis: a closed session is retired, an open one may go idle.

Pure, like the rest of the core: the dispatcher's flags arrive as `Context.lifecycle`, and the
Redis side (the archive stream, the expiring and idle sets, the sweeps that read them) is the
shell's (dispatcher/enqueue.py, dispatcher/sweeps.py). Documented in docs/operations.md,
"Retention and archive", and docs/design.md, "Retention".
"""

from parley.dispatcher.core.context import Context
from parley.dispatcher.core.effects import Idle, Retire
from parley.dispatcher.core.transition import Tx
from parley.schemas.codes import SessionStatus
from parley.schemas.state import Core


def retire(tx: Tx) -> None:
    """The session has just closed: stamp when, and ask the shell to archive it and to
    schedule its expiry `retention` later (one effect, so both happen in one flush)."""
    c = tx.c
    if c.closed_at is None:
        c.closed_at = tx.ctx.now_ms
    tx.effect(Retire(seq=tx.next_seq(), closed_at=c.closed_at,
                     expires_at=c.closed_at + tx.ctx.lifecycle.retention_ms))


def keeps_awake(core: Core) -> bool:
    """Whether the session may not be closed as idle, however long since its last transition:
    an interrupt with a deadline is open (it has a timer to keep), or something of it is in
    flight — a decision, a queued trigger, a model call, a running tool or sub-agent call (a
    long call has no transition until it ends). What waits on the outside world with no timer
    (an interrupt without a deadline, a deferred call) does not keep it awake."""
    return (any(rec.deadline is not None for rec in core.interrupts.values())
            or core.deciding is not None or bool(core.queue)
            or any(w.status == "running" for w in core.work.values()))


def track_idle(tx: Tx) -> None:
    """At the end of every transition of an open session, when an idle timeout is configured:
    the session was active now, so it is idle `idle_timeout` from now (an `Idle` effect moves
    its place in the idle set), or never while it is kept awake (`keeps_awake`)."""
    timeout = tx.ctx.lifecycle.idle_timeout_ms
    c = tx.core
    if timeout is None or c is None or c.status != SessionStatus.OPEN:
        return
    c.active_at = tx.ctx.now_ms
    at = None if keeps_awake(c) else c.active_at + timeout
    tx.effect(Idle(seq=tx.next_seq(), at=at))


def is_idle(core: Core | None, ctx: Context) -> bool:
    """Whether the idle sweep's close still holds when it is applied: the session is open, an
    idle timeout is configured, no transition came since `active_at + timeout`, and nothing
    keeps it awake (`keeps_awake`). A close written before a late transition (the sweep
    read the idle set a moment too early, or another dispatcher moved the session on) is
    then ignored, never applied."""
    timeout = ctx.lifecycle.idle_timeout_ms
    if core is None or core.status != SessionStatus.OPEN or timeout is None or core.active_at is None:
        return False
    return ctx.now_ms >= core.active_at + timeout and not keeps_awake(core)
