"""The export document (parley/client/export.py): a session's raw document, as the Lua builder makes it
from the stored records, shaped without Redis. Sessions come from the pure core (the harness),
so messages, tool calls and interrupts are the ones the engine really stores."""

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from parley.client.export import (
    ARCHIVE_FIELDS,
    FORMAT,
    ExportError,
    ExportEvent,
    NoSuchSession,
    OpenInterrupt,
    ParentCall,
    PendingCall,
    SessionExport,
    archive_entry,
    message_tree,
)
from parley.schemas.state import Core

from .harness import Sim


def raw_document(session: str, core: Core | None, messages: list[dict[str, Any]],
                 events: list[tuple[str, dict[str, Any]]]) -> bytes:
    """What session_document_lib.lua returns: the stored JSON of each record spliced, not
    re-encoded (core as the commit stores it, messages in the hash's order)."""
    items = [b'{"id":"' + i.encode() + b'","event":' + orjson.dumps(e) + b"}" for i, e in events]
    return b"".join([b'{"session":', orjson.dumps(session), b',"core":',
                     core.to_json().encode() if core else b"null",
                     b',"messages":[', b",".join(orjson.dumps(m) for m in messages),
                     b'],"events":[', b",".join(items), b"]}"])


def document_of(s: Sim, hash_order: bool = True) -> bytes:
    """The raw document of a simulated session; its messages in an order unlike creation's,
    as a hash gives them back."""
    messages = list(s.state.messages.values())
    if hash_order:
        messages = messages[1::2] + messages[0::2]
    return raw_document(s.session, s.state.core, messages,
                        [(f"{1000 + n}-0", e) for n, e in enumerate(s.events)])


def branched_session() -> Sim:
    """A turn whose reply calls two tools: the first runs, the second raises an interrupt with a
    deadline; then the first message is edited (a second root) and, under the edit, a second
    line starts beside the first reply (a branch)."""
    s = Sim(session="s-x")
    s.open_session(budget={"llm_calls": 10}, metadata={"team": "a"})
    _turn, calls, _iid = s.pause_on_tool("search", "send_email", interrupt_on=1,
                                         payload={"message": "Send?"}, timeout_s=60,
                                         default={"approved": False}, resumable_by=["alice"])
    s.finish_tool(calls[0], result={"hits": 2})
    s.settle_decides()
    s.start("edited", parent=None)   # msg-4: the edit of msg-1
    s.finish_llm(content="edited answer")  # msg-5
    s.settle_decides()
    s.start("again", parent="msg-4")  # msg-6: a sibling of msg-5
    return s


def test_messages_are_a_tree_in_creation_order_with_public_fields_and_tool_calls() -> None:
    s = branched_session()
    export = SessionExport.from_document(document_of(s))
    assert export.roots == ["msg-1", "msg-4"]
    assert [(m["id"], m["children"]) for m in export.messages] == [
        ("msg-1", ["msg-2"]), ("msg-2", ["msg-3"]), ("msg-3", []),
        ("msg-4", ["msg-5", "msg-6"]), ("msg-5", []), ("msg-6", [])]
    by_id = {m["id"]: m for m in export.messages}
    assert by_id["msg-2"] == {
        "id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "",
        "tool_calls": [{"id": "call-1", "name": "search", "arguments": {"n": 0}},
                       {"id": "call-2", "name": "send_email", "arguments": {"n": 1}}],
        "children": ["msg-3"]}
    assert by_id["msg-3"] == {"id": "msg-3", "parent_id": "msg-2", "role": "tool",
                              "content": '{"hits":2}', "tool_call_id": "call-1", "children": []}
    # the engine's bookkeeping (turn, order) stays inside
    assert not any({"turn", "order"} & set(m) for m in export.messages)


def test_the_session_fields_interrupts_and_pending_work() -> None:
    s = branched_session()
    export = SessionExport.from_document(document_of(s))
    assert export.format == FORMAT == 1
    assert (export.session, export.status, export.listing_status) == ("s-x", "open", "parked")
    assert (export.created_at, export.closed_at) == (s.core.created_at, None)
    assert (export.metadata, export.budget) == ({"team": "a"}, {"llm_calls": 10})
    assert export.used == s.core.used and export.used["llm_calls"] == 3
    assert (export.head, export.parent, export.children) == ("msg-6", None, [])
    [interrupt] = export.interrupts
    raised_at = s.core.interrupts["int-1"].raised_at
    assert interrupt.model_dump() == {
        "interrupt_id": "int-1", "reason": "confirm", "request": {"message": "Send?"},
        "anchor": "msg-2", "raised_at": raised_at, "expires_at": raised_at + 60_000,
        "default": {"approved": False}, "resumable_by": ["alice"], "response_schema": None}
    assert [p.model_dump() for p in export.pending] == [
        {"call_id": "call-2", "kind": "tool", "name": "send_email"},
        {"call_id": "llm-3", "kind": "llm", "name": None}]


def test_events_in_stream_order_with_their_ids() -> None:
    s = branched_session()
    export = SessionExport.from_document(document_of(s))
    assert [e.id for e in export.events] == [f"{1000 + n}-0" for n in range(len(s.events))]
    assert [e.event for e in export.events] == s.events
    assert export.events[0].event["type"] == "session.created"


