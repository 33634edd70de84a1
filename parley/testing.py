"""`parley.testing`: run an app through whole turns in one process, without Redis, for its own
unit tests (README, "Testing an app").

    from parley.testing import AppRunner

    def test_paying_asks_first():
        run = AppRunner("myapp").session()
        run.send("pay acme 120")
        [question] = run.questions
        assert question.reason == "approval"
        run.resume(question, {"approved": True})
        assert run.reply == "Paid."

It is the engine itself, not a model of it: every input and outcome goes through the core the
dispatcher runs (every rule, check and refusal), and every job through the bodies a worker
runs (`decide`, tools, the app's `llm`, `parley.interrupt()` in tools). What it leaves out is
the shell around them: Redis, queues, processes, signing (a `principal` given to `resume` is
taken as a verified signature) and time limits. The clock stands still until `advance()`
moves it, so a question's `timeout_s` passes only when the test says so.
"""

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import orjson

from parley.cli.appinfo import app_info
from parley.dispatcher.core import (
    Cancel,
    Close,
    Context,
    DeadlineAdd,
    DeadlineRemove,
    Effect,
    Enqueue,
    IndexAdd,
    IndexRemove,
    Limits,
    Report,
    Spawn,
    Transition,
    apply_input,
    apply_outcome,
)
from parley.schemas.codec import InputError, decode_input_entry
from parley.schemas.codes import InputOutcome, SessionStatus
from parley.schemas.deltas import Delta
from parley.schemas.jobs import JobKind
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import ENGINE_PRINCIPAL
from parley.schemas.state import SessionState
from parley.schemas.view import creation_order, public_message
from parley.workers import jobs
from parley.workers.app import App, load_agents, load_app
from parley.workers.streaming import DeltaSink, streaming

#: where the still clock starts (Unix ms: 2026-01-01T00:00:00Z)
START_MS = 1_767_225_600_000


class InputNotApplied(Exception):
    """An input the engine refused or ignored (its `code`, and the engine's own message)."""

    def __init__(self, outcome: str, code: str, message: str):
        super().__init__(f"{outcome} {code}: {message}" if message else f"{outcome} {code}")
        self.outcome = outcome
        self.code = code


class Unsettled(Exception):
    """The app ran more steps than `max_steps` without the session going quiet (a loop)."""


@dataclass(frozen=True, slots=True)
class Question:
    """An open interrupt: what a person would be asked, and how they may answer."""

    interrupt_id: str
    reason: str
    payload: Any
    #: the tool call it is about: the one whose code asked it (`parley.interrupt()`), or the
    #: call an approval question is for; None for a decision's own question
    call_id: str | None
    resumable_by: list[str] | None
    response_schema: dict[str, Any] | None
    #: when its `timeout_s` passes, on the runner's clock (Unix ms); None: never
    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the session made, settled or not."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    #: what the model reads of its result (a string result as is, anything else as JSON);
    #: None while it is open or when it failed
    content: str | None = None
    #: the tool error it was settled with (None: it returned, or it is open)
    error: str | None = None
    settled: bool = False


@dataclass(frozen=True, slots=True)
class _Job:
    session: str
    job: Enqueue


@dataclass(frozen=True, slots=True)
class _Input:
    session: str
    value: dict[str, Any]
    principal: str | None = None


_Item = _Job | _Input | WorkOutcome


