"""The keys trap (issue 34), as an operator meets it: `parley dispatcher` and `parley inbox`
started as real processes with different keys files, each under its login of the shipped
users.acl. The inbox's stderr says at start which key the dispatchers lack and what to do; an
answer signed with such a key is refused, and the page names the fix; once the dispatcher is
given the inbox's keys (SIGHUP), its prints change, a new inbox finds nothing to say, and the
same answer is delivered."""

import ast
import html
import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, free_port
from parley.schemas.keyprints import fingerprint, read_published
from parley.schemas.keys import Keys
from parley.web.users import hash_password
from tests.conftest import Procs, eventually, wait_for
from tests.deployed import login
from tests.integration.test_deploy import Page

pytestmark = pytest.mark.e2e

APP = "tests.apps.scenarios"
SEED = "Email bob@example.com: the launch moved to Friday."
KEYS = Keys()
INBOX_KEYS = {"alice": "alice-signing-key-0123456789", "carol": "carol-inbox-key-0123456789"}
DISPATCHER_KEYS = {"bob": "bob-signing-key-0123456789", "carol": "carol-dispatcher-key-0123456789"}
FIX = "they must be started with the same keys file as the inbox (--keys-file / PARLEY_KEYS_FILE)"


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


def prints(r: redis.Redis) -> dict[str, dict[str, tuple[str, ...]]]:
    """Each dispatcher's published principals -> fingerprints."""
    fields: dict[bytes, bytes] = r.hgetall(KEYS.keyprints)  # type: ignore[assignment]
    return {p.dispatcher: p.prints.principals for p in read_published(fields).records}


def start_inbox(procs: Procs, redis_server: RedisServer, tmp_path: Path, port: int) -> Path:
    """`parley --producer inbox inbox ...` under the login parley-inbox; its log's path."""
    procs.start("inbox", APP, "--port", str(port), "--users-file", str(tmp_path / "users.json"),
                "--keys-file", str(tmp_path / "inbox-keys.json"),
                env={"PARLEY_REDIS_URL": redis_server.url_as(login("parley-inbox")),
                     "PARLEY_PRODUCER": "inbox"})
    log = procs.started[-1][2]
    # the log is made by the process as it starts: not there yet on a loaded box
    eventually(lambda: log.exists() and "parley inbox: serving on" in log.read_text(errors="replace"),
               timeout=30)
    return log


#: a log line's message: `msg=` and the message's repr (parley/runtime/logs.py)
MSG = re.compile(r" msg=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def warnings_in(log: Path) -> list[str]:
    """The message of every WARNING line of a process's log."""
    return [ast.literal_eval(match.group(1)) for line in log.read_text(errors="replace").splitlines()
            if " level=warning " in line and (match := MSG.search(line))]


def answer(web: httpx.Client, session: str) -> str:
    """Approve the session's question on the page; the outcome's text, unescaped."""
    page = web.get("/interrupt", params={"session": session, "id": "int-1"})
    assert page.status_code == 200, page.text[-1000:]
    form = Page(page.text).forms["answer"]
    done = web.post("/interrupt/answer", data={**form, "decision": "approve"})
    assert done.status_code == 200, done.text[-1000:]
    return html.unescape(done.text)


def sign_in(web: httpx.Client, who: str) -> None:
    form = Page(web.get("/signin").text).forms["signin"]
    signed = web.post("/signin", data={**form, "principal": who, "secret": f"{who}-password"})
    assert signed.status_code == 303, signed.text[-500:]


def test_an_inbox_with_keys_the_dispatcher_lacks_says_so_at_start_and_on_the_page(
        procs: Procs, redis_server: RedisServer, r: redis.Redis, producer_client: Client,
        tmp_path: Path) -> None:
    dispatcher_keys = tmp_path / "dispatcher-keys.json"
    dispatcher_keys.write_text(json.dumps(DISPATCHER_KEYS))
    (tmp_path / "inbox-keys.json").write_text(json.dumps(INBOX_KEYS))
    (tmp_path / "users.json").write_text(json.dumps(
        {who: {"password": hash_password(f"{who}-password")} for who in ("alice", "carol")}))
    dispatcher = procs.dispatcher(APP, "--keys-file", str(dispatcher_keys),
                                  env={"PARLEY_REGISTER_PRODUCERS": "app inbox"})
    procs.worker(APP)
    eventually(lambda: len(prints(r)) == 1, timeout=30)  # published as it started
    [(name, published)] = prints(r).items()
    assert published == {p: (fingerprint(p, key),) for p, key in DISPATCHER_KEYS.items()}

    port = free_port()
    log = start_inbox(procs, redis_server, tmp_path, port)
    assert warnings_in(log) == [
        "inbox key for alice is unknown to the dispatchers: start them with the same --keys-file (or add "
        "alice's key to theirs)",
        "inbox key for carol (its first, which it signs with) is not one the dispatchers have for carol: "
        "start them with the same --keys-file (or add carol's key to theirs)"]
    started = log.read_text()
    assert started.index("inbox key for alice") < started.index("parley inbox: serving on")  # before serving
    assert all(key not in started for key in (*INBOX_KEYS.values(), *DISPATCHER_KEYS.values()))

    for session in ("keys-alice", "keys-carol", "keys-fixed"):
        producer_client.send(session, {"type": "message.create", "content": SEED})
        wait_for(producer_client, session, lambda e: e["type"] == "interrupt.raised", timeout=30)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as alice, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as carol:
        sign_in(alice, "alice")
        shown = answer(alice, "keys-alice")
        assert 'data-status="refused"' in shown and "Refused (unauthorized)" in shown
        assert "The dispatchers do not know this inbox's key for " in shown and FIX in shown
        sign_in(carol, "carol")
        shown = answer(carol, "keys-carol")
        assert 'data-status="refused"' in shown
        assert "is not the one this inbox signs with" in shown and FIX in shown

        # the fix: the dispatcher given the inbox's keys, read again on SIGHUP
        dispatcher_keys.write_text(json.dumps({**DISPATCHER_KEYS, **INBOX_KEYS}))
        os.utime(dispatcher_keys, ns=(0, 0))  # only the signal makes it read the file again
        dispatcher.send_signal(signal.SIGHUP)
        eventually(lambda: set(prints(r).get(name, {})) == {"alice", "bob", "carol"}, timeout=15)
        assert prints(r)[name]["carol"] == (fingerprint("carol", INBOX_KEYS["carol"]),)
        shown = answer(alice, "keys-fixed")
        assert 'data-status="delivered"' in shown, shown[-2000:]

    # a new inbox started now has nothing to warn of
    second = start_inbox(procs, redis_server, tmp_path, free_port())
    eventually(lambda: "inbox keys checked" in second.read_text(), timeout=10)
    assert warnings_in(second) == []
    resumed = wait_for(producer_client, "keys-fixed", lambda e: e["type"] == "interrupt.resumed")[-1]
    assert resumed["principal"] == "alice"

    # a clean stop takes the dispatcher's record away: nothing published is what the next one finds
    procs.forget(dispatcher)
    dispatcher.send_signal(signal.SIGTERM)
    assert dispatcher.wait(20) == 0
    assert prints(r) == {}
    assert r.acl_log() == []  # nothing refused to any login
