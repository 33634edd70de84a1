"""Work: model calls, tool calls and sub-agents, from start to settled.

An LLM call (`llm-N`) sends the branch from its root to the head it was made at and
records the reply at its turn's tip; a tool call (`call-N`) runs as a job, waits for a
client (deferred), or runs as a child session (a sub-agent), and is settled as a tool
message that fires `tool.completed` (docs/protocol.md, "Triggers").

A sub-agent call waits for its child's report at most until its deadline (a timer in the
deadlines index); a parent that stops waiting, for that or any other reason, closes the
child, so nothing of it runs on for nobody (docs/protocol.md, "Sub-agents").
"""

from typing import Any

import orjson

from parley.dispatcher.core import approvals, budgets, interrupts
from parley.dispatcher.core.context import ToolInfo
from parley.dispatcher.core.effects import Close, DeadlineAdd, DeadlineRemove, Report, Spawn
from parley.dispatcher.core.transition import Tx
from parley.dispatcher.core.triggers import fire
from parley.schemas.codes import CallError, CloseReason, SessionStatus
from parley.schemas.ids import subagent_deadline
from parley.schemas.inputs import ParentLink
from parley.schemas.jobs import JobKind
from parley.schemas.llm import LlmReply
from parley.schemas.results import AppException, WorkOutcome
from parley.schemas.state import Interrupt, QueuedTrigger, Turn, Work
from parley.schemas.view import public_message

#: attempts of one job lost with its worker before it counts as failed
MAX_ATTEMPTS = 3


def open_tool(tx: Tx, call_id: str | None) -> Work | None:
    w = tx.c.work.get(call_id) if call_id else None
    return w if w is not None and w.kind == "tool" else None


def pending(tx: Tx, turn_id: str) -> list[str]:
    """The turn's open calls, in the order they were made."""
    def order(w: Work) -> tuple[str, int]:
        kind, _, n = w.id.rpartition("-")
        return (kind, int(n) if n.isdigit() else 0)
    return [w.id for w in sorted(tx.c.work.values(), key=order) if w.turn == turn_id]


# ---- model calls ---------------------------------------------------------------------------------


def start_llm(tx: Tx, turn: Turn, model: str | None = None, params: dict[str, Any] | None = None,
              origin: QueuedTrigger | None = None) -> None:
    lid = tx.mint("llm")
    budgets.use(tx, "llm_calls")
    extras = {k: v for k, v in (("model", model), ("params", params)) if v is not None}
    w = Work(id=lid, kind="llm", turn=turn.id, status="running", attempt=0, head=turn.tip,
             origin=origin, arguments=extras)
    tx.c.work[lid] = w
    tx.emit("llm.started", call_id=lid, head=turn.tip)
    enqueue_llm(tx, w)


def enqueue_llm(tx: Tx, w: Work) -> None:
    """(Re)send an LLM call: the branch root -> the head it was made at, never later messages.

    The job names the branch's messages (`chain`, root first) and the worker reads their bodies
    (workers/jobs.py `run_llm`): messages are never changed once written, and this commit writes
    the ones it adds before the job can run, so the worker reads exactly the branch as of now
    (docs/design.md, "Storage"). The transition reads no body, and the job stays small."""
    assert w.head is not None
    w.attempt += 1
    chain = list(tx.ancestors(w.head))
    chain.reverse()
    tx.enqueue(JobKind.LLM, w.id, w.attempt, {"chain": chain, "request": dict(w.arguments or {})},
               tx.ctx.limits.llm_timeout_s, turn=w.turn)


def record_llm(tx: Tx, w: Work, reply: LlmReply) -> None:
    """The model's reply as an assistant message; its tool calls become `call-N` calls, each
    fired as `tool.execute` (the model's own ids are rewritten: docs/protocol.md, Messages)."""
    c = tx.c
    del c.work[w.id]
    turn = c.turns[w.turn]
    calls = []
    for call in reply.tool_calls:
        cid = tx.mint("call")
        calls.append({"id": cid, "name": call.name, "arguments": call.arguments})
        c.work[cid] = Work(id=cid, kind="tool", turn=turn.id, name=call.name, arguments=call.arguments)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if calls:
        message["tool_calls"] = calls
    m = tx.append(turn, message)
    tx.emit("llm.completed", call_id=w.id, head=w.head, message_id=m["id"])
    if reply.tokens:
        budgets.use(tx, "tokens", reply.tokens)
    if budgets.tokens_spent(tx) and not any(i.system for i in c.interrupts.values()):
        # Tokens are counted after the reply: it stays, its follow-ons are held (I3, I6).
        interrupts.raise_budget(tx, "tokens", turn, None)
    if calls:
        for made in calls:
            fire(tx, "tool.execute", turn, [{"type": "tool.execute"}], call_id=made["id"],
                 name=made["name"], arguments=made["arguments"])
    else:
        fire(tx, "llm.completed", turn, [], message=public_message(m))
    turn.replied = not calls