class AppRunner:
    """An app (`"module[:attr]"` or a module) and the sessions it runs, all in this process.

    `llm`: a model to use instead of the app's own (a `ScriptedModel`, or any callable taking
    the request); `limits`: the time limits the jobs would have (they are not enforced here,
    but the engine records them). `max_steps`: how many inputs, jobs and outcomes one call may
    run before it gives up with `Unsettled`."""

    def __init__(self, app: str | ModuleType, *, llm: Callable[[dict[str, Any]], Any] | None = None,
                 limits: Limits | None = None, max_steps: int = 1000):
        loaded = load_app(app if isinstance(app, str) else app.__name__)
        self.app: App = dataclasses.replace(loaded, llm=llm) if llm is not None else loaded
        self._agents = load_agents(self.app)
        self._info = app_info(self.app)
        self._agent_infos = {spec: app_info(agent) for spec, agent in self._agents.items()}
        self._limits = limits or Limits()
        self.max_steps = max_steps
        self.now_ms = START_MS
        self._states: dict[str, SessionState] = {}
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._pending: deque[_Item] = deque()
        self._timers: dict[tuple[str, str], int] = {}
        self._entries = itertools.count(1)
        self._deltas: dict[str, list[Delta]] = {}

    def session(self, session_id: str = "test", *, budget: dict[str, Any] | None = None,
                metadata: dict[str, Any] | None = None) -> "SessionRun":
        """Create a session (`session.create`) and return its handle."""
        value: dict[str, Any] = {"type": "session.create"}
        if budget is not None:
            value["budget"] = budget
        if metadata is not None:
            value["metadata"] = metadata
        run = SessionRun(self, session_id)
        run.input(value)
        return run

    def advance(self, seconds: float) -> None:
        """Move the clock on: every deadline that passes fires (a question's `timeout_s`, a
        sub-agent's time limit), in the order they fall, and the sessions run until quiet."""
        self.now_ms += int(seconds * 1000)
        for (session, timer), at in sorted(self._timers.items(), key=lambda item: item[1]):
            if at <= self.now_ms:
                del self._timers[(session, timer)]
                self._pending.append(WorkOutcome(session=session, work=timer, attempt=0, kind="deadline",
                                                 ok=True))
        self._run()

    # ---- the engine -------------------------------------------------------------------------

    def _context(self) -> Context:
        return Context(now_ms=self.now_ms, app=self._info, agents=self._agent_infos, limits=self._limits)

    def _send(self, session: str, value: dict[str, Any], principal: str | None) -> Transition:
        """Apply one input now (and run what it started): its transition."""
        tr = self._apply_input(_Input(session, value, principal))
        self._run()
        return tr

    def _apply_input(self, item: _Input) -> Transition:
        fields: dict[bytes, bytes] = {b"session": item.session.encode(), b"input": orjson.dumps(item.value)}
        entry = decode_input_entry(fields)  # the codec's checks, as a dispatcher reads a stream
        if item.principal is not None:
            entry = dataclasses.replace(entry, principal=item.principal)
        tr = apply_input(self._state(item.session), entry, f"1-{next(self._entries)}", self._context())
        self._commit(item.session, tr)
        return tr

    def _state(self, session: str) -> SessionState:
        return self._states.get(session) or SessionState(core=None)

    def _commit(self, session: str, tr: Transition) -> None:
        state = self._state(session)
        messages = {**state.messages, **{m["id"]: m for m in tr.new_messages}}
        # every body stays loaded, so the core rebuilds the tree's shape from them (tree None)
        self._states[session] = SessionState(core=tr.state.core, messages=messages, applied=tr.state.applied)
        self._events.setdefault(session, []).extend(tr.events)
        for effect in tr.effects:
            self._effect(session, effect)

    def _effect(self, session: str, effect: Effect) -> None:
        match effect:
            case Enqueue():
                self._pending.append(_Job(session, effect))
            case Cancel():
                self._pending = deque(i for i in self._pending if not (
                    isinstance(i, _Job) and i.session == session and i.job.job == effect.job
                    and i.job.work == effect.work and i.job.attempt == effect.attempt))
            case IndexAdd(deadline=int(at)):
                self._timers[(session, effect.interrupt_id)] = at
            case IndexRemove():
                self._timers.pop((session, effect.interrupt_id), None)
            case DeadlineAdd():
                self._timers[(session, effect.timer)] = effect.at
            case DeadlineRemove():
                self._timers.pop((session, effect.timer), None)
            case Spawn():
                self._pending.append(_Input(effect.child, {
                    "type": "session.create", "parent": effect.parent.model_dump(), "task": effect.content},
                    ENGINE_PRINCIPAL))
            case Close():
                self._pending.append(_Input(effect.child, {
                    "type": "session.close", "reason": effect.reason,
                    "parent": {"session": session, "call_id": effect.call_id, "attempt": effect.attempt}},
                    ENGINE_PRINCIPAL))
            case Report():
                self._pending.append(effect.outcome)
            case _:  # the listing, the retention, the metrics: Redis's, not the session's
                pass

    def _run(self) -> None:
        """Run what is pending, in the order it was asked for, until nothing is."""
        for _step in range(self.max_steps):
            if not self._pending:
                return
            item = self._pending.popleft()
            if isinstance(item, _Input):
                self._apply_input(item)
            elif isinstance(item, _Job):
                self._apply_outcome(self._ran(item))
            else:
                self._apply_outcome(item)
        if self._pending:
            raise Unsettled(f"the sessions did not settle in {self.max_steps} steps (an app that loops?); "
                            f"next: {self._pending[0]!r}")

    def _apply_outcome(self, outcome: WorkOutcome) -> None:
        self._commit(outcome.session, apply_outcome(self._state(outcome.session), outcome, self._context()))

    def _ran(self, item: _Job) -> WorkOutcome:
        """One job, run by the worker's own job bodies."""
        job = item.job
        payload: dict[str, Any] = {"session": item.session, "work": job.work, "attempt": job.attempt,
                                   "reply_to": job.reply_to, **job.args}
        app = self.app if job.app is None else self._agents[job.app]
        body: Callable[[], Any]
        if job.job == JobKind.DECIDE:
            body = lambda: jobs.decision_of(app, payload)  # noqa: E731
        elif job.job == JobKind.LLM:
            messages = self._state(item.session).messages
            request = {"messages": [public_message(messages[m]) for m in job.args["chain"]],
                       **job.args["request"]}
            # a clock that moves a second per look: each piece is a delta of its own, whatever
            # the speed of the test's model, so what a test sees does not depend on timing
            sink = DeltaSink(call_id=job.work, attempt=job.attempt,
                             write=self._deltas.setdefault(item.session, []).extend,
                             clock=itertools.count(0.0, 1.0).__next__)

            def body() -> Any:
                with streaming(sink):  # what the model streams (parley.stream_delta), kept per session
                    return jobs.reply_of(app, request)
        else:
            body = lambda: jobs.tool_result_of(app, payload)  # noqa: E731
        result = jobs.ran(payload, job.job.value, body)
        return WorkOutcome(session=item.session, work=job.work, attempt=job.attempt, kind=job.job.value,
                           ok=result.ok, value=result.value, error=result.error, lost=result.lost,
                           exception=result.exception, interrupt=result.interrupt)


