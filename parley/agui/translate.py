"""A Parley session's events and token stream, read as AG-UI events (pure).

One `Translator` per run. It is fed what the session's streams hold after the run's cursor, in
order (`delta`, `event`), and returns the AG-UI events each one makes:

- a model reply streamed as deltas is a text message from its first piece (its message id is
  the model call's, `llm-N`), closed when the reply is recorded; a reply that was not
  streamed is one text message under its Parley message id;
- the reply's tool calls are TOOL_CALL_START / ARGS / END (the ids are Parley's `call-N`), a
  call's result TOOL_CALL_RESULT;
- a user message sent by this run is not echoed (the front end has it); one sent by anyone
  else is;
- interrupts raised, answered and cancelled are tracked, so that the run can end with the
  ones still open.

When the text streamed for a reply is not the reply recorded (the adapter started again
after a failed request, or a worker was lost mid-stream and the call ran again) AG-UI has no
way to take text back: the translator closes what it streamed, and `needs_snapshot` asks the
endpoint to end the run with a MESSAGES_SNAPSHOT of the session, which replaces the front
end's copy.

`ending` says when the run is over by itself: its own input was refused or ignored, the
turn completed, or the session was closed.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from ag_ui.core import (
    BaseEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from parley.schemas.deltas import Delta
from parley.schemas.events import (
    Event,
    InputIgnored,
    InputRefused,
    InterruptCancelled,
    InterruptRaised,
    InterruptResumed,
    LlmCompleted,
    MessageCreated,
    SessionClosed,
    ToolStarted,
    TurnCompleted,
)

#: what an input of the run may be ignored as without ending it: the same run posted again
#: (`duplicate`), an answer someone gave first (`already_resumed`)
REPEATS = frozenset({"duplicate", "already_resumed"})


@dataclass(frozen=True, slots=True)
class Ending:
    """How the run ends by itself: `outcome` success, cancelled (the session was closed) or
    error (with `code` and `message`, a RUN_ERROR)."""

    outcome: str
    code: str | None = None
    message: str | None = None


@dataclass
class _Stream:
    """The text message a model call is streaming into."""

    message_id: str
    attempt: int
    text: str = ""


@dataclass
class Translator:
    session: str
    #: the stream entries of the inputs this run sent: their refusal ends the run
    own_entries: frozenset[str]
    #: interrupts open when the run started (their ids)
    open_interrupts: set[str] = field(default_factory=set)
    #: the `interrupt.raised` events this run saw, by id (their tool call ids)
    raised: dict[str, InterruptRaised] = field(default_factory=dict)
    ending: Ending | None = None
    needs_snapshot: bool = False
    #: an input of this run was a repeat (a duplicate, or an answer given already): nothing new
    #: was sent, and the run ends once the session is quiet
    repeated: bool = False
    #: the messages of the turn this run's message started (empty: it started none)
    _line: set[str] = field(default_factory=set)
    _streams: dict[str, _Stream] = field(default_factory=dict)
    #: the own entries an event has named (applied, refused or ignored)
    _named: set[str] = field(default_factory=set)
    _stream_counts: dict[str, int] = field(default_factory=dict)
    _reply: MessageCreated | None = None
    _announced: set[str] = field(default_factory=set)
    _names: dict[str, str] = field(default_factory=dict)

    # ---- the token stream ----

    def delta(self, delta: Delta) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        stream = self._streams.get(delta.call_id)
        if stream is not None and (delta.reset or delta.attempt != stream.attempt):
            # the reply starts again: what was streamed stays on the front end until the
            # snapshot at the end replaces it
            out.append(TextMessageEndEvent(message_id=stream.message_id))
            del self._streams[delta.call_id]
            self.needs_snapshot = self.needs_snapshot or bool(stream.text)
            stream = None
        if not delta.text:
            return out
        if stream is None:
            stream = _Stream(self._stream_id(delta.call_id), delta.attempt)
            self._streams[delta.call_id] = stream
            out.append(TextMessageStartEvent(message_id=stream.message_id, role="assistant"))
        stream.text += delta.text
        out.append(TextMessageContentEvent(message_id=stream.message_id, delta=delta.text))
        return out

    def _stream_id(self, call_id: str) -> str:
        """`llm-N` for the first text message of a call; a later one (after a restart) gets
        its own id, `llm-N.2`, ..., as AG-UI's message ids are unique."""
        count = self._stream_counts.get(call_id, 0) + 1
        self._stream_counts[call_id] = count
        return call_id if count == 1 else f"{call_id}.{count}"

    # ---- the durable events ----

    @property
    def applied(self) -> bool:
        """Whether the engine has said what became of every input this run sent."""
        return self.own_entries <= self._named

    def event(self, event: Event) -> list[BaseEvent]:
        ref = getattr(event, "input", None)
        if ref is not None and self._own(ref):
            self._named.add(ref.entry)
        out = self._flush_reply() if not isinstance(event, LlmCompleted) else []
        if isinstance(event, MessageCreated):
            out += self._message(event)
        elif isinstance(event, LlmCompleted):
            out += self._reply_of(event)
        elif isinstance(event, ToolStarted):
            self._names[event.call_id] = event.name
        elif isinstance(event, InterruptRaised):
            self.raised[event.interrupt_id] = event
            self.open_interrupts.add(event.interrupt_id)
        elif isinstance(event, InterruptResumed | InterruptCancelled):
            self.open_interrupts.discard(event.interrupt_id)
        elif isinstance(event, TurnCompleted):
            ours = not self._line or event.head in self._line  # another branch's turn is not ours
            if ours and self.applied and not self.open_interrupts and self.ending is None:
                self.ending = Ending("success")
        elif isinstance(event, SessionClosed):
            self.ending = Ending("cancelled")
        elif isinstance(event, InputRefused) and self._own(event.input):
            message = event.message + (f" (at {event.path})" if event.path else "")
            self.ending = Ending("error", event.code, message)
        elif isinstance(event, InputIgnored) and self._own(event.input):
            if event.code in REPEATS:
                self.repeated = True
            else:
                self.ending = Ending("error", event.code, f"the input was ignored: {event.code}")
        return out

    def close(self) -> list[BaseEvent]:
        """What is still open at the end of the run: a reply not yet closed, streams whose
        reply never came (their call is still running, or was voided)."""
        out = self._flush_reply()
        for stream in self._streams.values():
            out.append(TextMessageEndEvent(message_id=stream.message_id))
        self._streams.clear()
        return out

    def _own(self, ref: Any) -> bool:
        return ref is not None and ref.entry in self.own_entries

    def _message(self, event: MessageCreated) -> list[BaseEvent]:
        message = event.message
        role = message.get("role")
        if role == "user" and self._own(event.input):
            self._line = {str(message.get("id"))}
        elif message.get("parent_id") in self._line:
            self._line.add(str(message.get("id")))
        if role == "assistant":
            # a model's reply is followed at once by its llm.completed (one transition): held
            # until then, to know which stream it closes
            self._reply = event
            return []
        if role == "tool":
            return self._tool_result(message)
        if role == "user" and not self._own(event.input):
            return _text_message(str(message.get("id")), "user", str(message.get("content") or ""))
        return []

    def _reply_of(self, completed: LlmCompleted) -> list[BaseEvent]:
        reply, self._reply = self._reply, None
        if reply is None or reply.message.get("id") != completed.message_id:
            return self._flush(reply, None)
        return self._flush(reply, self._streams.pop(completed.call_id, None))

    def _flush_reply(self) -> list[BaseEvent]:
        reply, self._reply = self._reply, None
        return self._flush(reply, None)

    def _flush(self, reply: MessageCreated | None, stream: _Stream | None) -> list[BaseEvent]:
        """A recorded assistant message: the rest of its stream and its end, or the whole text;
        then its tool calls."""
        if reply is None:
            return []
        message = reply.message
        content = str(message.get("content") or "")
        out: list[BaseEvent] = []
        if stream is not None:
            parent = stream.message_id
            if content.startswith(stream.text):
                if rest := content[len(stream.text):]:
                    out.append(TextMessageContentEvent(message_id=parent, delta=rest))
            else:
                self.needs_snapshot = True
            out.append(TextMessageEndEvent(message_id=parent))
        else:
            parent = str(message.get("id"))
            if content:
                out += _text_message(parent, "assistant", content)
        for call in message.get("tool_calls") or []:
            out += self._tool_call(str(call["id"]), str(call["name"]), call.get("arguments"), parent)
        return out

    def _tool_call(self, call_id: str, name: str, arguments: Any, parent: str | None) -> list[BaseEvent]:
        self._announced.add(call_id)
        self._names[call_id] = name
        return [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, parent_message_id=parent),
                ToolCallArgsEvent(tool_call_id=call_id, delta=orjson.dumps(arguments or {}).decode()),
                ToolCallEndEvent(tool_call_id=call_id)]

    def _tool_result(self, message: dict[str, Any]) -> list[BaseEvent]:
        call_id = str(message.get("tool_call_id"))
        out: list[BaseEvent] = []
        if call_id not in self._announced:
            # a call a decision made (not the model), or one announced before this run's
            # cursor: announced here, so that the result has its call
            out += self._tool_call(call_id, self._names.get(call_id, "unknown"), None, None)
        out.append(ToolCallResultEvent(message_id=str(message.get("id")), tool_call_id=call_id,
                                       content=str(message.get("content") or ""), role="tool"))
        return out


def _text_message(message_id: str, role: Literal["assistant", "user"], content: str) -> list[BaseEvent]:
    out: list[BaseEvent] = [TextMessageStartEvent(message_id=message_id, role=role)]
    if content:
        out.append(TextMessageContentEvent(message_id=message_id, delta=content))
    out.append(TextMessageEndEvent(message_id=message_id))
    return out