def fail_llm(tx: Tx, w: Work, error: str, exception: AppException | None = None) -> None:
    del tx.c.work[w.id]
    tx.emit("llm.failed", call_id=w.id, head=w.head, error=error,
            exception=exception.model_dump() if exception is not None else None)
    fire(tx, "llm.failed", tx.c.turns[w.turn], [], call_id=w.id, error=error)


# ---- tool calls ----------------------------------------------------------------------------------


def new_call(tx: Tx, turn: Turn, name: str, arguments: dict[str, Any]) -> None:
    """A call the app starts itself: its assistant message first, so transcripts stay valid."""
    cid = tx.mint("call")
    tx.append(turn, {"role": "assistant", "content": "",
                     "tool_calls": [{"id": cid, "name": name, "arguments": arguments}]})
    tx.c.work[cid] = Work(id=cid, kind="tool", turn=turn.id, name=name, arguments=arguments)
    run_call(tx, tx.c.work[cid])


def run_call(tx: Tx, w: Work) -> None:
    tool = tx.app.tools.get(w.name or "")
    if tool is None:
        settle(tx, w, error="unknown_tool")
        return
    if tool.approval is not None and not approvals.gate(tx, w, tool.approval):
        return  # it waits, and the engine asks about it (core/approvals.py)
    approval = approvals.audit(w)
    if tool.agent:
        spawn(tx, w, tool.agent, tool.timeout_s or tx.ctx.limits.subagent_timeout_s, approval)
        return
    if tool.deferred:
        w.status = "deferred"
        tx.emit("tool.deferred", call_id=w.id, name=w.name, arguments=w.arguments or {}, approval=approval)
        return
    w.status = "running"
    budgets.use(tx, "tool_calls")
    tx.emit("tool.started", call_id=w.id, name=w.name, approval=approval)
    enqueue_tool(tx, w, tool)


def enqueue_tool(tx: Tx, w: Work, tool: ToolInfo) -> None:
    w.attempt += 1
    args: dict[str, Any] = {"name": w.name, "arguments": w.arguments or {}}
    if w.approval is not None:
        # The worker checks it too (workers/jobs.py): a dispatcher whose app lacks the tool's
        # `needs_approval` would otherwise run it unasked, where the workers' app has it.
        args["approval"] = w.approval.digest
    if w.answers:
        # the answers to its questions so far (core/asks.py): the run starts from the beginning
        # and its N-th `parley.interrupt()` returns the N-th
        args["answers"] = w.answers
    tx.enqueue(JobKind.TOOL, w.id, w.attempt, args, tool.timeout_s or tx.ctx.limits.tool_timeout_s,
               turn=w.turn)


def settle(tx: Tx, w: Work, result: Any = None, error: str | None = None, *,
           close: CloseReason | None = CloseReason.ABANDONED, exception: AppException | None = None) -> None:
    """Record a tool call's outcome as a tool message and fire `tool.completed`. `exception`:
    what the app's code raised, when that is the error (on the message and the event; never
    sent to a model by Parley's adapters, which send a tool message's content alone).

    A sub-agent call settled by anything but its child's own report (`close=None`) leaves a
    child nobody waits for: it is closed, for `close`."""
    del tx.c.work[w.id]
    if w.child is not None:
        end_child(tx, w, close)
    if approvals.asking(tx, w):
        approvals.withdraw(tx, w)  # settled otherwise: nobody need approve it any more
    question = _question_of(tx, w) if w.status == "asking" else None
    if question is not None:  # settled while its code waits for an answer: nobody need give one
        interrupts.withdraw(tx, question, approvals.WITHDRAWN)
    turn = tx.c.turns[w.turn]
    if error is not None:
        content = error
    elif isinstance(result, str):
        content = result
    else:
        content = orjson.dumps(result).decode()
    message: dict[str, Any] = {"role": "tool", "content": content, "tool_call_id": w.id}
    if error is not None:
        message["error"] = True
    if exception is not None:
        message["exception"] = exception.model_dump()
    m = tx.append(turn, message)
    turn.replied = False
    completed: dict[str, Any] = {"call_id": w.id, "name": w.name, "message_id": m["id"]}
    if error is not None:
        completed["error"] = error
    if exception is not None:
        completed["exception"] = exception.model_dump()
    tx.emit("tool.completed", **completed)
    still = pending(tx, turn.id)
    outcome = {"error": error} if error is not None else {"result": result}
    fire(tx, "tool.completed", turn, [] if still else [{"type": "llm.call"}],
         call_id=w.id, name=w.name, pending=still, **outcome)


