"""What an AG-UI run input asks of Parley (pure).

AG-UI sends the whole conversation with every run; Parley keeps it. So a run sends only what
is new: the resumes of its `resume` entries, or else its last message when that is a user's.
A run that has neither only follows the session (what happened since the last run, if the
front end kept the state this endpoint sent).
"""

import re
from dataclasses import dataclass
from typing import Any

from ag_ui.core import ResumeEntry, RunAgentInput, TextPart, UserMessage

from parley.schemas.ids import NAME_RE, is_child_session, is_session_id

#: where a run's state keeps Parley's part: `state["parley"] = {"session", "cursor"}`
STATE_KEY = "parley"
_EVENT_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")


class RunProblem(ValueError):
    """A run input Parley cannot act on: the run ends with RUN_ERROR `code` and this message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class NewMessage:
    """The user's message to append: `message_id` is AG-UI's own id when Parley can keep it."""

    content: str
    message_id: str | None
    #: the idempotency key: a run sent twice (a retried POST) appends the message once
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class RunRequest:
    session: str
    #: the events stream id this run follows from (None: from now on)
    cursor: str | None
    message: NewMessage | None
    resumes: tuple[ResumeEntry, ...]

    @property
    def follows_only(self) -> bool:
        return self.message is None and not self.resumes


def session_of(thread_id: str) -> str:
    """The Parley session of an AG-UI thread: the thread id itself, when it is a valid id."""
    if not is_session_id(thread_id) or is_child_session(thread_id):
        raise RunProblem("invalid_thread", f"the thread id {thread_id!r} cannot be a Parley session id: "
                         "1-128 characters of A-Z a-z 0-9 . _ : / - (and not ending in :sub-N)")
    return thread_id


def cursor_of(state: Any, session: str) -> str | None:
    """The events id the previous run of this thread stopped at, from the state it sent back;
    None when the front end kept none (or it is another session's, or not an id)."""
    if not isinstance(state, dict):
        return None
    ours = state.get(STATE_KEY)
    if not isinstance(ours, dict) or ours.get("session") != session:
        return None
    cursor = ours.get("cursor")
    return cursor if isinstance(cursor, str) and _EVENT_ID_RE.fullmatch(cursor) else None


def state_with(state: Any, session: str, cursor: str) -> dict[str, Any]:
    """The run's state to send back: the front end's own keys, and Parley's cursor."""
    kept = dict(state) if isinstance(state, dict) else {}
    kept[STATE_KEY] = {"session": session, "cursor": cursor}
    return kept


def text_of(message: UserMessage) -> str:
    """A user message's text: plain, or its text parts joined. Other parts (images, files)
    cannot be sent to a Parley session, which holds text."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if not isinstance(part, TextPart):
            raise RunProblem("unsupported_content", f"message {message.id!r} holds a {part.type!r} part; "
                             "a Parley session takes text only")
        texts.append(part.text)
    return "".join(texts)


def request_of(run: RunAgentInput) -> RunRequest:
    session = session_of(run.thread_id)
    cursor = cursor_of(run.state, session)
    if run.resume:
        seen: set[str] = set()
        for entry in run.resume:
            if entry.interrupt_id in seen:
                raise RunProblem("invalid_resume", f"interrupt {entry.interrupt_id!r} is answered twice")
            seen.add(entry.interrupt_id)
        return RunRequest(session, cursor, None, tuple(run.resume))
    last = run.messages[-1] if run.messages else None
    if not isinstance(last, UserMessage):
        return RunRequest(session, cursor, None, ())
    message_id = last.id if NAME_RE.fullmatch(last.id) else None
    # the run's id too: a run posted twice appends its message once, and a later run that sends
    # the message again (after a refusal, or to ask again) is sent, not taken for a duplicate
    new = NewMessage(text_of(last), message_id, idempotency_key=f"agui:{run.run_id}:{last.id}"[:256])
    return RunRequest(session, cursor, new, ())
