"""Reading a whole session from a real Redis (docs/protocol.md, "Export and archive"):
`Client.export`, `AsyncClient.export` and `parley export` give one document, the archive entry
written with the dispatcher's Lua reads as the same, and a missing session is a clear error."""

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.export import NoSuchSession, SessionExport
from parley.runtime.procs import RedisServer
from tests.forkserver import run_parley
from tests.integration.conftest import KEYS, MakeDispatcher
from tests.integration.sessions import APP, core_of, make_session, write_archive_entry
from tests.integration.test_packaging import loaded_after

ROOT = Path(__file__).resolve().parents[2]
NO_SUCH_SESSION = 66


def parley(redis_server: RedisServer, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PARLEY_REDIS_URL": redis_server.url,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return run_parley([*args], env=env,
                          timeout=60, check=False)


def async_export(redis_server: RedisServer, session: str) -> Any:
    async def main() -> Any:
        conn = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return await AsyncClient(conn).export(session)
        finally:
            await conn.aclose()
    return asyncio.run(main())


def test_a_real_session_exports_whole(r: redis.Redis, client: Client,
                                      make_dispatcher: MakeDispatcher) -> None:
    make_session(r, make_dispatcher(app=APP))
    export = client.export("s-exp")
    core = core_of(r, "s-exp")
    assert (export.format, export.session, export.status, export.listing_status) == (
        1, "s-exp", "open", "parked")
    assert (export.created_at, export.head, export.used) == (core.created_at, "msg-6", core.used)
    assert export.metadata == {"team": "a", "user": "u-7"} and export.budget == {"llm_calls": 10}
    assert export.roots == ["msg-1", "msg-4"]
    assert [(m["id"], m["children"]) for m in export.messages] == [
        ("msg-1", ["msg-2"]), ("msg-2", ["msg-3"]), ("msg-3", []), ("msg-4", ["msg-5", "msg-6"]),
        ("msg-5", []), ("msg-6", [])]
    assert [c["id"] for c in export.messages[1]["tool_calls"]] == ["call-1", "call-2"]
    [interrupt] = export.interrupts
    assert (interrupt.interrupt_id, interrupt.anchor, interrupt.request) == (
        "int-1", "msg-2", {"message": "Send?"})
    assert interrupt.expires_at == interrupt.raised_at + 3_600_000
    # every event, in stream order, with its stream id
    stream = [(i.decode(), orjson.loads(f[b"event"])) for i, f in r.xrange(KEYS.events("s-exp"))]
    assert [(e.id, e.event) for e in export.events] == stream
    # the view `parley show` gives holds the same messages
    view = client.show("s-exp")
    assert view is not None
    assert [{k: v for k, v in m.items() if k != "children"} for m in export.messages] == view["messages"]


def test_both_clients_and_the_archive_entry_give_one_document(
        r: redis.Redis, client: Client, redis_server: RedisServer, make_dispatcher: MakeDispatcher) -> None:
    make_session(r, make_dispatcher(app=APP))
    export = client.export("s-exp")
    assert async_export(redis_server, "s-exp") == export
    entry = write_archive_entry(r, "s-exp", closed_at=5)
    [(entry_id, fields)] = r.xrange(KEYS.archive)
    assert entry_id.decode() == entry
    assert SessionExport.from_archive_entry(fields) == export


def test_a_missing_session_is_no_such_session(client: Client, redis_server: RedisServer) -> None:
    with pytest.raises(NoSuchSession, match="no session 'nobody'"):
        client.export("nobody")
    with pytest.raises(NoSuchSession):
        async_export(redis_server, "nobody")


def test_parley_export_prints_the_document(r: redis.Redis, client: Client, redis_server: RedisServer,
                                           make_dispatcher: MakeDispatcher, tmp_path: Path) -> None:
    make_session(r, make_dispatcher(app=APP))
    out = parley(redis_server, "export", "s-exp")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b'{\n  "format": 1,')  # indented
    assert orjson.loads(out.stdout) == client.export("s-exp").model_dump(mode="json")
    target = tmp_path / "s-exp.json"
    out = parley(redis_server, "export", "s-exp", "--output", str(target))
    assert (out.returncode, out.stdout) == (0, b"")
    assert orjson.loads(target.read_bytes()) == client.export("s-exp").model_dump(mode="json")


def test_parley_export_of_a_missing_session_exits_66_and_writes_nothing(
        redis_server: RedisServer, tmp_path: Path) -> None:
    target = tmp_path / "nobody.json"
    out = parley(redis_server, "export", "nobody", "--output", str(target))
    assert out.returncode == NO_SUCH_SESSION
    assert out.stderr.decode().splitlines() == ["parley: no session 'nobody'"]
    assert out.stdout == b"" and not target.exists()


def test_parley_export_to_a_file_it_cannot_write_says_so(
        r: redis.Redis, redis_server: RedisServer, make_dispatcher: MakeDispatcher, tmp_path: Path) -> None:
    make_session(r, make_dispatcher(app=APP))
    out = parley(redis_server, "export", "s-exp", "--output", str(tmp_path / "no-such-dir" / "x.json"))
    assert out.returncode == 1
    assert out.stderr.decode().splitlines() == [
        f"Error: cannot write {tmp_path / 'no-such-dir' / 'x.json'}: No such file or directory"]


def test_exporting_loads_none_of_the_engines_code() -> None:
    """The export's script is the dispatcher's Lua, read as a file: a producer that exports
    still imports neither the dispatcher nor the workers."""
    heavy = ("parley.dispatcher", "parley.workers", "parley.cli.", "httpx", "rq")
    assert loaded_after("from parley.client.export import session_document_script\n"
                        "assert 'return session_document(' in session_document_script()", heavy) == []
