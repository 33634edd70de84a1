"""A driver for the pure core (dispatcher/core/), for unit tests.

`Sim` keeps one session's state, applies client inputs (built through the real codec) and
work outcomes, and collects every event and effect. Every emitted event is validated
against the wire contract (`schemas.events.EVENT_ADAPTER`), and a few invariants are
checked after every transition (the state round-trips through JSON, messages are never
overwritten, every new message has a `message.created` event and a known parent).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from parley.dispatcher.core import (
    AdmissionLimits,
    AppInfo,
    Cancel,
    Context,
    Effect,
    Enqueue,
    IndexAdd,
    Lifecycle,
    Limits,
    ToolInfo,
    Transition,
    admission,
    apply_input,
    apply_outcome,
    effect_to_dict,
)
from parley.schemas.codec import decode_input_entry
from parley.schemas.events import EVENT_ADAPTER
from parley.schemas.jobs import JobKind
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import ENGINE_PRINCIPAL
from parley.schemas.state import (
    Core,
    Deciding,
    Interrupt,
    QueuedTrigger,
    SessionState,
    Turn,
    Work,
    bodies_wanted,
)
from parley.schemas.tree import Shape
from parley.schemas.view import creation_order, public_message, show

OMIT: Any = object()  # "leave the field out" (distinct from an explicit None / null)

TOOLS = {
    "search": ToolInfo(),
    "send_email": ToolInfo(timeout_s=30),
    "approval": ToolInfo(deferred=True),
}


#: Model replies of the wrong shape: the worker and the core refuse each (llm.failed).
MALFORMED_REPLIES: list[Any] = [
    {"tool_calls": [{"id": "x"}]},
    {"tool_calls": [{"id": "x", "name": "search", "arguments": "{}"}]},
    {"tool_calls": "nope"},
    {"content": 5},
    {"tool_calls": [{"id": "x", "name": "bad name!"}]},
    "just text",
    None,
]


def next_state(state: SessionState, tr: Transition) -> SessionState:
    """The state a committed transition leaves: every message (for the tests to read), and the
    tree's shape as the commit stores it (its `tree_fields` over what was stored)."""
    messages = dict(state.messages)
    messages.update({m["id"]: m for m in tr.new_messages})
    if tr.state.core is None:
        return SessionState(core=None, messages=messages, tree=state.tree, applied=tr.state.applied)
    fields = {} if state.tree is None else {
        k.encode(): v for k, v in stored_fields(state.tree).items()}
    fields.update({k.encode(): v for k, v in tr.tree_fields.items()})
    shape = Shape.from_fields(fields)
    assert shape is not None, "a session's first commit stores its shape"
    # the stored shape is the tree's own, message for message, in creation order
    assert shape.flat == Shape.from_messages(creation_order(messages)).flat, (shape.flat, messages)
    return SessionState(core=tr.state.core, messages=messages, tree=shape.flat, applied=tr.state.applied)


def stored_fields(flat: list[str | int]) -> dict[str, bytes]:
    """The meta hash fields holding a stored shape."""
    return Shape(flat, stored=None).dirty_fields()


def loaded(state: SessionState) -> SessionState:
    """What `Store.load` hands the core: the shape and only the bodies `bodies_wanted` names (all
    of them, once, for a session stored before the shape was kept)."""
    if state.tree is None:
        return state
    wanted = bodies_wanted(state.core)
    bodies = {m: state.messages[m] for m in wanted if m in state.messages}
    return state.model_copy(update={"messages": bodies})


def make_app(has_decide: bool = True, decide_on: Iterable[str] | None = None,
             tools: dict[str, ToolInfo] | None = None) -> AppInfo:
    return AppInfo(has_decide=has_decide,
                   decide_on=frozenset(decide_on) if decide_on is not None else None,
                   tools=dict(TOOLS if tools is None else tools))


