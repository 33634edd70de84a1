"""The session state machine: (state, input or work outcome, time) -> Transition.

PURE: no Redis, no clock, no randomness. Every rule of SPEC 4 and 5 (I1-I12) lives
here, so each one is unit-tested without I/O; `store.py` commits what this returns.

Vocabulary (SPEC 1): a *turn* is the work after one client message; it is named by
that message's id and its *tip* is the last message it appended. A branch is
*parked* when its head is an open interrupt's anchor or below one (or a global
interrupt is open). Triggers are decided one at a time per session, in the order
fired; a trigger of a parked turn is *held* and released later in order (I6, I10).
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from parley.schemas import tree
from parley.schemas.actions import RECORDING_ACTIONS, Decision, decision_from_app
from parley.schemas.codec import InputEntry
from parley.schemas.inputs import BranchSwitch, InterruptResume, MessageCreate, SessionCreate, ToolResultInput
from parley.schemas.results import WorkOutcome
from parley.schemas.state import Core, Deciding, Interrupt, QueuedTrigger, SessionState, Turn, Work
from parley.schemas.view import public_message

JOB_FUNCS = {
    "decide": "parley.workers.jobs.run_decide",
    "llm": "parley.workers.jobs.run_llm",
    "tools": "parley.workers.jobs.run_tool",
}
WORK_ACTIONS = frozenset({"llm.call", "tool.execute"})
# attempts of one job lost with its worker before it counts as failed
MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ToolInfo:
    deferred: bool = False
    idempotent: bool = False
    agent: str | None = None
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class AppInfo:
    """What the dispatcher needs to know of the app: never its code, only its shape."""

    has_decide: bool = False
    decide_on: frozenset[str] | None = None
    tools: dict[str, ToolInfo] = field(default_factory=dict)

    def needs_decide(self, trigger_type: str) -> bool:
        if not self.has_decide:
            return False
        return self.decide_on is None or trigger_type in self.decide_on


@dataclass(frozen=True, slots=True)
class Limits:
    decide_timeout_s: float = 30
    llm_timeout_s: float = 120
    tool_timeout_s: float = 300


@dataclass(frozen=True, slots=True)
class Context:
    now_ms: int
    app: AppInfo
    results_stream: str = "parley:results"
    limits: Limits = Limits()
    # sub-agent apps by their spec (`fn.agent`), for child sessions
    agents: dict[str, AppInfo] = field(default_factory=dict)


@dataclass(slots=True)
class Transition:
    """What one applied entry changes: the state to store and what to append and do."""

    state: SessionState
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    idempotency_key: str | None = None
    # why a work outcome changed nothing (stale attempt, voided, settled): for logs and metrics
    dropped: str | None = None
    # counts for metrics: (kind, label) -> n
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    # the input's (type, outcome: applied/refused/ignored, code) for metrics
    input_outcome: tuple[str, str, str] | None = None
    # seconds from raise to resume of the interrupts this transition resumed
    waits: list[float] = field(default_factory=list)


def job_id(session: str, work: str, attempt: int) -> str:
    """RQ job ids accept [A-Za-z0-9_-] only; session ids do not, so hash the triple."""
    digest = hashlib.blake2b(f"{session}\x00{work}\x00{attempt}".encode(), digest_size=16)
    return "parley-" + digest.hexdigest()


def entry_ids(value: dict[str, Any]) -> dict[str, Any]:
    return {k: value[k] for k in ("interrupt_id", "call_id", "parent_id", "message_id", "head")
            if isinstance(value.get(k), str)}


class InvalidDecision(ValueError):
    pass


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
    arguments: dict[str, Any] = Field(default_factory=dict)


class _LlmResponse(BaseModel):
    """What a model's reply must look like before it is recorded (SPEC 4 `llm`)."""

    model_config = ConfigDict(extra="ignore")
    content: str = ""
    tool_calls: list[_ToolCall] = Field(default_factory=list)
    usage: dict[str, Any] | None = None


LLM_RESPONSE: TypeAdapter[_LlmResponse] = TypeAdapter(_LlmResponse)