class SessionRun:
    """One session of an `AppRunner`: its inputs, and what it holds after each."""

    def __init__(self, runner: AppRunner, session: str):
        self.runner = runner
        self.id = session

    # ---- inputs: each runs until the session is quiet -----------------------------------------

    def input(self, value: dict[str, Any], *, principal: str | None = None) -> "SessionRun":
        """Any input (docs/protocol.md, "Inputs"); raises `InputNotApplied` when the engine
        refuses or ignores it (and `parley.schemas.codec.InputError` for one no dispatcher
        would read), so a test sees at once what a producer would be told."""
        try:
            tr = self.runner._send(self.id, value, principal)
        except InputError as exc:
            raise InputNotApplied("refused", exc.code.value, str(exc)) from None
        if tr.input_outcome is not None and tr.input_outcome[1] != InputOutcome.APPLIED:
            _type, outcome, code = tr.input_outcome
            told = next((e for e in tr.events if e["type"] in ("input.refused", "input.ignored")), {})
            raise InputNotApplied(outcome.value, str(code), str(told.get("message") or ""))
        return self

    def send(self, content: str, *, parent_id: str | None = None) -> "SessionRun":
        """A user message (at the head, or under `parent_id`: a fork)."""
        value: dict[str, Any] = {"type": "message.create", "content": content}
        if parent_id is not None:
            value["parent_id"] = parent_id
        return self.input(value)

    def resume(self, question: "Question | str | None" = None, payload: Any = None, *,
               principal: str | None = None) -> "SessionRun":
        """Answer a question (a `Question`, its id, or None: the only one open) with `payload`.
        `principal`: who signed the answer, taken as verified (an approver, `resumable_by`)."""
        if question is None:
            open_now = self.questions
            if len(open_now) != 1:
                raise ValueError(f"resume() without a question needs exactly one open; there are "
                                 f"{len(open_now)}: {[q.interrupt_id for q in open_now]}")
            question = open_now[0]
        iid = question if isinstance(question, str) else question.interrupt_id
        return self.input({"type": "interrupt.resume", "interrupt_id": iid, "payload": payload},
                          principal=principal)

    def tool_result(self, call_id: str, result: Any = None, *, error: str | None = None) -> "SessionRun":
        """Settle a deferred tool's call, as a client does."""
        value: dict[str, Any] = {"type": "tool.result", "call_id": call_id}
        value.update({"error": error} if error is not None else {"result": result})
        return self.input(value)

    def switch(self, head: str) -> "SessionRun":
        return self.input({"type": "branch.switch", "head": head})

    def close(self, reason: str | None = None) -> "SessionRun":
        return self.input({"type": "session.close", **({"reason": reason} if reason else {})})

    # ---- what it holds ------------------------------------------------------------------------

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event so far, as a client reads them (docs/protocol.md, "Events")."""
        return list(self.runner._events.get(self.id, []))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every message, in the order created (all branches), as `parley show` lists them."""
        return [public_message(m) for m in creation_order(self.runner._state(self.id).messages)]

    @property
    def transcript(self) -> list[dict[str, Any]]:
        """The branch at the head, root first: what the model sees next."""
        state = self.runner._state(self.id)
        core = state.core
        by_id = state.messages
        out: list[dict[str, Any]] = []
        mid = core.head if core is not None else None
        while mid is not None:
            out.append(public_message(by_id[mid]))
            mid = by_id[mid].get("parent_id")
        return out[::-1]

    @property
    def reply(self) -> str | None:
        """The content of the last assistant message on the head's branch (None: none yet)."""
        return next((m.get("content") for m in reversed(self.transcript) if m["role"] == "assistant"
                     and m.get("content")), None)

    @property
    def questions(self) -> list[Question]:
        """The open interrupts, oldest first."""
        core = self.runner._state(self.id).core
        if core is None:
            return []
        out = []
        for rec in sorted(core.interrupts.values(), key=lambda r: r.raised_at):
            out.append(Question(interrupt_id=rec.id, reason=rec.reason, payload=rec.payload,
                                call_id=rec.call or rec.approves, resumable_by=rec.resumable_by,
                                response_schema=rec.response_schema, deadline_ms=rec.deadline))
        return out

    @property
    def tool_calls(self) -> list[ToolCall]:
        """Every tool call of every branch, in the order made, with how each was settled."""
        messages = self.messages
        settled = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
        completed = {e["call_id"]: e for e in self.of("tool.completed")}
        out = []
        for m in messages:
            for call in m.get("tool_calls") or []:
                done = completed.get(call["id"])
                if done is None:
                    out.append(ToolCall(call["id"], call["name"], call["arguments"]))
                elif "error" in done:
                    out.append(ToolCall(call["id"], call["name"], call["arguments"], error=done["error"],
                                        settled=True))
                else:
                    out.append(ToolCall(call["id"], call["name"], call["arguments"],
                                        content=settled[call["id"]]["content"], settled=True))
        return out

    @property
    def children(self) -> list["SessionRun"]:
        """The child sessions its sub-agent calls started, in the order started."""
        core = self.runner._state(self.id).core
        return [SessionRun(self.runner, child) for child in (core.children if core is not None else [])]

    @property
    def closed(self) -> bool:
        core = self.runner._state(self.id).core
        return core is not None and core.status == SessionStatus.CLOSED

    @property
    def deltas(self) -> list[Delta]:
        """What the model streamed (`parley.stream_delta`, `OpenAICompatible(stream=True)`), in
        order: the pieces watchers of the session would see before each reply is recorded."""
        return list(self.runner._deltas.get(self.id, []))

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The events that carry an exception your app's code raised (a decide, tool or model
        call): empty when none did."""
        return [e for e in self.events if e.get("exception")]