def checked(apply: Callable[..., Transition], state: SessionState, *args: Any) -> Transition:
    """`apply(state, *args)`, checked against the dispatcher's way of calling it: the machine
    leaves a state it is lent as it was, and given a fresh copy to edit in place
    (`owned=True`, what `Store.load` hands over) it returns the same transition."""
    before = state.model_dump_json()
    tr = apply(state, *args)
    assert state.model_dump_json() == before, "the machine changed the state it was lent"
    owned = apply(SessionState.model_validate_json(before), *args, owned=True)
    assert _comparable(owned) == _comparable(tr)
    return tr


def _comparable(tr: Transition) -> tuple[Any, ...]:
    return (tr.state.model_dump_json(),
            orjson.dumps([tr.new_messages, tr.events, [effect_to_dict(f) for f in tr.effects], tr.waits]),
            tr.idempotency_key, tr.dropped, tr.counts, tr.input_outcome)


Policy = Callable[[dict[str, Any], list[dict[str, Any]]], list[dict[str, Any]]]


class Sim:
    """One session driven by hand. `last` is the last transition; `events` all events so far."""

    def __init__(self, app: AppInfo | None = None, session: str = "s1", *,
                 agents: dict[str, AppInfo] | None = None, limits: Limits | None = None,
                 lifecycle: Lifecycle | None = None, admission: AdmissionLimits | None = None):
        self.app = app if app is not None else make_app()
        self.admission = admission or AdmissionLimits()
        self.lifecycle = lifecycle or Lifecycle()
        self.session = session
        self.agents = agents or {}
        self.limits = limits or Limits()
        self.state = SessionState(core=None)
        self.events: list[dict[str, Any]] = []
        self.effects: list[Effect] = []
        self.transitions: list[Transition] = []
        self.last: Transition | None = None
        self.now = 1_000
        self._entries = itertools.count(1)
        #: the dispatcher traces (docs/tracing.md)
        self.tracing = False

    # ---- plumbing ---------------------------------------------------------------------------

    def ctx(self) -> Context:
        self.now += 1
        return Context(now_ms=self.now, app=self.app, agents=self.agents, limits=self.limits,
                       lifecycle=self.lifecycle, admission=self.admission, tracing=self.tracing)

    def commit(self, tr: Transition, ctx: Context) -> Transition:
        """Check a transition against the contract, then make its state the current one."""
        for event in tr.events:
            EVENT_ADAPTER.validate_python(event)  # raises on any shape the contract does not allow
            assert event["at"] == ctx.now_ms, event
        created = [e["message"] for e in tr.events if e["type"] == "message.created"]
        assert created == [public_message(m) for m in tr.new_messages], (created, tr.new_messages)
        known = set(self.state.messages)
        for m in tr.new_messages:
            assert m["id"] not in known, f"message {m['id']} overwritten"
            assert m["parent_id"] is None or m["parent_id"] in known, f"{m['id']}: unknown parent"
            known.add(m["id"])
        core = tr.state.core
        if core is not None:
            # What the store writes must read back identically.
            assert Core.model_validate_json(core.model_dump_json()) == core
        self.state = next_state(self.state, tr)
        if core is not None:
            # The counts the commit publishes (`n_msgs`, `n_branches`) are the session's own.
            counts = admission.count(self.state.messages.values())
            assert (core.n_msgs, core.n_branches) == (counts.messages, counts.branches), core
        self.events.extend(tr.events)
        self.effects.extend(tr.effects)
        self.transitions.append(tr)
        self.last = tr
        return tr

    def entry(self, value: dict[str, Any], *, key: str | None = None,
              principal: str | None = None) -> Any:
        fields: dict[bytes, bytes] = {b"session": self.session.encode(), b"input": orjson.dumps(value)}
        if key is not None:
            fields[b"id"] = key.encode()
        if principal is not None:
            fields[b"principal"] = principal.encode()
        return decode_input_entry(fields)

    def input(self, value: dict[str, Any], *, key: str | None = None, duplicate: bool = False,
              principal: str | None = None, entry_id: str | None = None,
              engine: bool = False, signed_by: str | None = None) -> Transition:
        """A client's input (`principal`: the entry's field, never believed unsigned);
        `signed_by`: signed by that principal, `engine`: written by the dispatcher itself and
        signed with the engine's key (either signature verified, as the shell does before the
        core sees the entry)."""
        entry = self.entry(value, key=key, principal=principal)
        if engine or signed_by is not None:
            entry = dataclasses.replace(entry, principal=ENGINE_PRINCIPAL if engine else signed_by)
        state = loaded(self.state)
        state = state.model_copy(update={"duplicate": True}) if duplicate else state
        ctx = self.ctx()
        eid = entry_id or f"1-{next(self._entries)}"
        return self.commit(checked(apply_input, state, entry, eid, ctx), ctx)

    def outcome(self, kind: str, work: str, attempt: int, ok: bool = True, value: Any = None,
                error: str | None = None, source: str | None = None,
                usage: dict[str, int] | None = None, lost: bool = False, unrun: bool = False,
                exception: Any = None, interrupt: dict[str, Any] | None = None,
                trace: str | None = None) -> Transition:
        """A work outcome; `lost`: what a dispatcher posts for a job whose worker died;
        `unrun` (with `lost`): what the worker that took a job posts when it gives it back."""
        ctx = self.ctx()
        out = WorkOutcome(session=self.session, work=work, attempt=attempt, kind=kind,  # type: ignore[arg-type]
                          ok=ok, value=value, error=error, source=source, usage=usage, lost=lost, unrun=unrun,
                          exception=exception, interrupt=interrupt, trace=trace)
        return self.commit(checked(apply_outcome, loaded(self.state), out, ctx), ctx)

    # ---- inputs -------------------------------------------------------------------------------

    def create(self, budget: Any = OMIT, metadata: Any = OMIT, **kw: Any) -> Transition:
        value: dict[str, Any] = {"type": "session.create"}
        if budget is not OMIT:
            value["budget"] = budget
        if metadata is not OMIT:
            value["metadata"] = metadata
        return self.input(value, **kw)

    def send(self, content: str = "hi", parent: Any = OMIT, message_id: str | None = None,
             **kw: Any) -> Transition:
        value: dict[str, Any] = {"type": "message.create", "content": content}
        if parent is not OMIT:
            value["parent_id"] = parent
        if message_id is not None:
            value["message_id"] = message_id
        return self.input(value, **kw)

    def resume(self, interrupt_id: str, payload: Any = OMIT, **kw: Any) -> Transition:
        value: dict[str, Any] = {"type": "interrupt.resume", "interrupt_id": interrupt_id}
        if payload is not OMIT:
            value["payload"] = payload
        return self.input(value, **kw)

    def switch(self, head: str, **kw: Any) -> Transition:
        return self.input({"type": "branch.switch", "head": head}, **kw)

    def tool_result(self, call_id: str, result: Any = OMIT, error: Any = OMIT, **kw: Any) -> Transition:
        value: dict[str, Any] = {"type": "tool.result", "call_id": call_id}
        if result is not OMIT:
            value["result"] = result
        if error is not OMIT:
            value["error"] = error
        return self.input(value, **kw)

    # ---- outcomes -----------------------------------------------------------------------------

    @property
    def deciding(self) -> Deciding | None:
        return self.core.deciding

    @property
    def trigger(self) -> dict[str, Any]:
        """The trigger of the decide job in flight."""
        assert self.deciding is not None, "no decide job in flight"
        return self.deciding.item.trigger

    @property
    def proposed(self) -> list[dict[str, Any]]:
        assert self.deciding is not None, "no decide job in flight"
        return self.deciding.item.proposed

    def decide(self, actions: list[dict[str, Any]] | None = None, *, expect: str | None = None,
               value: Any = OMIT) -> Transition:
        """Answer the decide job in flight: with `actions`, or with what was proposed."""
        d = self.deciding
        assert d is not None, "no decide job in flight"
        if expect is not None:
            assert d.item.trigger["type"] == expect, (d.item.trigger, expect)
        if value is OMIT:
            value = {"actions": d.item.proposed if actions is None else actions}
        return self.outcome("decide", d.work, d.attempt, value=value)

    def decide_fail(self, error: str = "boom") -> Transition:
        d = self.deciding
        assert d is not None, "no decide job in flight"
        return self.outcome("decide", d.work, d.attempt, ok=False, error=error)

    def settle_decides(self, policy: Policy | None = None, limit: int = 50) -> list[str]:
        """Answer decide jobs until none is in flight (proposed, or `policy(trigger, proposed)`).

        Returns the types of the triggers decided, in order."""
        seen: list[str] = []
        while self.deciding is not None:
            assert len(seen) < limit, f"decide loop did not settle: {seen}"
            t, p = self.trigger, self.proposed
            seen.append(t["type"])
            self.decide(policy(t, p) if policy else None)
        return seen

    def work(self, work_id: str) -> Work:
        return self.core.work[work_id]

    def running_llm(self) -> list[str]:
        return [w.id for w in self.core.work.values() if w.kind == "llm"]

    def finish_llm(self, call_id: str | None = None, content: str = "", tool_calls: list[Any] | None = None,
                   *, ok: bool = True, error: str | None = None, attempt: int | None = None,
                   value: Any = OMIT) -> Transition:
        """Post an LLM outcome. `tool_calls` items: a name, or a dict {id?, name, arguments?}."""
        if call_id is None:
            running = self.running_llm()
            assert len(running) == 1, f"which LLM call? {running}"
            call_id = running[0]
        if attempt is None:
            w = self.core.work.get(call_id)
            attempt = w.attempt if w is not None else 1
        if value is OMIT:
            value = {"content": content}
            if tool_calls:
                calls = []
                for n, c in enumerate(tool_calls):
                    c = {"name": c} if isinstance(c, str) else dict(c)
                    c.setdefault("id", f"model-{n}")
                    c.setdefault("arguments", {"n": n})
                    calls.append(c)
                value["tool_calls"] = calls
        return self.outcome("llm", call_id, attempt, ok=ok, value=value if ok else None, error=error)

    def finish_tool(self, call_id: str, result: Any = "done", *, error: str | None = None,
                    attempt: int | None = None) -> Transition:
        if attempt is None:
            w = self.core.work.get(call_id)
            attempt = w.attempt if w is not None else 1
        if error is not None:
            return self.outcome("tool", call_id, attempt, ok=False, error=error)
        return self.outcome("tool", call_id, attempt, ok=True, value=result)

    # ---- reading ------------------------------------------------------------------------------

    @property
    def core(self) -> Core:
        assert self.state.core is not None, "no session"
        return self.state.core

    @property
    def head(self) -> str | None:
        return self.core.head

    def msg(self, mid: str) -> dict[str, Any]:
        return public_message(self.state.messages[mid])

    def turn(self, turn_id: str) -> Turn:
        return self.core.turns[turn_id]

    def held(self, turn_id: str) -> list[QueuedTrigger]:
        return self.core.turns[turn_id].held

    def held_refs(self, turn_id: str) -> list[tuple[str, str | None]]:
        return [(q.trigger["type"], q.trigger.get("call_id") or q.trigger.get("interrupt_id"))
                for q in self.held(turn_id)]

    def interrupt(self, iid: str) -> Interrupt:
        return self.core.interrupts[iid]

    def show(self) -> dict[str, Any]:
        return show(self.state)

    def mark(self) -> int:
        """A position in `events`/`effects`, for `since=`."""
        return len(self.events)

    def of(self, event_type: str, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.events[since:] if e["type"] == event_type]

    def types(self, tr: Transition | None = None) -> list[str]:
        """Event types of a transition (default: the last one)."""
        tr = tr or self.last
        assert tr is not None
        return [e["type"] for e in tr.events]

    def ev(self, event_type: str, tr: Transition | None = None) -> dict[str, Any]:
        """The one event of that type in a transition (default: the last one)."""
        tr = tr or self.last
        assert tr is not None
        found = [e for e in tr.events if e["type"] == event_type]
        assert len(found) == 1, (event_type, [e["type"] for e in tr.events])
        return found[0]

    def enqueued(self, job: str | None = None, tr: Transition | None = None) -> list[Enqueue]:
        """The jobs a transition enqueued (default: the last one), of one kind (decide/llm/tool)."""
        tr = tr or self.last
        assert tr is not None
        kind = JobKind(job) if job is not None else None  # a misspelt kind fails, not matches nothing
        return [f for f in tr.effects if isinstance(f, Enqueue) and (kind is None or f.job == kind)]

    def llm_request(self, job: Enqueue) -> dict[str, Any]:
        """The request an LLM job's worker hands the app's `llm` (workers/jobs.py `llm_request`):
        the bodies of the messages the job names, as stored, then the call's own arguments."""
        assert job.job == JobKind.LLM, job
        return {"messages": [public_message(self.state.messages[mid]) for mid in job.args["chain"]],
                **job.args["request"]}

    def enqueued_work(self, job: str | None = None, tr: Transition | None = None) -> list[str]:
        return [f.work for f in self.enqueued(job, tr)]

    def cancelled(self, tr: Transition | None = None) -> list[Cancel]:
        tr = tr or self.last
        assert tr is not None
        return [f for f in tr.effects if isinstance(f, Cancel)]

    # ---- scenarios ----------------------------------------------------------------------------

    def start(self, content: str = "hi", parent: Any = OMIT, **kw: Any) -> str:
        """Send a client message and answer decides with proposed until its LLM call starts.

        Returns the new message's id."""
        self.send(content, parent, **kw)
        mid = self.ev("message.created")["message"]["id"]
        while self.deciding is not None:
            t = self.trigger
            self.decide()
            if t["type"] == "message.created" and t["message"]["id"] == mid:
                break
        return mid

    def reply_tools(self, *names: str, call_id: str | None = None) -> list[str]:
        """Finish the LLM call with one tool call per name; returns the minted call ids."""
        self.finish_llm(call_id, tool_calls=list(names))
        calls = self.ev("message.created")["message"]["tool_calls"]
        return [c["id"] for c in calls]

    def pause_on_tool(self, *names: str, reason: str = "confirm", interrupt_on: int = 0,
                      **interrupt: Any) -> tuple[str, list[str], str]:
        """A turn whose reply calls `names`; the tool.execute of call `interrupt_on` raises an
        interrupt, the ones before it run. Returns (turn id, call ids, interrupt id)."""
        turn = self.start("please")
        calls = self.reply_tools(*names)
        for call in calls[:interrupt_on]:
            assert self.trigger["call_id"] == call
            self.decide(expect="tool.execute")
        assert self.trigger["call_id"] == calls[interrupt_on]
        self.decide([{"type": "interrupt", "reason": reason, **interrupt}], expect="tool.execute")
        iid = self.ev("interrupt.raised")["interrupt_id"]
        return turn, calls, iid

    # ---- budgets and deadlines ------------------------------------------------------------------

    def open_session(self, budget: Any = OMIT, metadata: Any = OMIT) -> Transition:
        """session.create, and its session.created trigger decided with what was proposed."""
        tr = self.create(budget=budget, metadata=metadata)
        self.decide(expect="session.created")
        return tr

    def budget_stopped(self) -> str:
        """A session with no model calls allowed whose first message is decided as proposed:
        its model call is blocked by the budget. The budget interrupt's id."""
        self.open_session(budget={"llm_calls": 0})
        self.send("hi")
        self.decide(expect="message.created")
        [iid] = list(self.core.interrupts)
        return iid

    def deadline(self, interrupt_id: str, attempt: int = 0) -> Transition:
        """What a dispatcher posts when an interrupt's timeout_s has passed (docs/protocol.md, Actions)."""
        return self.outcome("deadline", interrupt_id, attempt, ok=True)

    def index_adds(self, tr: Transition | None = None) -> list[IndexAdd]:
        tr = tr or self.last
        assert tr is not None
        return [f for f in tr.effects if isinstance(f, IndexAdd)]
