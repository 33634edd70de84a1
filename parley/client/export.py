"""A whole session as one JSON document: what `parley export` prints, `Client.export` returns,
and an archive consumer stores (docs/protocol.md, "Export and archive").

Both an export and an entry of the archive stream carry the session's *raw* document, built in
Redis by one Lua function (dispatcher/lua/session_document_lib.lua) from the stored records as
they are; everything here is the pure shaping of that raw document into `SessionExport`, so an
export and an archived copy of the same session state are the same document by construction.

The message tree is flat: messages in creation order, each naming its `children`, and the
`roots`. A nested tree would be as deep as the longest line of the conversation, and JSON
libraries (orjson, pydantic, Python's json) refuse documents nested a few hundred levels deep.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from parley.client.producer import Call, Steps
from parley.runtime.lua import LuaFolder
from parley.schemas.codes import SessionStatus
from parley.schemas.keys import Keys
from parley.schemas.listing import ListingStatus, listing_status
from parley.schemas.state import Core, Interrupt
from parley.schemas.view import creation_order, public_message

#: the version of the export document's layout; a change that drops or redefines a field bumps it
FORMAT = 1

#: the fields of an archive stream entry (written by the dispatcher when a session closes)
ARCHIVE_FIELDS = ("session", "closed_at", "document")


class ExportError(ValueError):
    """A raw document or archive entry that cannot be read as a session's export: says why."""


class NoSuchSession(LookupError):
    """The session has no record in Redis: never created, or expired."""

    def __init__(self, session: str):
        super().__init__(f"no session {session!r}")
        self.session = session


class ParentCall(BaseModel):
    """For a sub-agent's child: the parent session and the call the child answers."""

    session: str
    call_id: str


class PendingCall(BaseModel):
    """An open call, as `parley show` lists it."""

    call_id: str
    kind: str
    name: str | None


class OpenInterrupt(BaseModel):
    """An open interrupt, by the names of the listing of open interrupts (`parley interrupts`)."""

    interrupt_id: str
    reason: str
    #: the interrupt's payload: what it asks
    request: Any
    #: the message it parks from; null: global
    anchor: str | None
    raised_at: int
    #: its deadline (Unix ms); null: none
    expires_at: int | None
    #: the payload a deadline resumes it with
    default: Any
    resumable_by: list[str] | None
    response_schema: dict[str, Any] | None


class ExportEvent(BaseModel):
    """One entry of the session's event stream: its stream id and the event."""

    id: str
    event: Any


class SessionExport(BaseModel):
    """A whole session (docs/protocol.md, "Export and archive")."""

    format: int = FORMAT
    session: str
    #: `open` or `closed`
    status: SessionStatus
    #: the list of sessions' status: `active`, `parked` (an interrupt is open) or `closed`
    listing_status: ListingStatus
    created_at: int
    closed_at: int | None
    metadata: dict[str, Any] | None
    budget: dict[str, Any] | None
    used: dict[str, int]
    #: set for a sub-agent's child
    parent: ParentCall | None
    #: the sub-agent sessions this one spawned
    children: list[str]
    #: the active head
    head: str | None
    #: ids of the messages without a parent (the first message and its edits), in creation order
    roots: list[str]
    #: every message in creation order, each as in `parley show` plus `children`: the ids of its
    #: replies and edits below it, in creation order
    messages: list[dict[str, Any]]
    interrupts: list[OpenInterrupt]
    pending: list[PendingCall]
    #: the session's event stream as kept (capped, oldest first)
    events: list[ExportEvent]

    @classmethod
    def from_document(cls, raw: bytes | str) -> "SessionExport":
        """The export of a raw document (the JSON session_document_lib.lua builds);
        `NoSuchSession` when it has no core, `ExportError` when it cannot be read."""
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ExportError(f"the session document is not JSON: {exc}") from None
        return shape(document)

    @classmethod
    def from_archive_entry(cls, fields: Mapping[Any, Any]) -> "SessionExport":
        """The export an entry of the archive stream holds (fields as redis-py returns them)."""
        return archive_entry(fields).export

    def to_json(self, indent: bool = False) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_INDENT_2 if indent else 0)


