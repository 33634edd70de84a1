"""`parley inbox` over HTTP (no browser): the sign-in gate, CSRF, answers and their outcomes,
health and metrics, on a real Redis with a real dispatcher and worker. The browser's side is
tests/e2e/test_inbox_browser.py."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from parley.client import Client
from parley.runtime.procs import RedisServer, stop_processes
from parley.web.app import create_app
from parley.web.config import InboxConfig
from parley.web.users import hash_password
from tests.conftest import Procs, eventually, send, wait_for

# one deployment for the module, on one pytest process (`make test` runs --dist loadgroup)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("inbox-web")]

SEED = "Email bob@example.com: the launch moved to Friday."
ALICE_KEY = "alice-signing-key-0123456789"
BOB_KEY = "bob-signing-key-0123456789"
DAVE_KEY = "dave-signing-key-0123456789"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Procs, Path]]:
    """One redis-server, dispatcher and worker for the module (each test uses sessions and
    people of its own): they are stopped with SIGTERM at the end and must exit 0."""
    tmp_path = tmp_path_factory.mktemp("inbox-web")
    server = RedisServer(tmp_path / "redis").start()
    procs = Procs(server.url, tmp_path)
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": ALICE_KEY, "bob": BOB_KEY, "dave": DAVE_KEY}))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": {"password": hash_password("alice-password")},
                                 "carol": {"password": hash_password("carol-password")},
                                 "dave": {"password": hash_password("dave-password")}}))
    procs.dispatcher("tests.apps.scenarios", "--keys-file", str(keys))
    procs.worker("tests.apps.scenarios")
    try:
        # both processes up (their signal handlers in place) before any test can end
        warm = redis.Redis.from_url(server.url)
        asking(warm, Client(warm), "warm-up")
        warm.close()
        yield procs, tmp_path
    finally:
        codes = stop_processes([proc for _kind, proc, _log in procs.started])
        server.stop(kill=True)
        assert all(code == 0 for code in codes), f"exit codes {codes}\n{procs.logs()}"


@pytest.fixture
def r(deployment: tuple[Procs, Path]) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(deployment[0].url)
    yield client
    client.close()


@pytest.fixture
def client(r: redis.Redis) -> Client:
    return Client(r)


def app_of(procs: Procs, tmp_path: Path) -> TestClient:
    config = InboxConfig(secure_cookies=False,  # TestClient speaks plain HTTP
                         redis_urls=(procs.url,), users_file=str(tmp_path / "users.json"),
                         keys_file=str(tmp_path / "keys.json"), resume_timeout_s=15,
                         session_secret="replicas-share-this-secret")  # two apps: two replicas
    return TestClient(create_app(config), follow_redirects=False)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html[:500]
    return match.group(1)


def sign_in(web: TestClient, who: str, password: str) -> str:
    """Sign in; the CSRF token of the signed-in session."""
    token = csrf_of(web.get("/signin").text)
    reply = web.post("/signin", data={"principal": who, "secret": password, "csrf": token, "next": "/"})
    assert reply.status_code == 303, reply.text[:300]
    return csrf_of(web.get("/").text)


def asking(r: redis.Redis, client: Client, session: str) -> None:
    send(r, session, {"type": "message.create", "content": SEED})
    wait_for(client, session, lambda e: e["type"] == "interrupt.raised")


def test_nothing_is_shown_or_taken_without_signing_in(deployment: tuple[Procs, Path]) -> None:
    with app_of(*deployment) as web:
        reply = web.get("/?order=newest")
        assert reply.status_code == 303 and reply.headers["location"] == "/signin?next=%2F%3Forder%3Dnewest"
        assert web.get("/events").status_code == 401
        answer = {"session": "s", "interrupt_id": "int-1"}
        assert web.post("/interrupt/answer", data=answer).status_code == 401
        assert web.get("/interrupt?session=s&id=int-1").status_code == 303


def test_a_sign_in_is_refused_for_a_wrong_password_a_stranger_or_a_forged_form(
        deployment: tuple[Procs, Path]) -> None:
    with app_of(*deployment) as web:
        token = csrf_of(web.get("/signin").text)
        for who, password in (("alice", "wrong-password"), ("mallory", "alice-password"), ("alice", "")):
            reply = web.post("/signin", data={"principal": who, "secret": password, "csrf": token})
            assert reply.status_code == 401 and 'id="signin-error"' in reply.text
        assert web.post("/signin", data={"principal": "alice", "secret": "alice-password"}).status_code == 403
        assert web.get("/").status_code == 303  # still signed out
        # after a sign-in, `next` goes back only to a path of this site
        reply = web.post("/signin", data={"principal": "alice", "secret": "alice-password", "csrf": token,
                                          "next": "//evil.example/x"})
        assert reply.status_code == 303 and reply.headers["location"] == "/"


def test_approving_is_delivered_and_a_second_answer_is_told_it_was_already_answered(
        deployment: tuple[Procs, Path], r: redis.Redis, client: Client) -> None:
    asking(r, client, "web-a")
    with app_of(*deployment) as web, app_of(*deployment) as other:
        token = sign_in(web, "alice", "alice-password")
        listing = web.get("/").text
        assert 'data-session="web-a"' in listing and 'data-interrupt="int-1"' in listing
        page = web.get("/interrupt?session=web-a&id=int-1").text
        assert 'value="approve"' in page and "send_email" in page  # the form, and the tool call asked
        assert ALICE_KEY not in page and BOB_KEY not in page and ALICE_KEY not in listing
        # a form without the session's token changes nothing
        forged = web.post("/interrupt/answer", data={"session": "web-a", "interrupt_id": "int-1",
                                                     "decision": "approve", "csrf": "nope"})
        assert forged.status_code == 403
        assert client.open_interrupt("web-a", "int-1") is not None
        reply = web.post("/interrupt/answer", data={"session": "web-a", "interrupt_id": "int-1",
                                                    "decision": "approve", "csrf": token})
        assert 'data-status="delivered"' in reply.text, reply.text[:2000]
        resumed = wait_for(client, "web-a", lambda e: e["type"] == "interrupt.resumed")[-1]
        assert resumed["principal"] == "alice" and resumed["payload"] == {"approved": True}
        # someone else, with the page open from before, answers too
        other_token = sign_in(other, "alice", "alice-password")
        late = other.post("/interrupt/answer", data={"session": "web-a", "interrupt_id": "int-1",
                                                     "decision": "decline", "csrf": other_token})
        assert 'data-status="already_answered"' in late.text
        metrics = web.get("/metrics").text
        assert 'parley_inbox_answers_total{outcome="delivered"}' in metrics
        assert 'parley_inbox_answers_total{outcome="csrf"}' in metrics


def test_a_person_without_a_signing_key_reads_but_cannot_answer(
        deployment: tuple[Procs, Path], r: redis.Redis, client: Client) -> None:
    asking(r, client, "web-c")
    with app_of(*deployment) as web:
        token = sign_in(web, "carol", "carol-password")
        page = web.get("/interrupt?session=web-c&id=int-1")
        assert 'id="read-only"' in page.text and 'id="answer"' not in page.text
        reply = web.post("/interrupt/answer", data={"session": "web-c", "interrupt_id": "int-1",
                                                    "decision": "approve", "csrf": token})
        assert reply.status_code == 403
        assert client.open_interrupt("web-c", "int-1") is not None


def test_health_metrics_and_limits(deployment: tuple[Procs, Path], r: redis.Redis) -> None:
    with app_of(*deployment) as web:
        health = web.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok", "shards": ["ok"]}
        assert "content-security-policy" in health.headers
        token = sign_in(web, "alice", "alice-password")
        big = web.post("/interrupt/answer", content=b"x=" + b"a" * 300_000,
                       headers={"content-type": "application/x-www-form-urlencoded"})
        assert big.status_code == 413
        assert web.get("/?order=sideways").status_code == 400
        assert web.get("/?cursor=garbage").status_code == 400
        assert web.get("/interrupt?session=nope&id=int-9").status_code == 404
        assert token
        text = web.get("/metrics").text
        assert 'parley_inbox_requests_total{method="GET",route="/healthz",status="200"}' in text
        assert 'parley_inbox_signins_total{outcome="ok"}' in text


def test_signing_out_or_a_new_password_ends_every_copy_of_the_sign_in(
        deployment: tuple[Procs, Path], r: redis.Redis, client: Client) -> None:
    _procs, tmp_path = deployment
    asking(r, client, "web-out")
    with app_of(*deployment) as web, app_of(*deployment) as thief:
        token = sign_in(web, "dave", "dave-password")
        # a copy of the cookie, taken before the sign-out
        thief.cookies.set("parley_inbox", web.cookies.get("parley_inbox") or "")
        assert thief.get("/").status_code == 200
        assert web.post("/signout", data={"csrf": token}).status_code == 303
        assert thief.get("/").status_code == 303
        stolen = thief.post("/interrupt/answer", data={"session": "web-out", "interrupt_id": "int-1",
                                                       "decision": "approve", "csrf": token})
        assert stolen.status_code == 401 and client.open_interrupt("web-out", "int-1") is not None
        # a new password ends the sign-ins made with the old one
        sign_in(web, "dave", "dave-password")
        assert web.get("/").status_code == 200
        users = tmp_path / "users.json"
        entries = json.loads(users.read_text())
        entries["dave"] = {"password": hash_password("a-new-password")}
        users.write_text(json.dumps(entries))
        # the page looks at the file at most once a second
        eventually(lambda: web.get("/").status_code == 303, timeout=5)


def test_with_redis_down_pages_say_so_and_liveness_still_answers(tmp_path: Path) -> None:
    (tmp_path / "keys.json").write_text(json.dumps({"alice": ALICE_KEY}))
    (tmp_path / "users.json").write_text(json.dumps({"alice": {"password": hash_password("alice-password")}}))
    config = InboxConfig(secure_cookies=False,  # TestClient speaks plain HTTP
                         redis_urls=("redis://127.0.0.1:1/0",), users_file=str(tmp_path / "users.json"),
                         keys_file=str(tmp_path / "keys.json"))
    with TestClient(create_app(config), follow_redirects=False) as web:
        token = csrf_of(web.get("/signin").text)
        reply = web.post("/signin", data={"principal": "alice", "secret": "alice-password", "csrf": token})
        assert reply.status_code == 503 and "unavailable" in reply.text
        assert "content-security-policy" in reply.headers
        assert web.get("/healthz").status_code == 503
        assert web.get("/livez").status_code == 200
        assert 'route="/signin",status="503"' in web.get("/metrics").text
