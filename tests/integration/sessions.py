"""A session with some of everything, made by a real dispatcher in the test's Redis, and an
archive entry written by the same Lua function the dispatcher's close uses.

The dispatcher is driven by hand (`tick`), and work outcomes are posted as workers post them,
so the session's records are exactly what the engine stores.
"""

from typing import Any

import orjson
import redis

from parley.dispatcher.consume import Dispatcher
from parley.dispatcher.core import AppInfo, ToolInfo
from parley.dispatcher.scripts import LUA
from parley.schemas.state import Core
from tests.integration.conftest import KEYS, post_outcome, send, tick

#: decides only tool calls: the first runs, the second asks first (an interrupt)
APP = AppInfo(has_decide=True, decide_on=frozenset({"tool.execute"}),
              tools={"lookup": ToolInfo(), "send_email": ToolInfo()})

# The archive entry as the dispatcher writes it when a session closes: the raw document of
# session_document_lib.lua, with the session and its close time (docs/protocol.md, "Export and
# archive"). KEYS: meta, msgs, events, the archive stream; ARGV: session, closed_at.
ARCHIVE_LUA = LUA.read("session_document_lib") + """
return redis.call('XADD', KEYS[4], '*', 'session', ARGV[1], 'closed_at', ARGV[2],
                  'document', session_document(KEYS[1], KEYS[2], KEYS[3], ARGV[1]))
"""


def core_of(r: redis.Redis, session: str) -> Core:
    raw = r.hget(KEYS.meta(session), "core")
    assert raw, f"no session {session}"
    return Core.model_validate_json(raw)  # type: ignore[arg-type]


def running_llm(r: redis.Redis, session: str) -> str:
    [call] = [w.id for w in core_of(r, session).work.values() if w.kind == "llm"]
    return call


def decide(r: redis.Redis, session: str, actions: list[dict[str, Any]] | None = None) -> None:
    """Answer the decide job in flight (with what was proposed unless `actions`)."""
    deciding = core_of(r, session).deciding
    assert deciding is not None
    post_outcome(r, session=session, work=deciding.work, attempt=deciding.attempt, kind="decide",
                 ok=True, value={"actions": deciding.item.proposed if actions is None else actions})


def make_session(r: redis.Redis, d: Dispatcher, session: str = "s-exp") -> None:
    """msg-1 (user) -> msg-2 (assistant, two tool calls) -> msg-3 (the first tool's result);
    the second call raised int-1 (anchored at msg-2, with a deadline); then msg-1 edited: msg-4
    -> msg-5 (its reply), and beside msg-5 a second line, msg-6, whose model call is running."""
    send(r, session, {"type": "session.create", "budget": {"llm_calls": 10},
                      "metadata": {"team": "a", "user": "u-7"}})
    send(r, session, {"type": "message.create", "content": "Email bob the launch date"})
    tick(d)
    post_outcome(r, session=session, work=running_llm(r, session), attempt=1, kind="llm", ok=True,
                 value={"content": "", "tool_calls": [
                     {"id": "m-1", "name": "lookup", "arguments": {"q": "launch"}},
                     {"id": "m-2", "name": "send_email", "arguments": {"to": "bob", "body": "Friday"}}]})
    tick(d)
    decide(r, session)  # call-1 runs
    tick(d)
    decide(r, session, [{"type": "interrupt", "reason": "confirm", "payload": {"message": "Send?"},
                         "timeout_s": 3600, "default": {"approved": False}}])
    post_outcome(r, session=session, work="call-1", attempt=1, kind="tool", ok=True,
                 value={"date": "Friday"})
    tick(d)
    send(r, session, {"type": "message.create", "content": "Email bob, politely", "parent_id": None})
    tick(d)
    post_outcome(r, session=session, work=running_llm(r, session), attempt=1, kind="llm", ok=True,
                 value={"content": "Which Bob?"})
    tick(d)
    edit = next(m for m in messages(r, session) if m["content"] == "Email bob, politely")["id"]
    send(r, session, {"type": "message.create", "content": "Never mind", "parent_id": edit})
    tick(d)
    assert len(messages(r, session)) == 6 and core_of(r, session).interrupts


def messages(r: redis.Redis, session: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for v in r.hvals(KEYS.messages(session))]


def write_archive_entry(r: redis.Redis, session: str, closed_at: int | None = None) -> str:
    """XADD the session's archive entry with the dispatcher's Lua (its close time, or `closed_at`)."""
    at = closed_at if closed_at is not None else core_of(r, session).closed_at or 1_764_558_000_000
    entry = r.eval(ARCHIVE_LUA, 4, KEYS.meta(session), KEYS.messages(session), KEYS.events(session),
                   KEYS.archive, session, at)
    return entry.decode()  # type: ignore[union-attr]


def archive_entry_of(r: redis.Redis, session: str) -> str:
    """The session's entry in the archive stream: the one a dispatcher wrote when it closed the
    session, else one written here as the dispatcher would (before closing wrote any)."""
    written = [i.decode() for i, f in r.xrange(KEYS.archive) if f[b"session"] == session.encode()]
    assert len(written) <= 1, written
    return written[0] if written else write_archive_entry(r, session)