class _Tx:
    """One transition in progress: a working copy of the session and what it emits."""

    def __init__(self, state: SessionState, ctx: Context, session: str, owned: bool = False):
        self.ctx = ctx
        self.session = session
        # The transition edits the core in place: a copy, unless the caller hands its state
        # over (the dispatcher's freshly loaded state, used once and dropped).
        self.core: Core | None = state.core
        if self.core is not None and not owned:
            self.core = self.core.model_copy(deep=True)
        self.msgs = state.messages  # existing messages are immutable; new ones go to self.added
        self.added: dict[str, dict[str, Any]] = {}
        self.out = Transition(state=SessionState(
            core=None, messages={}, applied=dict(state.applied)))
        self.held_before = self.held_count()

    def held_count(self) -> int:
        return sum(len(t.held) for t in self.core.turns.values()) if self.core else 0

    # ---- plumbing -------------------------------------------------------------------------

    @property
    def c(self) -> Core:
        assert self.core is not None
        return self.core

    @property
    def app(self) -> AppInfo:
        """The session's own app: a child session runs its sub-agent's app."""
        if self.core is not None and self.core.app is not None:
            return self.ctx.agents.get(self.core.app, AppInfo())
        return self.ctx.app

    def emit(self, event_type: str, **fields: Any) -> None:
        self.out.events.append({"type": event_type, "at": self.ctx.now_ms, **fields})

    def count(self, kind: str, label: str) -> None:
        key = (kind, label)
        self.out.counts[key] = self.out.counts.get(key, 0) + 1

    def msg(self, mid: str | None) -> dict[str, Any] | None:
        if mid is None:
            return None
        return self.added.get(mid) or self.msgs.get(mid)

    def mint(self, kind: str) -> str:
        """Sequential ids per session (`msg-1`, `call-1`, `llm-1`, `int-1`, `dec-1`)."""
        while True:
            n = self.c.seq.get(kind, 0) + 1
            self.c.seq[kind] = n
            candidate = f"{kind}-{n}"
            if kind == "msg" and self.msg(candidate) is not None:
                continue
            if kind == "int" and (candidate in self.c.interrupts or candidate in self.c.resumed):
                continue
            return candidate

    def ancestors(self, mid: str | None) -> Iterator[str]:
        return tree.ancestors(self.msg, mid)

    def parking(self, head: str | None) -> list[str]:
        return tree.parking(self.c, self.msg, head)

    def in_region(self, tip: str, anchor: str | None) -> bool:
        return tree.in_region(self.msg, tip, anchor)

    def turn_of(self, mid: str | None) -> Turn | None:
        m = self.msg(mid)
        return self.c.turns.get(m["turn"]) if m else None

    def is_active(self, turn: Turn) -> bool:
        return self.turn_of(self.c.head) is turn

    def append(self, turn: Turn, message: dict[str, Any]) -> dict[str, Any]:
        """Append an engine message at the turn's tip: never a fork (SPEC 4.2)."""
        message = {"id": self.mint("msg"), "parent_id": turn.tip, **message, "turn": turn.id}
        self.added[message["id"]] = message
        self.out.new_messages.append(message)
        if self.c.head == turn.tip:
            self.c.head = message["id"]
        turn.tip = message["id"]
        self.emit("message.created", message=public_message(message))
        return message

    def effect(self, **fields: Any) -> None:
        n = self.c.seq.get("fx", 0) + 1
        self.c.seq["fx"] = n
        self.out.effects.append({"seq": n, **fields})

    def enqueue(self, queue: str, work: str, attempt: int, payload: dict[str, Any],
                timeout_s: float) -> None:
        self.effect(op="enqueue", queue=queue, func=JOB_FUNCS[queue],
                    job_id=job_id(self.session, work, attempt), timeout=timeout_s,
                    payload={"session": self.session, "work": work, "attempt": attempt,
                             "reply_to": self.ctx.results_stream, "app": self.c.app, **payload})

    def cancel(self, queue: str, work: str, attempt: int) -> None:
        self.effect(op="cancel", queue=queue, job_id=job_id(self.session, work, attempt))

    # ---- triggers: fire, hold, release, decide one at a time --------------------------------

    def trigger_ref(self, item: QueuedTrigger) -> dict[str, Any]:
        t = item.trigger
        ref: dict[str, Any] = {"type": t["type"]}
        for key in ("call_id", "interrupt_id"):
            if t.get(key) is not None:
                ref[key] = t[key]
        if isinstance(t.get("message"), dict):
            ref["message_id"] = t["message"]["id"]
        return ref

    def fire(self, trigger_type: str, turn: Turn | None, proposed: list[dict[str, Any]],
             bypass: bool = False, **fields: Any) -> None:
        trigger = {"type": trigger_type, "session": self.session,
                   "head": turn.tip if turn else None, **fields}
        item = QueuedTrigger(trigger=trigger, proposed=proposed,
                             turn=turn.id if turn else None, bypass=bypass)
        self.count("trigger", trigger_type)
        # I10: while a turn has held triggers, its new triggers queue behind them.
        if turn is not None and not bypass and (turn.held or self.parking(turn.tip)):
            self.hold(item, turn)
        else:
            self.c.queue.append(item)

    def hold(self, item: QueuedTrigger, turn: Turn) -> None:
        if item.bypass:  # the I9 exception covers the fresh delivery only, never a later release
            item = item.model_copy(update={"bypass": False})
        turn.held.append(item)
        self.emit("decision.held", trigger=self.trigger_ref(item), head=turn.tip)

    def release(self, turn: Turn | None) -> None:
        """I10: held triggers go on, in the order held, once the turn is active and unparked."""
        if turn is None or not turn.held or not self.is_active(turn) or self.parking(turn.tip):
            return
        # "Go on as if never paused" asks for one model call at most: when several released
        # triggers propose one (a call voided by a global pause, and a completion recorded
        # while parked that found nothing pending), only the last keeps it.
        proposing = [i for i, item in enumerate(turn.held)
                     if any(a.get("type") == "llm.call" for a in item.proposed)]
        for i, item in enumerate(turn.held):
            if i in proposing[:-1]:
                item = item.model_copy(update={"proposed": [
                    a for a in item.proposed if a.get("type") != "llm.call"]})
            self.emit("decision.released", trigger=self.trigger_ref(item), head=turn.tip)
            self.c.queue.append(item)
        turn.held = []

    def pump(self) -> None:
        while self.c.deciding is None and self.c.queue:
            item = self.c.queue.pop(0)
            turn = self.c.turns.get(item.turn) if item.turn else None
            if turn is not None and not item.bypass and (turn.held or self.parking(turn.tip)):
                self.hold(item, turn)
                continue
            if self.app.needs_decide(item.trigger["type"]):
                work = self.mint("dec")
                self.c.deciding = Deciding(work=work, attempt=1, item=item)
                self.enqueue("decide", work, 1, {"trigger": item.trigger,
                                                 "proposed": {"actions": item.proposed}},
                             self.ctx.limits.decide_timeout_s)
            else:
                self.apply_decision(item, Decision.model_validate({"actions": item.proposed}))

    # ---- decisions ----------------------------------------------------------------------------

    def default_call(self, item: QueuedTrigger) -> str | None:
        call = item.trigger.get("call_id")
        return call if isinstance(call, str) else None

    def open_tool(self, call_id: str | None) -> Work | None:
        w = self.c.work.get(call_id) if call_id else None
        return w if w is not None and w.kind == "tool" else None

    def validate(self, item: QueuedTrigger, turn: Turn | None, decision: Decision) -> None:
        """SPEC 4.2: a decision is validated whole before anything of it is applied."""
        seen_interrupt = False
        settled: set[str] = set()
        executed: set[str] = set()
        new_ids: set[str] = set()
        for n, action in enumerate(decision.actions, 1):
            where = f"action {n} ({action.type})"
            if seen_interrupt and action.type not in RECORDING_ACTIONS:
                raise InvalidDecision(f"{where}: only recording actions may follow an interrupt")
            if action.type == "interrupt":
                iid = action.interrupt_id
                if iid is not None and (iid in self.c.interrupts or iid in self.c.resumed
                                        or iid in new_ids):
                    raise InvalidDecision(f"{where}: interrupt id {iid!r} is already used (I1)")
                if iid is not None:
                    new_ids.add(iid)
                seen_interrupt = True
                continue
            if turn is None:
                raise InvalidDecision(f"{where}: the trigger has no branch to act on")
            if action.type in ("tool.result", "tool.error"):
                cid = action.call_id or self.default_call(item)
                if cid is None:
                    raise InvalidDecision(f"{where}: no call to settle")
                w = self.open_tool(cid)
                if w is None or cid in settled | executed:
                    raise InvalidDecision(f"{where}: call {cid!r} is not open")
                if w.turn != item.turn:
                    raise InvalidDecision(f"{where}: call {cid!r} belongs to another turn")
                settled.add(cid)
            elif action.type == "tool.execute" and action.name is None:
                cid = action.call_id or self.default_call(item)
                w = self.open_tool(cid)
                if cid is None or w is None or w.status != "new" or cid in settled | executed:
                    raise InvalidDecision(f"{where}: call {cid!r} is not waiting to run")
                if w.turn != item.turn:
                    raise InvalidDecision(f"{where}: call {cid!r} belongs to another turn")
                executed.add(cid)

    def apply_decision(self, item: QueuedTrigger, decision: Decision) -> None:
        turn = self.c.turns.get(item.turn) if item.turn else None
        try:
            self.validate(item, turn, decision)
        except InvalidDecision as exc:
            self.decision_failed(item, str(exc))
            return
        if turn is not None and self.parking(turn.tip) and any(
                a.type in WORK_ACTIONS for a in decision.actions):
            # I12 before I6a: a parked branch starts no work, so a decision that would start
            # some is dropped unapplied and its trigger held, to be decided again after resume.
            self.hold(item, turn)
            return
        exceeded = self.over_budget(decision, default_call=self.default_call(item))
        if exceeded is not None:
            # I3: a spent budget pauses the whole session; the blocked decision comes back
            # as the resume's proposed actions.
            wire = decision.to_wire()["actions"]
            self.raise_budget(exceeded, turn, item.model_copy(update={"proposed": wire}))
            return
        for action in decision.actions:
            self.count("action", action.type)
            if action.type == "llm.call":
                assert turn is not None
                self.start_llm(turn, action.model, action.params, origin=item)
            elif action.type == "tool.execute":
                assert turn is not None
                if action.name is not None:
                    self.new_call(turn, action.name, action.arguments or {})
                else:
                    cid = action.call_id or self.default_call(item)
                    assert cid is not None
                    self.run_call(self.c.work[cid])
            elif action.type == "tool.result":
                self.settle(self.c.work[action.call_id or self.default_call(item) or ""],
                            result=action.result)
            elif action.type == "tool.error":
                self.settle(self.c.work[action.call_id or self.default_call(item) or ""],
                            error=action.error)
            elif action.type == "message":
                assert turn is not None
                self.append(turn, {"role": "assistant", "content": action.content})
            elif action.type == "interrupt":
                self.raise_interrupt(self.origin_of(item), turn, action.model_dump(exclude_unset=True))
        if item.trigger["type"] in ("tool.execute", "interrupt.resumed") and not any(
                a.type == "interrupt" for a in decision.actions):
            # A decision that neither runs, settles nor asks about its call would leave the
            # turn waiting forever: the call is settled as the tool error `not_executed`.
            w = self.open_tool(self.default_call(item))
            if w is not None and w.status == "new" and w.turn == item.turn:
                self.settle(w, error="not_executed")
        self.after_decision(item)

    # ---- budgets (SPEC I3) --------------------------------------------------------------------

    BUDGET_KINDS = ("llm_calls", "tool_calls", "tokens")

    def over_budget(self, decision: Decision, extra: list[dict[str, Any]] | None = None,
                    default_call: str | None = None) -> str | None:
        """The first limit the decision's work would exceed (or that is already spent), if any."""
        limits = self.c.budget or {}
        if not limits:
            return None
        actions = [a.model_dump(exclude_unset=True) | {"type": a.type} for a in decision.actions]
        actions += extra or []
        wants = {"llm_calls": sum(a.get("type") == "llm.call" for a in actions),
                 "tool_calls": sum(self.would_run(a, default_call) for a in actions)}
        for kind in ("llm_calls", "tool_calls"):
            limit = limits.get(kind)
            if limit is not None and wants[kind] and self.c.used.get(kind, 0) + wants[kind] > limit:
                return kind
        limit = limits.get("tokens")
        if limit is not None and wants["llm_calls"] and self.c.used.get("tokens", 0) >= limit:
            return "tokens"
        return None

    def would_run(self, action: dict[str, Any], default_call: str | None) -> bool:
        """A tool.execute that will start a job (deferred and unknown tools spend no budget)."""
        if action.get("type") != "tool.execute":
            return False
        name = action.get("name")
        if name is None:
            w = self.c.work.get(action.get("call_id") or default_call or "")
            name = w.name if w is not None else None
        tool = self.app.tools.get(name or "")
        return tool is not None and not tool.deferred

    def tokens_spent(self) -> bool:
        limit = (self.c.budget or {}).get("tokens")
        return limit is not None and self.c.used.get("tokens", 0) >= limit

    def use(self, kind: str, n: int = 1) -> None:
        self.c.used[kind] = self.c.used.get(kind, 0) + n

    def raise_budget(self, exceeded: str, turn: Turn | None, origin: QueuedTrigger | None) -> Interrupt:
        payload = {"used": {k: self.c.used.get(k, 0) for k in self.BUDGET_KINDS},
                   "limit": {k: (self.c.budget or {}).get(k) for k in self.BUDGET_KINDS},
                   "exceeded": exceeded}
        return self.raise_interrupt(origin, turn, {"reason": "budget", "payload": payload},
                                    anchored=False, system=True)

    def origin_of(self, item: QueuedTrigger) -> QueuedTrigger:
        """The origin a new interrupt records. Asked again while deciding a resume, it is the
        resume's own origin — not the resume, which would nest one level deeper per question
        — proposing what the resume proposed, without the interrupt a budget stop had blocked
        (raised now: proposing it again would ask forever)."""
        if item.trigger["type"] != "interrupt.resumed" or not isinstance(item.trigger.get("origin"), dict):
            return item
        return QueuedTrigger(trigger=item.trigger["origin"], turn=item.turn,
                             proposed=[a for a in item.proposed if a.get("type") != "interrupt"])

    def after_decision(self, item: QueuedTrigger) -> None:
        if item.trigger["type"] == "interrupt.resumed":
            # I10: released right after the decision of the resume that unparked the turn.
            self.release(self.c.turns.get(item.turn) if item.turn else None)
            self.release(self.turn_of(self.c.head))

    def decision_failed(self, item: QueuedTrigger, error: str) -> None:
        self.emit("decision.failed", trigger=self.trigger_ref(item), error=error)
        if item.trigger["type"] in ("tool.execute", "interrupt.resumed"):
            # SPEC 4.2: the call is settled as `decision_failed`, so a turn never waits forever.
            w = self.open_tool(self.default_call(item))
            if w is not None and w.status == "new":
                self.settle(w, error="decision_failed")
        self.after_decision(item)

    # ---- work ---------------------------------------------------------------------------------

    def path(self, head: str) -> list[dict[str, Any]]:
        chain = [public_message(self.msg(mid) or {}) for mid in self.ancestors(head)]
        chain.reverse()
        return chain

    def pending(self, turn_id: str) -> list[str]:
        def order(w: Work) -> tuple[str, int]:
            kind, _, n = w.id.rpartition("-")
            return (kind, int(n) if n.isdigit() else 0)
        return [w.id for w in sorted(self.c.work.values(), key=order) if w.turn == turn_id]

    def start_llm(self, turn: Turn, model: str | None = None,
                  params: dict[str, Any] | None = None, origin: QueuedTrigger | None = None) -> None:
        lid = self.mint("llm")
        self.use("llm_calls")
        extras = {k: v for k, v in (("model", model), ("params", params)) if v is not None}
        w = Work(id=lid, kind="llm", turn=turn.id, status="running", attempt=0, head=turn.tip,
                 origin=origin, arguments=extras)
        self.c.work[lid] = w
        self.emit("llm.started", call_id=lid, head=turn.tip)
        self.enqueue_llm(w)

    def enqueue_llm(self, w: Work) -> None:
        """(Re)send an LLM call: the branch root -> the head it was made at, never later messages."""
        assert w.head is not None
        w.attempt += 1
        request: dict[str, Any] = {"messages": self.path(w.head), **(w.arguments or {})}
        self.enqueue("llm", w.id, w.attempt, {"request": request}, self.ctx.limits.llm_timeout_s)

    def new_call(self, turn: Turn, name: str, arguments: dict[str, Any]) -> None:
        """A call the worker starts itself: its assistant message first, so transcripts stay valid."""
        cid = self.mint("call")
        self.append(turn, {"role": "assistant", "content": "",
                           "tool_calls": [{"id": cid, "name": name, "arguments": arguments}]})
        self.c.work[cid] = Work(id=cid, kind="tool", turn=turn.id, name=name, arguments=arguments)
        self.run_call(self.c.work[cid])

    def run_call(self, w: Work) -> None:
        tool = self.app.tools.get(w.name or "")
        if tool is None:
            self.settle(w, error="unknown_tool")
            return
        if tool.agent:
            self.spawn(w, tool.agent)
            return
        if tool.deferred:
            w.status = "deferred"
            self.emit("tool.deferred", call_id=w.id, name=w.name, arguments=w.arguments or {})
            return
        w.status = "running"
        self.use("tool_calls")
        self.emit("tool.started", call_id=w.id, name=w.name)
        self.enqueue_tool(w, tool)

    def spawn(self, w: Work, agent: str) -> None:
        """SPEC 6: a sub-agent is a child session `S:sub-N` whose first message is the call's
        arguments; its final reply settles this call (see `report`)."""
        child = f"{self.session}:{self.mint('sub')}"
        w.status = "running"
        w.attempt += 1
        w.child = child
        self.use("tool_calls")
        self.c.children.append(child)
        self.emit("tool.started", call_id=w.id, name=w.name, child_session=child)
        self.effect(op="spawn", child=child, content=orjson.dumps(w.arguments or {}).decode(),
                    parent={"session": self.session, "call_id": w.id, "attempt": w.attempt,
                            "app": agent, "reply_to": self.ctx.results_stream})

    def report(self, turn: Turn) -> None:
        """A child's first turn is over: settle the parent's call with its reply, once."""
        parent = self.c.parent
        if parent is None or self.c.reported:
            return
        self.c.reported = True
        tip = self.msg(turn.tip) or {}
        ok = turn.replied and tip.get("role") == "assistant"
        outcome = WorkOutcome(session=parent["session"], work=parent["call_id"], attempt=parent["attempt"],
                              kind="tool", ok=ok, value=tip.get("content") if ok else None,
                              error=None if ok else "subagent_failed", source=self.session,
                              usage=dict(self.c.used))
        self.effect(op="report", stream=parent["reply_to"], outcome=outcome.model_dump(mode="json"))

    def enqueue_tool(self, w: Work, tool: ToolInfo) -> None:
        w.attempt += 1
        self.enqueue("tools", w.id, w.attempt, {"name": w.name, "arguments": w.arguments or {}},
                     tool.timeout_s or self.ctx.limits.tool_timeout_s)

    def settle(self, w: Work, result: Any = None, error: str | None = None) -> None:
        """Record a tool call's outcome as a tool message and fire `tool.completed`."""
        del self.c.work[w.id]
        turn = self.c.turns[w.turn]
        if error is not None:
            content = error
        elif isinstance(result, str):
            content = result
        else:
            content = orjson.dumps(result).decode()
        message: dict[str, Any] = {"role": "tool", "content": content, "tool_call_id": w.id}
        if error is not None:
            message["error"] = True
        m = self.append(turn, message)
        turn.replied = False
        completed: dict[str, Any] = {"call_id": w.id, "name": w.name, "message_id": m["id"]}
        if error is not None:
            completed["error"] = error
        self.emit("tool.completed", **completed)
        pending = self.pending(turn.id)
        outcome = {"error": error} if error is not None else {"result": result}
        self.fire("tool.completed", turn, [] if pending else [{"type": "llm.call"}],
                  call_id=w.id, name=w.name, pending=pending, **outcome)

    def record_llm(self, w: Work, response: dict[str, Any]) -> None:
        del self.c.work[w.id]
        turn = self.c.turns[w.turn]
        calls = []
        for call in response.get("tool_calls") or []:
            cid = self.mint("call")  # SPEC 1: the model's own ids are rewritten to call-N
            calls.append({"id": cid, "name": call["name"], "arguments": call.get("arguments") or {}})
            self.c.work[cid] = Work(id=cid, kind="tool", turn=turn.id, name=call["name"],
                                    arguments=call.get("arguments") or {})
        message: dict[str, Any] = {"role": "assistant", "content": response.get("content") or ""}
        if calls:
            message["tool_calls"] = calls
        m = self.append(turn, message)
        self.emit("llm.completed", call_id=w.id, head=w.head, message_id=m["id"])
        usage = response.get("usage") or {}
        tokens = usage.get("tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            self.use("tokens", tokens)
        if self.tokens_spent() and not any(
                i.system for i in self.c.interrupts.values()):
            # Tokens are counted after the reply: it stays, its follow-ons are held (I3, I6).
            self.raise_budget("tokens", turn, None)
        if calls:
            for call in calls:
                self.fire("tool.execute", turn, [{"type": "tool.execute"}], call_id=call["id"],
                          name=call["name"], arguments=call["arguments"])
        else:
            self.fire("llm.completed", turn, [], message=public_message(m))
        turn.replied = not calls

    # ---- interrupts (SPEC 5) ----------------------------------------------------------------

    def raise_interrupt(self, item: QueuedTrigger | None, turn: Turn | None, action: dict[str, Any],
                        anchored: bool = True, system: bool = False) -> Interrupt:
        iid = action.get("interrupt_id") or self.mint("int")  # I1
        anchor = turn.tip if turn is not None and anchored else None  # I2, I3
        timeout_s = action.get("timeout_s")
        rec = Interrupt(id=iid, reason=action["reason"], payload=action.get("payload"),
                        anchor=anchor, turn=turn.id if turn else None, origin=item,
                        raised_at=self.ctx.now_ms, timeout_s=timeout_s,
                        deadline=self.ctx.now_ms + int(timeout_s * 1000) if timeout_s else None,
                        default=action.get("default"), resumable_by=action.get("resumable_by"),
                        system=system)
        self.c.interrupts[iid] = rec
        self.count("interrupt_raised", "global" if anchor is None else "anchored")
        self.emit("interrupt.raised", interrupt_id=iid, reason=rec.reason, payload=rec.payload,
                  anchor=anchor)
        self.effect(op="index_add", interrupt_id=iid, reason=rec.reason, anchor=anchor,
                    raised_at=rec.raised_at, deadline=rec.deadline,
                    parent=self.c.parent["session"] if self.c.parent else None)
        self.park(rec)
        return rec

    def park(self, rec: Interrupt) -> None:
        """I4, I6a: void the branch's LLM calls and decide in flight; hold its queued triggers."""
        for w in list(self.c.work.values()):
            if w.kind == "llm" and self.in_region(self.c.turns[w.turn].tip, rec.anchor):
                del self.c.work[w.id]
                self.count("llm_voided", "park")
                self.emit("llm.voided", call_id=w.id, interrupt_id=rec.id)
                self.cancel("llm", w.id, w.attempt)
                call = {"type": "llm.call", **(w.arguments or {})}
                if w.turn == rec.turn or w.origin is None:
                    rec.voided_llm = True  # comes back as the resume's llm.call
                    rec.voided_call = call
                else:
                    # Another turn's call (a global pause): its trigger is decided again later,
                    # proposing just that call (what its decision had already applied stays).
                    self.hold(w.origin.model_copy(update={"proposed": [call]}), self.c.turns[w.turn])
        deciding = self.c.deciding
        if deciding is not None and deciding.item.turn is not None:
            turn = self.c.turns[deciding.item.turn]
            if self.in_region(turn.tip, rec.anchor):
                self.c.deciding = None
                self.cancel("decide", deciding.work, deciding.attempt)
                self.hold(deciding.item, turn)
        keep: list[QueuedTrigger] = []
        for item in self.c.queue:
            owner = self.c.turns.get(item.turn) if item.turn else None
            if owner is not None and not item.bypass and self.in_region(owner.tip, rec.anchor):
                self.hold(item, owner)
            else:
                keep.append(item)
        self.c.queue = keep

    def resume(self, rec: Interrupt, payload: Any, timed_out: bool, principal: str | None) -> None:
        self.out.waits.append(max(0, self.ctx.now_ms - rec.raised_at) / 1000)
        del self.c.interrupts[rec.id]
        self.c.resumed.append(rec.id)
        self.effect(op="index_remove", interrupt_id=rec.id)
        turn = self.c.turns.get(rec.turn) if rec.turn else None
        origin = rec.origin
        proposed = [dict(a) for a in (origin.proposed if origin else [])]
        held_llm = turn is not None and any(
            a.get("type") == "llm.call" for h in turn.held for a in h.proposed)
        if rec.voided_llm and not held_llm and not any(a.get("type") == "llm.call" for a in proposed):
            # "go on as if never paused": one call at most
            proposed.append(dict(rec.voided_call or {"type": "llm.call"}))
        if rec.system and isinstance(payload, dict) and isinstance(payload.get("budget"), dict):
            # I3: the resume's `budget` replaces the limits (absolute values).
            self.c.budget = {**(self.c.budget or {}), **{
                k: v for k, v in payload["budget"].items()
                if k in self.BUDGET_KINDS and (v is None or (isinstance(v, int) and v >= 0))}}
        if rec.system:
            origin_call = origin.trigger.get("call_id") if origin else None
            still = self.over_budget(Decision(), extra=proposed, default_call=origin_call) or (
                "tokens" if self.tokens_spent() else None)
            if still is not None:
                # A resume that leaves a limit spent raises again at once.
                self.emit("interrupt.resumed", interrupt_id=rec.id, payload=payload, delivered=False,
                          timed_out=timed_out, **({"principal": principal} if principal else {}))
                self.count("interrupt_resumed", "not_delivered")
                again = origin.model_copy(update={"proposed": proposed}) if origin else None
                new = self.raise_budget(still, turn, again)
                if again is None and rec.voided_llm:
                    new.voided_llm, new.voided_call = True, rec.voided_call
                return
        delivered = rec.anchor is None or (turn is not None and self.is_active(turn))
        self.count("interrupt_resumed", "delivered" if delivered else "not_delivered")
        event: dict[str, Any] = {"interrupt_id": rec.id, "payload": payload, "delivered": delivered,
                                 "timed_out": timed_out}
        if principal is not None:
            event["principal"] = principal
        self.emit("interrupt.resumed", **event)
        if delivered:
            fields: dict[str, Any] = {"interrupt_id": rec.id, "payload": payload,
                                      "timed_out": timed_out,
                                      "origin": origin.trigger if origin else None}
            if origin is not None and origin.trigger.get("call_id") is not None:
                fields["call_id"] = origin.trigger["call_id"]
            self.fire("interrupt.resumed", turn, proposed, bypass=True, **fields)
        elif origin is not None and turn is not None:
            # I9: nothing delivered; the origin is decided afresh when the branch is active again.
            self.hold(origin.model_copy(update={"proposed": proposed}), turn)

    # ---- turns ------------------------------------------------------------------------------

    def complete_turns(self) -> None:
        busy: set[str | None] = {w.turn for w in self.c.work.values()}
        busy.update(item.turn for item in self.c.queue)
        busy.update(i.turn for i in self.c.interrupts.values())
        if self.c.deciding is not None:
            busy.add(self.c.deciding.item.turn)
        for turn in list(self.c.turns.values()):
            if turn.id not in busy and not turn.held:
                del self.c.turns[turn.id]
                self.emit("turn.completed", head=turn.tip)
                self.report(turn)

    def finish(self) -> Transition:
        if self.core is not None:
            self.pump()
            self.complete_turns()
            delta = self.held_count() - self.held_before
            if delta:  # the fleet-wide gauge of held decisions, kept exactly by the outbox
                self.effect(op="stat", field="held", delta=delta)
        self.out.state.core = self.core
        return self.out


# ---- entry points ---------------------------------------------------------------------------


def _input_ref(entry_id: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"entry": entry_id, "type": value.get("type"), **entry_ids(value)}


def _create(tx: _Tx, budget: dict[str, Any] | None, metadata: dict[str, Any] | None,
            parent: dict[str, Any] | None = None) -> None:
    tx.core = Core(session=tx.session, created_at=tx.ctx.now_ms, budget=budget, metadata=metadata,
                   parent=parent, app=parent["app"] if parent else None)
    tx.emit("session.created", budget=budget, metadata=metadata)
    tx.fire("session.created", None, [], budget=budget, metadata=metadata)


def apply_input(state: SessionState, entry: InputEntry, entry_id: str, ctx: Context, *,
                owned: bool = False) -> Transition:
    """Apply one client input (SPEC 3.1). Refusals and ignores are events, never exceptions.

    `owned=True`: the caller will not use `state` again, so its core is edited in place
    rather than copied (it may be left half-changed if this raises)."""
    tx = _Tx(state, ctx, entry.session, owned)
    tx.out.idempotency_key = entry.idempotency_key
    inp = entry.input
    raw = inp.model_dump(mode="json", exclude_unset=True) | {"type": inp.type}
    tx.out.input_outcome = (inp.type, "applied", "")

    def refuse(code: str, message: str, **extra: Any) -> Transition:
        tx.out.input_outcome = (inp.type, "refused", code)
        tx.emit("input.refused", input=_input_ref(entry_id, raw), code=code, message=message, **extra)
        return tx.finish()

    def ignore(code: str) -> Transition:
        tx.out.input_outcome = (inp.type, "ignored", code)
        tx.emit("input.ignored", input=_input_ref(entry_id, raw), code=code)
        return tx.finish()

    if state.duplicate:
        return ignore("duplicate")

    if isinstance(inp, SessionCreate):
        if tx.core is not None:
            return ignore("session_exists")
        _create(tx, inp.budget.model_dump(exclude_none=True) if inp.budget else None, inp.metadata,
                inp.parent.model_dump() if inp.parent else None)
        return tx.finish()

    if isinstance(inp, MessageCreate):
        if tx.core is None and inp.parent_given and inp.parent_id is not None:
            return refuse("unknown_parent", f"no message {inp.parent_id!r} in this session")
        if tx.core is None:
            _create(tx, None, None)  # implicit creation fires session.created first
        c = tx.c
        parent = inp.parent_id if inp.parent_given else c.head
        if parent is not None and tx.msg(parent) is None:
            return refuse("unknown_parent", f"no message {parent!r} in this session")
        parked = tx.parking(parent) if parent is not None else [
            i.id for i in c.interrupts.values() if i.anchor is None]
        if parked:  # I5 (and I3: a global interrupt refuses new roots too)
            return refuse("branch_parked", "the branch is parked by an open interrupt",
                          interrupt_ids=parked)
        parent_turn = tx.turn_of(parent)
        if parent_turn is not None and parent_turn.tip == parent:
            return refuse("turn_in_progress", f"{parent!r} is the tip of a turn still running")
        if inp.message_id is not None and tx.msg(inp.message_id) is not None:
            return refuse("duplicate_message_id", f"message id {inp.message_id!r} is already used")
        mid = inp.message_id or tx.mint("msg")
        message = {"id": mid, "parent_id": parent, "role": "user", "content": inp.content, "turn": mid}
        tx.added[mid] = message
        tx.out.new_messages.append(message)
        turn = Turn(id=mid, tip=mid)
        c.turns[mid] = turn
        c.head = mid
        tx.emit("message.created", message=public_message(message))
        tx.fire("message.created", turn, [{"type": "llm.call"}], message=public_message(message))
        return tx.finish()

    if isinstance(inp, BranchSwitch):
        if tx.core is None or tx.msg(inp.head) is None:
            return refuse("unknown_message", f"no message {inp.head!r} in this session")
        tx.c.head = inp.head
        ids = tx.parking(inp.head)
        tx.emit("branch.switched", head=inp.head, parked=bool(ids), interrupt_ids=ids)  # I8
        tx.release(tx.turn_of(inp.head))  # I10
        return tx.finish()

    if isinstance(inp, InterruptResume):
        if tx.core is None:
            return ignore("unknown_interrupt")
        rec = tx.c.interrupts.get(inp.interrupt_id)
        if rec is None:  # I11
            return ignore("already_resumed" if inp.interrupt_id in tx.c.resumed else "unknown_interrupt")
        if rec.resumable_by is not None and entry.principal not in rec.resumable_by:
            # SPEC 4.2: only a signed resume by one of them clears it (unsigned: no principal).
            return refuse("forbidden", "this interrupt may be resumed only by "
                          + ", ".join(rec.resumable_by))
        # `principal` is the dispatcher-verified signer, or None for an unsigned entry.
        tx.resume(rec, inp.payload, False, entry.principal)
        return tx.finish()

    if isinstance(inp, ToolResultInput):
        w = tx.open_tool(inp.call_id) if tx.core is not None else None
        if w is None or w.status != "deferred":
            settled = tx.core is not None and _was_minted(tx.c, inp.call_id)
            return ignore("already_settled" if settled else "unknown_call")
        if "error" in inp.model_fields_set:
            tx.settle(w, error=inp.error)
        else:
            tx.settle(w, result=inp.result)
        return tx.finish()

    raise AssertionError(f"unhandled input {inp!r}")  # pragma: no cover - the union is closed


def _was_minted(core: Core, work_id: str) -> bool:
    kind, _, n = work_id.rpartition("-")
    return kind in ("call", "llm") and n.isdigit() and 0 < int(n) <= core.seq.get(kind, 0) \
        and work_id not in core.work


def apply_outcome(state: SessionState, outcome: WorkOutcome, ctx: Context, *,
                  owned: bool = False) -> Transition:
    """Apply one work outcome; a late, stale or voided one changes nothing (SPEC 7).
    `owned`: as for `apply_input`."""
    tx = _Tx(state, ctx, outcome.session, owned)
    if tx.core is None:
        tx.out.dropped = "no_session"
        return tx.finish()
    c = tx.c
    if outcome.kind == "deadline":
        rec = c.interrupts.get(outcome.work)
        if rec is None or rec.deadline is None:
            tx.out.dropped = "already_resumed"
            return tx.finish()
        tx.resume(rec, rec.default, True, None)  # past timeout_s, unanswered: resumed with default
        return tx.finish()
    if outcome.kind == "decide":
        deciding = c.deciding
        if deciding is None or deciding.work != outcome.work or deciding.attempt != outcome.attempt:
            tx.out.dropped = "stale_decision"
            return tx.finish()
        if outcome.lost and deciding.attempt < MAX_ATTEMPTS:
            # decide has no side effects: run it again (SPEC 6)
            tx.count("work_retried", "decide")
            deciding.attempt += 1
            tx.enqueue("decide", deciding.work, deciding.attempt,
                       {"trigger": deciding.item.trigger, "proposed": {"actions": deciding.item.proposed}},
                       ctx.limits.decide_timeout_s)
            return tx.finish()
        c.deciding = None
        if not outcome.ok:
            tx.decision_failed(deciding.item, outcome.error or "decide failed")
            return tx.finish()
        try:
            decision = decision_from_app(outcome.value)
        except (ValidationError, ValueError) as exc:
            tx.decision_failed(deciding.item, f"invalid decision: {exc}")
            return tx.finish()
        tx.apply_decision(deciding.item, decision)
        return tx.finish()

    w = c.work.get(outcome.work)
    if w is not None and w.child != outcome.source:
        # an agent call is settled only by its own child's report, and a tool job's result
        # never claims to come from a child
        tx.out.dropped = "wrong_source"
        tx.count("result_dropped", tx.out.dropped)
        return tx.finish()
    if w is None or w.attempt != outcome.attempt or w.status != "running" or (
            w.kind == "llm") != (outcome.kind == "llm"):
        tx.out.dropped = "already_settled" if w is None else "stale_attempt"
        tx.count("result_dropped", tx.out.dropped)
        return tx.finish()
    if outcome.lost:
        tool = tx.app.tools.get(w.name or "") if w.kind == "tool" else None
        if w.attempt < MAX_ATTEMPTS and (w.kind == "llm" or (tool is not None and tool.idempotent)):
            # LLM calls and idempotent tools are retried after a worker crash (SPEC 6)
            tx.count("work_retried", w.kind)
            if tool is not None:
                tx.enqueue_tool(w, tool)
            else:
                tx.enqueue_llm(w)
            return tx.finish()
    if w.kind == "tool":
        if w.child is not None and outcome.usage:
            for kind in ("llm_calls", "tool_calls", "tokens"):  # the parent's budget counts it
                tx.use(kind, max(0, int(outcome.usage.get(kind, 0))))
        if outcome.ok:
            tx.settle(w, result=outcome.value)
        else:
            tx.settle(w, error=outcome.error or "tool failed")
        return tx.finish()
    response, problem = None, outcome.error or "llm failed"
    if outcome.ok:
        try:
            response = LLM_RESPONSE.validate_python(outcome.value).model_dump()
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            problem = f"invalid model response: {first['msg']}" + (f" at {where}" if where else "")
    if response is not None:
        tx.record_llm(w, response)
    else:
        del c.work[w.id]
        error = problem
        tx.emit("llm.failed", call_id=w.id, head=w.head, error=error)
        tx.fire("llm.failed", c.turns[w.turn], [], call_id=w.id, error=error)
    return tx.finish()


def next_state(state: SessionState, tr: Transition) -> SessionState:
    """The state a committed transition leaves (what `store.load` would read back)."""
    messages = dict(state.messages)
    messages.update({m["id"]: m for m in tr.new_messages})
    return SessionState(core=tr.state.core, messages=messages, applied=tr.state.applied)
