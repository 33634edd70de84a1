"""The AG-UI endpoint's failure paths, on a real redis-server and no engine: what a run gets
when nothing can answer it, when Redis is gone, when its body is too large or its token wrong.
Starlette's TestClient drives the application in-process (the e2e, tests/e2e/test_agui.py,
runs it as a process under its login)."""

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from parley.agui.endpoint import MAX_BODY_BYTES, AguiConfig, create_app
from parley.client import AsyncClient
from parley.client.shards import connect_async
from parley.runtime.procs import RedisServer, free_port


def app_client(redis_server: RedisServer, **config: Any) -> TestClient:
    client = AsyncClient(connect_async(redis_server.url))
    # addressed as a browser on this machine would (an endpoint without a token checks the Host)
    return TestClient(create_app(client, AguiConfig(**config)), base_url="http://127.0.0.1:8090")


@pytest.fixture
def web(redis_server: RedisServer) -> Iterator[TestClient]:
    with app_client(redis_server, settle_s=0.05, run_timeout_s=1.0) as web:
        yield web


def events(reply: Any) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in reply.text.splitlines() if line.startswith("data: ")]


def body(thread: str = "t-1", **more: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": "r-1", "messages": [], **more}


def test_a_run_that_only_follows_an_idle_session_finishes_with_its_cursor(web: TestClient) -> None:
    got = events(web.post("/", json=body()))
    assert [e["type"] for e in got] == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_FINISHED"]
    assert got[1]["snapshot"] == {"parley": {"session": "t-1", "cursor": "0-0"}}
    assert got[-1]["outcome"] == {"type": "success"}


def test_a_message_nothing_applies_ends_the_run_with_run_timeout_and_is_kept(web: TestClient,
                                                                                r: redis.Redis) -> None:
    """No dispatcher runs: the input waits in its stream, and the run says so rather than hang."""
    got = events(web.post("/", json=body(messages=[{"id": "u-1", "role": "user", "content": "hi"}])))
    assert [e["type"] for e in got][-2:] == ["STATE_SNAPSHOT", "RUN_ERROR"]
    assert got[-1]["code"] == "run_timeout" and "the session goes on" in got[-1]["message"]
    [(_id, fields)] = r.xrange("parley:inputs")
    assert json.loads(fields[b"input"]) == {"type": "message.create", "content": "hi", "message_id": "u-1"}


def test_a_resume_of_an_interrupt_that_is_not_open_sends_nothing(web: TestClient, r: redis.Redis) -> None:
    resume = [{"interruptId": "int-9", "status": "resolved", "payload": {}}]
    got = events(web.post("/", json=body(resume=resume)))
    assert [e["type"] for e in got] == ["RUN_STARTED", "RUN_ERROR"] and got[-1]["code"] == "unknown_interrupt"
    assert r.xlen("parley:inputs") == 0


def test_redis_gone_is_a_run_error_and_an_unhealthy_endpoint(redis_server: RedisServer) -> None:
    with app_client(redis_server) as web:
        redis_server.stop(kill=True)
        got = events(web.post("/", json=body()))
        assert [e["type"] for e in got] == ["RUN_STARTED", "RUN_ERROR"] and got[-1]["code"] == "unavailable"
        assert web.get("/healthz").status_code == 503


def test_a_body_too_large_or_not_a_run_input_is_refused_with_why(web: TestClient) -> None:
    large = web.post("/", content=b"x" * (MAX_BODY_BYTES + 1), headers={"Content-Type": "application/json"})
    assert large.status_code == 413 and large.json()["error"] == "too_large"
    wrong = web.post("/", json={"threadId": "t-1"})
    assert wrong.status_code == 422 and "runId" in wrong.json()["message"]


def test_a_run_posted_as_a_web_page_may_post_anywhere_is_refused(web: TestClient, r: redis.Redis) -> None:
    """A page in the operator's browser may post text/plain to 127.0.0.1 without asking (no CORS
    preflight): such a run, say an approval signed as the endpoint's principal, is refused
    before anything is read or sent. application/json makes the browser ask first."""
    resume = {**body(resume=[{"interruptId": "int-1", "status": "resolved", "payload": {"approved": True}}])}
    for media_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {"Content-Type": media_type} if media_type else {}
        got = web.post("/", content=json.dumps(resume).encode(), headers=headers)
        assert got.status_code == 415 and got.json()["error"] == "unsupported_media_type", media_type
    assert r.xlen("parley:inputs") == 0


def test_without_a_token_a_run_must_be_addressed_to_loopback(web: TestClient) -> None:
    """DNS rebinding: a name the page controls, pointed at 127.0.0.1, arrives as the Host."""
    got = web.post("/", json=body(), headers={"Host": "attacker.example:8090"})
    assert got.status_code == 403 and got.json()["error"] == "forbidden_host"
    for host in ("127.0.0.1:8090", "localhost:8090", "[::1]:8090", "localhost"):
        assert web.post("/", json=body(), headers={"Host": host}).status_code == 200, host


def test_with_a_token_any_host_may_post(redis_server: RedisServer) -> None:
    with app_client(redis_server, token="s3cret") as web:
        got = web.post("/", json=body(), headers={"Host": "parley.example.com",
                                                  "Authorization": "Bearer s3cret"})
        assert got.status_code == 200


def test_a_run_without_the_token_is_refused_before_anything_is_read(redis_server: RedisServer) -> None:
    with app_client(redis_server, token="s3cret") as web:
        assert web.post("/", json=body()).status_code == 401
        assert web.post("/", json=body(), headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = web.post("/", json=body(), headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and events(ok)[-1]["type"] == "RUN_FINISHED"


def parley_agui(*args: str, url: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "parley", "--redis-url", url, "agui", *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_serving_beyond_loopback_without_a_token_is_refused_at_start(redis_server: RedisServer) -> None:
    done = parley_agui("--host", "0.0.0.0", "--port", str(free_port()), url=redis_server.url)
    assert done.returncode == 2 and "give a --token" in done.stderr


def test_a_redis_it_cannot_reach_is_one_line_and_exit_69() -> None:
    done = parley_agui("--port", str(free_port()), url=f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 69 and "Traceback" not in done.stderr, done.stderr