def _question_of(tx: Tx, w: Work) -> Interrupt | None:
    """The open question the asking call `w` waits on (core/asks.py)."""
    return next((rec for rec in tx.c.interrupts.values() if rec.call == w.id), None)


def lost_attempts(w: Work) -> int:
    """How many of the call's runs could have been lost with their worker: its attempts, less the
    re-runs its answered questions started (each a new attempt that retries nothing)."""
    return w.attempt - len(w.answers)


# ---- sub-agents ----------------------------------------------------------------------------------


def spawn(tx: Tx, w: Work, agent: str, timeout_s: float, approval: dict[str, Any] | None = None) -> None:
    """A sub-agent is a child session `S:sub-N` whose first message is the call's arguments;
    its final reply settles this call (see `report`), unless `timeout_s` passes first."""
    child = f"{tx.session}:{tx.mint('sub')}"
    w.status = "running"
    w.attempt += 1
    w.child = child
    w.deadline = tx.ctx.now_ms + int(timeout_s * 1000)
    budgets.use(tx, "tool_calls")
    tx.c.children.append(child)
    tx.emit("tool.started", call_id=w.id, name=w.name, child_session=child, approval=approval)
    # Checked where it is read, by the child's dispatcher (a forged link settles nothing).
    parent = ParentLink.model_construct(session=tx.session, call_id=w.id, attempt=w.attempt, app=agent,
                                        reply_to=tx.ctx.results_stream)
    tx.effect(Spawn(seq=tx.next_seq(), child=child, content=orjson.dumps(w.arguments or {}).decode(),
                    parent=parent, trace=tx.trace_of(w.turn)))
    # The timer lives in Redis (the deadlines index), not in any process: it fires after restarts.
    tx.effect(DeadlineAdd(seq=tx.next_seq(), timer=subagent_deadline(w.id), at=w.deadline))


def time_out(tx: Tx, w: Work) -> None:
    """The sub-agent call's deadline passed before its child reported: it fails as `timeout`
    and the child is closed."""
    settle(tx, w, error=CallError.TIMEOUT, close=CloseReason.TIMEOUT)


def end_child(tx: Tx, w: Work, close: CloseReason | None) -> None:
    """The parent no longer waits for this call's child: its timer goes, and unless the child
    ended by itself (`close=None`: it reported), the child is closed."""
    if w.deadline is not None:
        tx.effect(DeadlineRemove(seq=tx.next_seq(), timer=subagent_deadline(w.id)))
    if close is not None and w.child is not None:
        tx.effect(Close(seq=tx.next_seq(), child=w.child, call_id=w.id, attempt=w.attempt, reason=close))


def abandon(tx: Tx, w: Work) -> None:
    """Stop an open call whose session closes: queued jobs are taken off their queue (a running
    one finishes, and its outcome is dropped), a sub-agent's child is closed in turn."""
    if w.kind == "llm":
        tx.cancel(JobKind.LLM, w.id, w.attempt)
    elif w.child is not None:
        end_child(tx, w, CloseReason.ABANDONED)
    elif w.status == "running":
        tx.cancel(JobKind.TOOL, w.id, w.attempt)


def report(tx: Tx, turn: Turn) -> bool:
    """A child's first turn is over: settle the parent's call with its reply, once. True when
    this reported."""
    c = tx.c
    if c.parent is None or c.reported or c.status == SessionStatus.CLOSED:
        return False
    c.reported = True
    # the tip's body: added by this transition, or loaded for it (schemas/state.py bodies_wanted)
    tip = tx.msg(turn.tip) or {}
    ok = turn.replied and tip.get("role") == "assistant"
    post_report(tx, c.parent, ok=ok, value=tip.get("content") if ok else None,
                error=None if ok else CallError.SUBAGENT_FAILED, usage=dict(c.used))
    return True


def post_report(tx: Tx, parent: dict[str, Any], *, ok: bool, value: Any = None, error: str | None = None,
                usage: dict[str, int] | None = None) -> None:
    """Post this session's answer to the parent call `parent` (a `ParentLink` as stored);
    `usage`: what the child used, added to the parent's budget."""
    outcome = WorkOutcome(session=parent["session"], work=parent["call_id"], attempt=parent["attempt"],
                          kind="tool", ok=ok, value=value, error=error, source=tx.session, usage=usage)
    tx.effect(Report(seq=tx.next_seq(), stream=parent["reply_to"], outcome=outcome))