def shape(document: Any) -> SessionExport:
    """The export of a parsed raw document `{session, core, messages, events}`."""
    if not isinstance(document, dict):
        raise ExportError("the session document is not a JSON object")
    missing = [f for f in ("session", "core", "messages", "events") if f not in document]
    if missing:
        raise ExportError(f"the session document lacks {', '.join(missing)}")
    if document["core"] is None:
        raise NoSuchSession(str(document["session"]))
    try:
        core = Core.model_validate(document["core"])
    except ValidationError as exc:
        raise ExportError(f"the session's record is not valid: {_first_error(exc)}") from None
    messages = _messages(document["messages"])
    roots, tree = message_tree(messages)
    try:
        events = [ExportEvent.model_validate(e) for e in document["events"]]
    except (TypeError, ValidationError) as exc:
        raise ExportError(f"the session's events are not valid: {exc}") from None
    return SessionExport(
        session=core.session, status=core.status, listing_status=listing_status(core),
        created_at=core.created_at, closed_at=core.closed_at, metadata=core.metadata,
        budget=core.budget, used=core.used, parent=_parent(core.parent), children=core.children,
        head=core.head, roots=roots, messages=tree,
        interrupts=[open_interrupt(i) for i in core.interrupts.values()],
        pending=[PendingCall(call_id=w.id, kind=w.kind, name=w.name) for w in core.work.values()],
        events=events)


def message_tree(messages: dict[str, dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(roots, messages): every message in creation order, public, with the ids of its children.
    A message whose parent is not stored counts as a root, so none is left out."""
    ordered = creation_order(messages)
    children: dict[str, list[str]] = {m["id"]: [] for m in ordered}
    roots: list[str] = []
    for m in ordered:
        parent = m.get("parent_id")
        (children[parent] if parent is not None and parent in children else roots).append(m["id"])
    return roots, [public_message(m) | {"children": children[m["id"]]} for m in ordered]


def open_interrupt(i: Interrupt) -> OpenInterrupt:
    return OpenInterrupt(interrupt_id=i.id, reason=i.reason, request=i.payload, anchor=i.anchor,
                         raised_at=i.raised_at, expires_at=i.deadline, default=i.default,
                         resumable_by=i.resumable_by, response_schema=i.response_schema)


def _parent(link: dict[str, Any] | None) -> ParentCall | None:
    return ParentCall(session=link["session"], call_id=link["call_id"]) if link else None


def _messages(raw: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str)
                                            for m in raw):
        raise ExportError("the session's messages are not a list of messages with ids")
    return {m["id"]: m for m in raw}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


# ---- the archive stream -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """One entry of the archive stream: a closed session's document, as of its close."""

    session: str
    #: when the session closed (Unix ms)
    closed_at: int
    export: SessionExport


def archive_entry(fields: Mapping[Any, Any]) -> ArchiveEntry:
    """An archive stream entry's fields read, or `ExportError` saying what is wrong with them."""
    named = {_text(k): v for k, v in fields.items()}
    missing = [f for f in ARCHIVE_FIELDS if f not in named]
    if missing:
        raise ExportError(f"the archive entry lacks {', '.join(missing)}")
    session, closed_at = _text(named["session"]), _text(named["closed_at"])
    if not closed_at.isascii() or not closed_at.isdigit():
        raise ExportError(f"the archive entry's closed_at is not a time in Unix ms: {closed_at!r}")
    try:
        export = SessionExport.from_document(named["document"])
    except NoSuchSession:
        raise ExportError(f"the archive entry of {session!r} has no session record") from None
    if export.session != session:
        raise ExportError(f"the archive entry names {session!r} but holds {export.session!r}")
    return ArchiveEntry(session, int(closed_at), export)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---- reading one from Redis ---------------------------------------------------------------------

@cache
def session_document_script() -> str:
    """The read-only script: the shared builder (the text the dispatcher's archive writer uses
    too) and the call of it. Read as files, found without importing `parley.dispatcher`: a
    producer runs none of the engine's code."""
    return LuaFolder.of_package("parley.dispatcher").source("session_document")


def export_steps(keys: Keys, session: str) -> Steps:
    """One round trip: the raw document (EVAL_RO, atomic: one consistent state), shaped."""
    (raw,) = yield [Call("eval_ro", (session_document_script(), 3, keys.meta(session),
                                     keys.messages(session), keys.events(session), session))]
    return SessionExport.from_document(raw)
