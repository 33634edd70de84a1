"""The inbox's history (`/history`, docs/inbox.md "History") as deployed: Redis with the shipped
redis.conf and users.acl, a dispatcher and a worker under their logins, and `parley inbox` as a
process under the `parley-inbox` login (which may only read what it shows), driven over HTTP.

Two people answer questions in the inbox, one question is left to its deadline and one is
cancelled by its session's close; each session's history and each person's answers then say
who answered what, when, with which answer, and how each question ended, newest first. Redis
refuses the inbox nothing while it reads them (its ACL LOG stays empty)."""

import html
import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, free_port, stop_processes
from parley.web.users import hash_password
from tests.conftest import Procs, eventually, wait_for
from tests.deployed import DISPATCHER, PRODUCER, WORKER, login, started_for_producers

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("inbox-history")]

APP = "tests.apps.inbox_app"
INBOX_LOGIN = "parley-inbox"
#: who signs in: alice and bob answer (they have signing keys); carol may only read
PASSWORDS = {"alice": "alice-password", "bob": "bob-password", "carol": "carol-password"}
XSS = "<script>alert(1)</script>"


@dataclass
class Deployment:
    url: str
    #: the harness's admin (reads events, the ACL log); no Parley process uses it
    admin: redis.Redis
    reads: Client
    producer: Client
    procs: Procs

    def ask(self, session: str, text: str) -> dict[str, Any]:
        """A new question: `text` as a message of `session`; its `interrupt.raised`, once the
        index lists it (the inbox answers only what the index holds)."""
        self.producer.send(session, {"type": "message.create", "content": text})
        raised = wait_for(self.reads, session, lambda e: e["type"] == "interrupt.raised"
                          and not self._ended(session, e["interrupt_id"]))[-1]
        eventually(lambda: self.reads.open_interrupt(session, raised["interrupt_id"]) is not None, timeout=10)
        return raised

    def _ended(self, session: str, interrupt_id: str) -> bool:
        events = self.reads.events(session, block_ms=1, until=time.monotonic() + 0.05)
        return any(e["type"] in ("interrupt.resumed", "interrupt.cancelled")
                   and e["interrupt_id"] == interrupt_id for _id, e in events)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    home = tmp_path_factory.mktemp("inbox-history")
    server: RedisServer = started_for_producers(home / "redis")
    keys, users = home / "keys.json", home / "users.json"
    keys.write_text(json.dumps({"alice": "alice-signing-key-" + secrets.token_hex(8),
                                "bob": "bob-signing-key-" + secrets.token_hex(8)}))
    users.write_text(json.dumps({who: {"password": hash_password(pw)} for who, pw in PASSWORDS.items()}))
    procs = Procs(server.url, home, urls={"dispatcher": server.url_as(login(DISPATCHER)),
                                          "worker": server.url_as(login(WORKER)),
                                          "inbox": server.url_as(login(INBOX_LOGIN))})
    admin = redis.Redis.from_url(server.url)
    producer = redis.Redis.from_url(server.url_as(login(PRODUCER)))
    try:
        procs.dispatcher(APP, "--keys-file", str(keys), "--register-producer", "inbox")
        procs.worker(APP)
        port = free_port()
        procs.start("inbox", APP, "--port", str(port), "--users-file", str(users), "--keys-file", str(keys),
                    "--session-secret", secrets.token_hex(16), env={"PARLEY_PRODUCER": "inbox"})
        url = f"http://127.0.0.1:{port}"
        eventually(lambda: _healthy(url), timeout=30)
        yield Deployment(url, admin, Client(admin), Client(producer, producer="app"), procs)
        codes = stop_processes([proc for _kind, proc, _log in procs.started])
        assert all(code == 0 for code in codes), f"exit codes {codes}\n{procs.logs()}"
    except BaseException:
        print(procs.logs())
        raise
    finally:
        stop_processes([proc for _kind, proc, _log in procs.started])
        admin.close()
        producer.close()
        server.stop(kill=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def signed_in(d: Deployment, who: str) -> tuple[httpx.Client, str]:
    """An HTTP client signed in as `who`, and its CSRF token."""
    web = httpx.Client(base_url=d.url, timeout=30)
    token = csrf_of(web.get("/signin").text)
    reply = web.post("/signin", data={"principal": who, "secret": PASSWORDS[who], "csrf": token, "next": "/"})
    assert reply.status_code == 303, reply.text[:500]
    return web, csrf_of(web.get("/").text)


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page[:500]
    return match.group(1)


def answer(d: Deployment, web: httpx.Client, token: str, session: str, interrupt_id: str,
           decision: str) -> None:
    reply = web.post("/interrupt/answer", data={"session": session, "interrupt_id": interrupt_id,
                                                "decision": decision, "csrf": token,
                                                "answer_id": secrets.token_urlsafe(12)})
    assert 'data-status="delivered"' in reply.text, reply.text[-2000:]
    wait_for(d.reads, session, lambda e: e["type"] == "turn.completed")


@dataclass(frozen=True)
class Shown:
    """A row of the history page, as a reader's tools see it."""

    session: str
    interrupt_id: str
    ending: str
    principal: str | None
    answer: Any
    text: str


ROW = re.compile(r'<tr class="ended" (?P<attrs>[^>]*)>(?P<body>.*?)</tr>', re.S)


def rows_of(page: str) -> list[Shown]:
    found = []
    for match in ROW.finditer(page):
        attrs = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', match["attrs"])}
        cell = re.search(r'<td class="answer"[^>]*>(.*?)</td>', match["body"], re.S)
        assert cell is not None, match["body"]
        pre = re.search(r"<pre>(.*?)</pre>", cell.group(1), re.S)
        shown = orjson.loads(html.unescape(pre.group(1))) if pre else None
        found.append(Shown(attrs["data-session"], attrs["data-interrupt"], attrs["data-ending"],
                           attrs.get("data-principal"), shown, match["body"]))
    return found


def history(web: httpx.Client, **params: str) -> str:
    reply = web.get("/history?" + urlencode(params))
    assert reply.status_code == 200, reply.text[-1500:]
    return reply.text


def test_two_people_answer_and_each_history_says_who_answered_what_and_how_it_ended(d: Deployment) -> None:
    alice, alice_token = signed_in(d, "alice")
    bob, bob_token = signed_in(d, "bob")
    carol, _ = signed_in(d, "carol")
    try:
        first = d.ask("hist-1", f"pay acme: invoice {XSS}")
        answer(d, alice, alice_token, "hist-1", first["interrupt_id"], "approve")
        second = d.ask("hist-2", "pay bolt: invoice 2")
        answer(d, bob, bob_token, "hist-2", second["interrupt_id"], "decline")
        # a second question in the first session, answered by the other person
        again = d.ask("hist-1", "pay dune: invoice 4")
        assert again["interrupt_id"] != first["interrupt_id"]
        answer(d, bob, bob_token, "hist-1", again["interrupt_id"], "approve")
        # nobody answers: its deadline does, with the default
        d.ask("hist-3", "pay cargo: invoice 3 [deadline-3s]")
        wait_for(d.reads, "hist-3", lambda e: e["type"] == "interrupt.resumed", timeout=30)
        # its session is closed before anyone answers
        d.ask("hist-5", "pay echo: invoice 5")
        d.producer.close("hist-5", reason="customer-left", wait=True)

        # one session: every question that ended, newest first, who answered and with what
        page = history(alice, session="hist-1")
        assert [(r.interrupt_id, r.ending, r.principal, r.answer) for r in rows_of(page)] == [
            (again["interrupt_id"], "answered", "bob", {"approved": True}),
            (first["interrupt_id"], "answered", "alice", {"approved": True})]
        assert "Make this payment?" in page and "<caption>" in page and '<th scope="col">' in page
        assert XSS not in page and html.escape(XSS, quote=False) in page  # what it asked, escaped
        assert [r.interrupt_id for r in rows_of(history(alice, session="hist-1", principal="alice"))] == [
            first["interrupt_id"]]
        [deadline] = rows_of(history(bob, session="hist-3"))
        assert (deadline.ending, deadline.principal) == ("deadline", None)
        assert deadline.answer == {"approved": False}
        assert "Deadline passed" in deadline.text
        [closed] = rows_of(history(bob, session="hist-5"))
        assert (closed.ending, closed.principal, closed.answer) == ("cancelled", None, None)
        assert "customer-left" in closed.text

        # one person: their answers across sessions, newest first; carol (who may not answer)
        # reads anyone's, as everyone signed in may
        for web in (alice, carol):
            bobs = history(web, principal="bob")
            assert [(r.session, r.interrupt_id, r.answer) for r in rows_of(bobs)] == [
                ("hist-1", again["interrupt_id"], {"approved": True}),
                ("hist-2", second["interrupt_id"], {"approved": False})]
            assert all(r.ending == "answered" and r.principal == "bob" for r in rows_of(bobs))
        alices = history(bob, principal="alice")
        assert [(r.session, r.interrupt_id) for r in rows_of(alices)] == [("hist-1", first["interrupt_id"])]
        assert 'id="history-older"' not in alices and "The feeds reach back to" in alices
        assert rows_of(history(alice, principal="nobody-answers")) == []
        assert "there is no such session" in history(alice, session="hist-none")
    finally:
        for web in (alice, bob, carol):
            web.close()
    # everything read under the inbox's own login, and Redis refused it nothing
    refused = [entry for entry in d.admin.acl_log() if entry.get("username") == INBOX_LOGIN]
    assert refused == [], refused


@pytest.mark.parametrize(("query", "says"), [
    ("", "name a session"),
    ("?session=&principal=", "name a session"),
    ("?session=" + "s" * 300, "at most 256"),
    ("?principal=" + "p" * 300, "at most 256"),
    ("?session=a%7Bb%7D", "not a session id"),
    ("?session=s-1&before=nope", "event id"),
    ("?principal=alice&before=1-0", "Older link"),
])
def test_a_history_query_that_names_nothing_or_too_much_is_a_400_that_says_why(
        d: Deployment, query: str, says: str) -> None:
    web, _token = signed_in(d, "carol")
    try:
        reply = web.get("/history" + query)
    finally:
        web.close()
    assert reply.status_code == 400 and 'id="history-error"' in reply.text and says in reply.text
    assert 'id="history-search"' in reply.text  # and the form to ask again


def test_history_needs_a_sign_in(d: Deployment) -> None:
    with httpx.Client(base_url=d.url, timeout=10) as web:
        reply = web.get("/history?principal=alice")
    assert reply.status_code == 303
    assert reply.headers["location"] == "/signin?" + urlencode({"next": "/history?principal=alice"})


@pytest.fixture(name="d")
def d_fixture(deployment: Deployment) -> Deployment:
    return deployment
