"""An approver's path to a gated tool (docs/protocol.md, "Approvals"): the engine's question in
`parley inbox`, refused to a person who is not an approver, answered by one, and the tool run
once; on a real Redis with a real dispatcher and worker. What ran is counted in the file the
app's `pay` appends to (tests/apps/approvals_app.py), outside Redis."""

import json
import re
from pathlib import Path

import orjson
import pytest
import redis
from starlette.testclient import TestClient

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.approvals import call_digest
from parley.web.app import create_app
from parley.web.config import InboxConfig
from parley.web.users import hash_password
from tests.apps.approvals_app import PAID_LOG
from tests.conftest import Procs, eventually, send, wait_for

pytestmark = pytest.mark.e2e

APP = "tests.apps.approvals_app"
PAY = {"to": "acme", "amount": 120}


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html[:500]
    return match.group(1)


def sign_in(web: TestClient, who: str) -> str:
    token = csrf_of(web.get("/signin").text)
    reply = web.post("/signin", data={"principal": who, "secret": f"{who}-password", "csrf": token,
                                      "next": "/"})
    assert reply.status_code == 303, reply.text[:300]
    return csrf_of(web.get("/").text)


def test_only_an_approver_approves_in_the_inbox_and_the_tool_runs_once(
        procs: Procs, r: redis.Redis, client: Client, redis_server: RedisServer, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": "alice-signing-key-0123", "dave": "dave-signing-key-0123"}))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({who: {"password": hash_password(f"{who}-password")}
                                 for who in ("alice", "dave")}))
    paid = tmp_path / "paid.jsonl"
    paid.touch()
    procs.dispatcher(APP, "--keys-file", str(keys))
    procs.start("worker", APP, env={PAID_LOG: str(paid)})
    send(r, "inb-1", {"type": "message.create", "content": f"call pay {orjson.dumps(PAY).decode()}"})
    raised = wait_for(client, "inb-1", lambda e: e["type"] == "interrupt.raised")[-1]
    assert raised["reason"] == "approval"
    eventually(lambda: client.open_interrupt("inb-1", raised["interrupt_id"]) is not None)
    config = InboxConfig(secure_cookies=False,  # TestClient speaks plain HTTP
                         redis_urls=(procs.url,), users_file=str(users), keys_file=str(keys),
                         resume_timeout_s=15, session_secret="a-secret-of-this-test")
    form = {"session": "inb-1", "interrupt_id": raised["interrupt_id"], "answer.approved": "on"}
    with TestClient(create_app(config), follow_redirects=False) as web:
        # dave may read the question, not answer it
        token = sign_in(web, "dave")
        reply = web.post("/interrupt/answer", data={**form, "csrf": token})
        assert reply.status_code == 403
        web.post("/signout", data={"csrf": token})
        # alice sees what she approves: the tool, its arguments and their digest
        token = sign_in(web, "alice")
        page = web.get(f"/interrupt?session=inb-1&id={raised['interrupt_id']}").text
        assert "pay" in page and "acme" in page and call_digest("pay", PAY) in page
        reply = web.post("/interrupt/answer", data={**form, "csrf": token})
        assert 'data-status="delivered"' in reply.text, reply.text[:2000]
    seen = wait_for(client, "inb-1", lambda e: e["type"] == "turn.completed")
    [started] = [e for e in seen if e["type"] == "tool.started"]
    assert started["approval"]["principal"] == "alice"
    assert [orjson.loads(line) for line in paid.read_bytes().splitlines()] == [PAY]
