"""The inbox over two shards: the list merges both shards' open interrupts (either order), and
an answer goes through the submit function to its session's shard and is delivered."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from parley.web.app import create_app
from parley.web.config import InboxConfig
from parley.web.users import hash_password
from tests.conftest import wait_for
from tests.e2e.test_shards import Deployment, sessions_on_every_shard, wait_ready

pytestmark = pytest.mark.e2e


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path, 2)
    yield d
    codes = d.stop()
    assert all(code == 0 for code in codes), f"exit codes {codes}\n{d.logs()}"


def test_the_list_merges_every_shard_and_answers_reach_each_shard(deploy: Deployment,
                                                                  tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": "alice-signing-key-0123456789"}))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": {"password": hash_password("alice-password")}}))
    deploy.start("dispatcher", "tests.apps.scenarios", "--keys-file", str(keys),
                 "--register-producer", "inbox")
    deploy.start("worker", "tests.apps.scenarios")
    wait_ready(deploy)
    sessions = sessions_on_every_shard(deploy, 2, "web-shard-")
    assert len(sessions) == 4
    for s in sessions:
        deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
    for s in sessions:
        wait_for(deploy.client(s), s, lambda e: e["type"] == "interrupt.raised")
    config = InboxConfig(secure_cookies=False,  # TestClient speaks plain HTTP
                         redis_urls=tuple(deploy.urls), users_file=str(users), keys_file=str(keys),
                         producer="inbox", page_size=3, resume_timeout_s=20)
    with TestClient(create_app(config), follow_redirects=False) as web:
        token = re.findall(r'name="csrf" value="([^"]+)"', web.get("/signin").text)[0]
        assert web.post("/signin", data={"principal": "alice", "secret": "alice-password",
                                         "csrf": token}).status_code == 303
        for order in ("oldest", "newest"):
            listed: list[str] = []
            url: str | None = f"/?order={order}&session=web-shard-"
            while url:
                html = web.get(url).text
                listed += re.findall(r'<tr class="interrupt" data-session="([^"]+)"', html)
                more = re.search(r'id="next-page" href="([^"]+)"', html)
                url = more.group(1).replace("&amp;", "&") if more else None
            assert sorted(listed) == sorted(sessions), (order, listed)
            assert len(set(listed)) == len(listed)
        token = re.findall(r'name="csrf" value="([^"]+)"', web.get("/").text)[0]
        for s in (sessions[0], sessions[-1]):  # one on each shard
            reply = web.post("/interrupt/answer", data={"session": s, "interrupt_id": "int-1",
                                                        "decision": "approve", "csrf": token})
            assert 'data-status="delivered"' in reply.text, (s, reply.text[:1500], deploy.logs())
            resumed = wait_for(deploy.client(s), s, lambda e: e["type"] == "interrupt.resumed")[-1]
            assert resumed["principal"] == "alice"
        left = re.findall(r'data-session="([^"]+)"', web.get("/?session=web-shard-&order=newest").text)
        assert sorted(left) == sorted(sessions[1:-1])


def test_a_shard_that_does_not_answer_leaves_the_others_listed_and_says_so(tmp_path: Path) -> None:
    deploy = Deployment(tmp_path, 3)
    try:
        users = tmp_path / "users.json"
        users.write_text(json.dumps({"alice": {"password": hash_password("alice-password")}}))
        deploy.start("dispatcher", "tests.apps.scenarios")
        deploy.start("worker", "tests.apps.scenarios")
        wait_ready(deploy)
        sessions = sessions_on_every_shard(deploy, 1, "down-shard-")
        for s in sessions:
            deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
        for s in sessions:
            wait_for(deploy.client(s), s, lambda e: e["type"] == "interrupt.raised")
        placement = deploy.shards().refresh()
        assert placement is not None
        on_2 = [s for s in sessions if placement.shard_of_session(s) == 2]
        deploy.servers[2].stop(kill=True)
        config = InboxConfig(secure_cookies=False, redis_urls=tuple(deploy.urls), users_file=str(users),
                             page_size=10)
        with TestClient(create_app(config), follow_redirects=False) as web:
            token = re.findall(r'name="csrf" value="([^"]+)"', web.get("/signin").text)[0]
            assert web.post("/signin", data={"principal": "alice", "secret": "alice-password",
                                             "csrf": token}).status_code == 303
            html = web.get("/?session=down-shard-").text
            listed = re.findall(r'<tr class="interrupt" data-session="([^"]+)"', html)
            assert sorted(listed) == sorted(s for s in sessions if s not in on_2), html[:2000]
            assert 'id="list-partial"' in html and "Shard 2 did not answer" in html
    finally:
        deploy.stop()
