"""A transition's result, and the working copy of a session while one is computed.

`Transition` is what the store commits. `Tx` is the session being changed: its core
(edited in place), the messages it adds, and the events, effects and counts it emits.
Every other module of the core is a set of functions over a `Tx`; this one holds only
the plumbing they share (ids, messages, events, effects, tree queries).
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from parley.dispatcher.core import admission
from parley.dispatcher.core.context import AppInfo, Context
from parley.dispatcher.core.effects import Cancel, Effect, Enqueue
from parley.schemas import tree
from parley.schemas.codes import DropReason, InputOutcome
from parley.schemas.events import USER_VALUE_FIELDS
from parley.schemas.jobs import JobKind
from parley.schemas.listing import Listed, listed
from parley.schemas.state import Core, Interrupt, SessionState, Turn
from parley.schemas.tracing import Attribute, TraceSpan
from parley.schemas.view import creation_order, public_message


@dataclass(slots=True)
class Transition:
    """What one applied entry changes: the state to store and what to append and do."""

    state: SessionState
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    idempotency_key: str | None = None
    #: why a work outcome changed nothing (stale attempt, voided, settled): for logs and metrics
    dropped: DropReason | None = None
    #: counts for metrics: (kind, label) -> n
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the input's (type, outcome: applied/refused/ignored, code) for metrics
    input_outcome: tuple[str, InputOutcome, str] | None = None
    #: seconds from raise to resume of the interrupts this transition resumed
    waits: list[float] = field(default_factory=list)
    #: the session did not exist before this transition and does now: the commit keeps its
    #: keys for good (a session that does not exist keeps them only for a short while)
    created: bool = False
    #: the meta hash fields of the tree's shape to write (schemas/tree.py): the chunks the new
    #: messages fall in, or the whole shape of a session stored before it was kept
    tree_fields: dict[str, bytes] = field(default_factory=dict)
    #: the trace this transition belongs to (the first traced turn it touched), and the spans
    #: the core can tell whole (an interrupt's life): the shell exports them (docs/tracing.md)
    trace: str | None = None
    spans: list[TraceSpan] = field(default_factory=list)


class Tx:
    """One transition in progress: a working copy of the session and what it emits."""

    def __init__(self, state: SessionState, ctx: Context, session: str, owned: bool = False):
        self.ctx = ctx
        self.session = session
        # The transition edits the core in place: a copy, unless the caller hands its state
        # over (the dispatcher's freshly loaded state, used once and dropped).
        self.core: Core | None = state.core
        self.existed = state.core is not None
        if self.core is not None and not owned:
            self.core = self.core.model_copy(deep=True)
        # the bodies loaded (state.bodies_wanted); existing messages are immutable, new ones go
        # to self.added
        self.msgs = state.messages
        self.added: dict[str, dict[str, Any]] = {}
        # the tree's shape, new messages included: every structural question is asked of it.
        # A session stored before the shape was kept has all its messages loaded: built from them.
        if state.tree is not None:
            flat = state.tree if owned else list(state.tree)
            self.shape = tree.Shape(flat, stored=len(flat) // tree.WIDTH)
        elif self.core is not None:
            self.shape = tree.Shape.from_messages(creation_order(state.messages))
        else:
            self.shape = tree.Shape(stored=None)
        self.out = Transition(state=SessionState(core=None, applied=dict(state.applied)))
        self.held_before = self.held_count()
        # gated calls a decision asked to run without an approval: asked about once its other
        # actions are applied (core/approvals.py), so no work starts on the branch it parks
        self.asks: list[str] = []
        if self.core is not None and self.core.n_msgs != len(self.shape):
            self._recount()
        # where the session is in the list of sessions, for the move turns.finish emits
        self.listed_before: Listed | None = listed(self.core)

    @property
    def c(self) -> Core:
        """The core, for code that runs only once the session exists."""
        assert self.core is not None
        return self.core

    @property
    def app(self) -> AppInfo:
        """The session's own app: a child session runs its sub-agent's app."""
        if self.core is not None and self.core.app is not None:
            return self.ctx.agents.get(self.core.app, AppInfo())
        return self.ctx.app

    def _recount(self) -> None:
        """A session stored before its counts were kept: count its messages once."""
        self.c.n_msgs, self.c.n_branches = len(self.shape), self.shape.branches()

    def counts(self) -> admission.Counts:
        return admission.Counts(messages=self.c.n_msgs, branches=self.c.n_branches)

    def has_child(self, mid: str | None) -> bool:
        """Whether a message already has a child (None, a new root's parent: no), from the shape."""
        return mid is not None and self.shape.has_child(mid)

    def held_count(self) -> int:
        return sum(len(t.held) for t in self.core.turns.values()) if self.core else 0

    # ---- what the transition emits -----------------------------------------------------------

    def emit(self, event_type: str, **fields: Any) -> None:
        """An event as stored (docs/protocol.md, Events): a field that is null is left out, as
        every event of every session is kept in Redis and a null says nothing a missing field
        does not; but a field holding a user's JSON value (`payload`, `request`, `result`) is
        kept even when that value is null, where null is what was given."""
        event = {"type": event_type, "at": self.ctx.now_ms}
        for name, value in fields.items():
            if value is not None or name in USER_VALUE_FIELDS:
                event[name] = value
        self.out.events.append(event)

    def count(self, kind: str, label: str) -> None:
        key = (kind, label)
        self.out.counts[key] = self.out.counts.get(key, 0) + 1

    def next_seq(self) -> int:
        """The next effect's `seq` (the session's effects are numbered across transitions)."""
        n = self.c.seq.get("fx", 0) + 1
        self.c.seq["fx"] = n
        return n

    def effect(self, fx: Effect) -> None:
        self.out.effects.append(fx)

    def enqueue(self, job: JobKind, work: str, attempt: int, args: dict[str, Any],
                timeout_s: float, turn: str | None = None) -> None:
        """A job of `turn`'s: it carries the turn's trace context, when the turn is traced (a job
        of no turn, the decide of a session.created: the trace of the transition, if any)."""
        if (trace := self.trace_of(turn) or self.out.trace) is not None:
            args = {**args, "trace": trace}
        self.effect(Enqueue(seq=self.next_seq(), job=job, work=work, attempt=attempt, timeout=timeout_s,
                            reply_to=self.ctx.results_stream, app=self.c.app, args=args))

    # ---- traces (docs/tracing.md) -------------------------------------------------------------

    def trace_of(self, turn: str | None) -> str | None:
        """The trace context of a turn (None: untraced, or gone); the transition is in that
        trace from then on, unless an earlier turn it touched already named one."""
        found = self.core.turns.get(turn) if self.core is not None and turn is not None else None
        if found is None or found.trace is None:
            return None
        self.touch(found.trace)
        return found.trace

    def touch(self, trace: str | None) -> None:
        if self.out.trace is None and trace is not None:
            self.out.trace = trace

    def interrupt_span(self, rec: Interrupt, outcome: str, **attributes: Attribute | None) -> None:
        """The span of an interrupt's life, raised to `outcome` (resumed, timed_out, cancelled),
        in its turn's trace: our proposal for what the GenAI conventions do not name yet."""
        if rec.trace is None:
            return
        self.touch(rec.trace)
        attrs: dict[str, Attribute] = {
            "parley.session": self.session, "parley.interrupt.id": rec.id,
            "parley.interrupt.reason": rec.reason, "parley.interrupt.outcome": outcome,
            "parley.interrupt.wait_ms": max(0, self.ctx.now_ms - rec.raised_at)}
        if (call := rec.call or rec.approves) is not None:  # the call that asked, or that it approves
            attrs["gen_ai.tool.call.id"] = call
        attrs.update({k: v for k, v in attributes.items() if v is not None})
        self.out.spans.append(TraceSpan("parley.interrupt", rec.trace, rec.raised_at, self.ctx.now_ms, attrs))

    def cancel(self, job: JobKind, work: str, attempt: int) -> None:
        self.effect(Cancel(seq=self.next_seq(), job=job, work=work, attempt=attempt))

    # ---- ids and messages ---------------------------------------------------------------------

    def mint(self, kind: str) -> str:
        """Sequential ids per session (`msg-1`, `call-1`, `llm-1`, `int-1`, `dec-1`), skipping
        ids a client or an app already chose (I1)."""
        while True:
            n = self.c.seq.get(kind, 0) + 1
            self.c.seq[kind] = n
            candidate = f"{kind}-{n}"
            if kind == "msg" and self.has(candidate):
                continue
            if kind == "int" and (candidate in self.c.interrupts or candidate in self.c.resumed):
                continue
            return candidate

    def has(self, mid: str | None) -> bool:
        """Whether the session has this message (from the shape: no body needed)."""
        return mid is not None and self.shape.has(mid)

    def msg(self, mid: str | None) -> dict[str, Any] | None:
        """A message's body: one this transition added, or one loaded (`bodies_wanted`)."""
        if mid is None:
            return None
        return self.added.get(mid) or self.msgs.get(mid)

    def add_message(self, message: dict[str, Any], source: dict[str, Any] | None = None) -> None:
        """Record a new message (stored by the commit) and announce it. Its `order` (internal,
        like `turn`) is its place in the session's creation order: ids a producer chose carry
        no number, and `parley show` lists messages as they were created. `source`: the input
        entry a client's message came from (the event's `input`)."""
        message["order"] = self.c.seq["order"] = self.c.seq.get("order", 0) + 1
        parent = message.get("parent_id")
        counts = admission.after(self.counts(), parent, self.has_child(parent))
        self.c.n_msgs, self.c.n_branches = counts.messages, counts.branches
        self.added[message["id"]] = message
        self.shape.add(message["id"], parent, message.get("turn"))
        self.out.new_messages.append(message)
        self.emit("message.created", message=public_message(message),
                  **({"input": source} if source is not None else {}))

    def append(self, turn: Turn, message: dict[str, Any]) -> dict[str, Any]:
        """Append an engine message at the turn's tip: never a fork (docs/protocol.md, Actions)."""
        message = {"id": self.mint("msg"), "parent_id": turn.tip, **message, "turn": turn.id}
        self.add_message(message)
        if self.c.head == turn.tip:
            self.c.head = message["id"]
        turn.tip = message["id"]
        return message

    # ---- tree queries (parley.schemas.tree, over this working copy) ---------------------------

    def ancestors(self, mid: str | None) -> Iterator[str]:
        return self.shape.ancestors(mid)

    def parking(self, head: str | None) -> list[str]:
        return tree.parking(self.c, self.shape.ancestors, head)

    def in_region(self, tip: str, anchor: str | None) -> bool:
        return tree.in_region(self.shape.ancestors, tip, anchor)

    def turn_of(self, mid: str | None) -> Turn | None:
        turn = self.shape.turn_of(mid) if mid is not None else None
        return self.c.turns.get(turn) if turn is not None else None

    def is_active(self, turn: Turn) -> bool:
        return self.turn_of(self.c.head) is turn

    def result(self) -> Transition:
        """The transition as it stands (`turns.finish` runs the end-of-transition steps first)."""
        self.out.state.core = self.core
        self.out.created = not self.existed and self.core is not None
        if self.core is not None:
            self.out.tree_fields = self.shape.dirty_fields()
        return self.out