def test_a_closed_child_session() -> None:
    core = Core(session="p:sub-1", created_at=5, status="closed", closed_at=9, head=None,
                parent={"session": "p", "call_id": "call-3", "attempt": 1, "app": "m",
                        "reply_to": "parley:results"})
    export = SessionExport.from_document(raw_document("p:sub-1", core, [], []))
    assert (export.status, export.listing_status, export.closed_at) == ("closed", "closed", 9)
    assert export.parent is not None and export.parent.model_dump() == {"session": "p", "call_id": "call-3"}
    assert (export.roots, export.messages, export.events, export.interrupts) == ([], [], [], [])


def test_a_missing_core_is_no_such_session() -> None:
    with pytest.raises(NoSuchSession, match="no session 's-gone'") as err:
        SessionExport.from_document(raw_document("s-gone", None, [], []))
    assert err.value.session == "s-gone"


def test_messages_stored_before_they_had_an_order_and_an_orphan_are_all_kept() -> None:
    messages = {"msg-2": {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "b"},
                "msg-1": {"id": "msg-1", "parent_id": None, "role": "user", "content": "a"},
                "x": {"id": "x", "parent_id": "gone", "role": "user", "content": "c"}}
    roots, tree = message_tree(messages)
    assert roots == ["msg-1", "x"]
    assert [(m["id"], m["children"]) for m in tree] == [("msg-1", ["msg-2"]), ("msg-2", []), ("x", [])]


def test_the_json_is_flat_however_long_the_line() -> None:
    """A nested tree would be as deep as the conversation is long, past what JSON libraries
    accept (orjson stops at 255 levels): the export's depth does not grow with the line."""
    messages = [{"id": f"m{n}", "parent_id": f"m{n - 1}" if n else None, "role": "user",
                 "content": "x", "order": n} for n in range(600)]
    core = Core(session="long", created_at=1, head="m599")
    export = SessionExport.from_document(raw_document("long", core, messages, []))
    assert orjson.loads(export.to_json(indent=True))["messages"][599]["parent_id"] == "m598"


@pytest.mark.parametrize(("raw", "error"), [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"session": "s", "core": null}', "lacks messages, events"),
    (b'{"session": "s", "core": {"session": "s"}, "messages": [], "events": []}',
     "record is not valid: created_at: Field required"),
    (b'{"session": "s", "core": {"session": "s", "created_at": 1}, "messages": [{"no": "id"}], '
     b'"events": []}', "messages are not a list of messages"),
    (b'{"session": "s", "core": {"session": "s", "created_at": 1}, "messages": [], "events": [3]}',
     "events are not valid"),
])
def test_a_document_that_cannot_be_read_says_why(raw: bytes, error: str) -> None:
    with pytest.raises(ExportError, match=error):
        SessionExport.from_document(raw)


def test_an_archive_entry_reads_as_the_same_export() -> None:
    s = branched_session()
    document = document_of(s)
    fields = {b"session": b"s-x", b"closed_at": b"1764558000000", b"document": document}
    entry = archive_entry(fields)
    assert (entry.session, entry.closed_at) == ("s-x", 1764558000000)
    assert entry.export == SessionExport.from_document(document)
    assert SessionExport.from_archive_entry(fields) == entry.export
    # decoded replies (decode_responses=True) read the same
    assert archive_entry({k.decode(): v.decode() for k, v in fields.items()}).export == entry.export


@pytest.mark.parametrize(("fields", "error"), [
    ({"session": "s-x", "document": "{}"}, "lacks closed_at"),
    ({"session": "s-x", "closed_at": "soon", "document": "{}"}, "closed_at is not a time"),
    ({"session": "s-y", "closed_at": "5", "document": "SAME"}, "names 's-y' but holds 's-x'"),
    ({"session": "s-x", "closed_at": "5", "document": "{"}, "not JSON"),
    ({"session": "s-x", "closed_at": "5",
      "document": '{"session": "s-x", "core": null, "messages": [], "events": []}'},
     "has no session record"),
])
def test_a_bad_archive_entry_says_why(fields: dict[str, str], error: str) -> None:
    if fields.get("document") == "SAME":
        fields["document"] = document_of(branched_session()).decode()
    with pytest.raises(ExportError, match=error):
        archive_entry(fields)


def test_docs_name_every_field_of_the_document_and_of_an_archive_entry() -> None:
    """docs/protocol.md, "Export and archive", is the users' reference for the document."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = text.split("\n## Export and archive\n", 1)[1].split("\n## ", 1)[0]
    quoted = {w for span in re.findall(r"`([^`\n]+)`", section)
              for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    fields = {name for model in (SessionExport, OpenInterrupt, ParentCall, PendingCall, ExportEvent)
              for name in model.model_fields}
    assert fields | set(ARCHIVE_FIELDS) <= quoted, sorted(fields | set(ARCHIVE_FIELDS) - quoted)
    assert "66" in section and "parley export" in section and "--output FILE" in section
