"""A deployment for the inbox's browser tests, shared by a test module (module scope: starting
it and a browser costs seconds, a test's own sessions keep the tests apart).

`inbox_deployment`: a redis-server, a dispatcher (`--keys-file`, `--require-signing`) and a
worker running tests.apps.inbox_app, and `parley inbox` on a free port, all real processes
started as a user would; the people who may sign in (alice, bob) in a users file. The tests
raise questions by sending signed messages as the principal `app` (a producer's key: in the
keys file, not in the users file, so nobody signs in as it).

`chromium`: one headless Debian chromium per module, driven by Playwright (never `playwright
install`: the system's browser, with the flags a container needs).
"""

import functools
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
import redis
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from parley.client import Client
from parley.client.inbox import InterruptFilter
from parley.runtime.procs import RedisServer, free_port, stop_process, stop_processes
from parley.web.users import hash_password
from tests import npm
from tests.conftest import Procs, wait_for

APP = "tests.apps.inbox_app"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
#: people who sign in to the page; `app` only sends the messages that raise the questions
PEOPLE = ("alice", "bob")
PRODUCER = "app"
#: how long a DOM condition may take to hold: a question raised goes through the dispatcher,
#: a model call and a decide job on the worker before the feed names it
WAIT_MS = 15_000
#: rows per page of the list: small, so that a test's few questions make a second page
PAGE_SIZE = 3


@dataclass
class InboxDeployment:
    #: the page's address, `http://127.0.0.1:PORT`
    url: str
    redis_url: str
    r: redis.Redis
    client: Client
    #: principal -> signing key (the dispatchers' keys file); the page must never show one
    keys: dict[str, str]
    #: person -> password (the users file holds their scrypt hashes)
    passwords: dict[str, str]
    procs: Procs
    #: the users file's password hashes
    hashes: tuple[str, ...] = ()
    #: person -> the browser state (its session cookie) of their first sign-in
    sign_ins: dict[str, Any] = field(default_factory=dict)

    def secrets_in(self, text: str) -> list[str]:
        """What of the deployment's secrets (signing keys, passwords, password hashes) `text`
        shows, by name."""
        named = {**{f"key of {k}": v for k, v in self.keys.items()},
                 **{f"password of {k}": v for k, v in self.passwords.items()},
                 **{f"password hash {i}": v for i, v in enumerate(self.hashes)}}
        return [name for name, secret in named.items() if secret in text]

    def send(self, session: str, value: dict[str, Any]) -> None:
        """Send an input as the producer (signed: the dispatcher requires it)."""
        self.client.send(session, value, principal=PRODUCER, key=self.keys[PRODUCER])

    def ask(self, session: str, text: str) -> dict[str, Any]:
        """Send `text` as a new session's first message and wait for the question it raises:
        its `interrupt.raised` event."""
        self.send(session, {"type": "message.create", "content": text})
        return wait_for(self.client, session, lambda e: e["type"] == "interrupt.raised")[-1]

    def ask_many(self, asks: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """`ask` for each (session, text), all sent first, then each waited for: the questions
        are raised side by side instead of one after the other."""
        for session, text in asks:
            self.send(session, {"type": "message.create", "content": text})
        return [wait_for(self.client, session, lambda e: e["type"] == "interrupt.raised")[-1]
                for session, _text in asks]

    def events(self, session: str) -> list[dict[str, Any]]:
        return [e for _id, e in self.client.events(session, block_ms=1, until=time.monotonic() + 0.05)]

    def is_open(self, session: str, interrupt_id: str) -> bool:
        return any(row["session"] == session and row["interrupt_id"] == interrupt_id
                   for row in self.client.interrupts(InterruptFilter(session_prefix=session)))

    def page_url(self, session: str, interrupt_id: str) -> str:
        return "/interrupt?" + urlencode({"session": session, "id": interrupt_id})


def _wait_healthy(url: str, procs: Procs, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        exited = [kind for kind, proc, _log in procs.started if proc.poll() is not None]
        if exited or time.monotonic() > deadline:
            raise RuntimeError(f"parley inbox did not become healthy (exited: {exited})\n{procs.logs()}")
        time.sleep(0.05)


@pytest.fixture(scope="module", name="inbox_deployment")
def inbox_deployment_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxDeployment]:
    home: Path = tmp_path_factory.mktemp("inbox")
    server = RedisServer(home / "redis").start()
    procs = Procs(server.url, home)
    # Random keys: a key found in a page can only have come from the keys file.
    keys = {name: f"sk-{name}-{secrets.token_hex(16)}" for name in (*PEOPLE, PRODUCER)}
    passwords = {name: f"pw-{name}-{secrets.token_hex(6)}" for name in PEOPLE}
    keys_file = home / "keys.json"
    keys_file.write_bytes(orjson.dumps(keys))
    users_file = home / "users.json"
    hashes = {name: hash_password(pw) for name, pw in passwords.items()}
    users_file.write_bytes(orjson.dumps({name: {"password": h} for name, h in hashes.items()}))
    r = redis.Redis.from_url(server.url)
    try:
        procs.dispatcher(APP, "--keys-file", str(keys_file), "--require-signing")
        procs.worker(APP)
        port = free_port()
        procs.start("inbox", APP, "--port", str(port), "--host", "127.0.0.1",
                    "--users-file", str(users_file), "--keys-file", str(keys_file),
                    "--session-secret", secrets.token_hex(16), "--page-size", str(PAGE_SIZE))
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, procs)
        yield InboxDeployment(url, server.url, r, Client(r), keys, passwords, procs,
                              tuple(hashes.values()))
        # SIGTERM must end every process cleanly (exit 0), the page's server included.
        codes = dict(zip([log.name for _kind, _proc, log in procs.started],
                         stop_processes([proc for _kind, proc, _log in procs.started]), strict=True))
        assert all(code == 0 for code in codes.values()), f"exit codes {codes}\n{procs.logs()}"
    finally:
        for _kind, proc, _log in procs.started:
            stop_process(proc)
        r.close()
        server.stop(kill=True)


@pytest.fixture(scope="module", name="chromium")
def chromium_fixture() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError(f"the browser tests drive Debian's chromium, and {CHROMIUM} is missing: "
                           "apt-get install chromium")
    playwright: Playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    finally:
        playwright.stop()


class Browsers:
    """New browser contexts (each its own cookies: one person) for one test, closed after it."""

    def __init__(self, browser: Browser, deployment: InboxDeployment):
        self.browser = browser
        self.deployment = deployment
        self.pages: list[Page] = []

    def anonymous(self, storage_state: Any = None, live: bool = True, width: int = 1200) -> Page:
        """A page of a new context, `width` CSS pixels wide; `live=False`: its event streams are
        cut (a page that hears of no change)."""
        context = self.browser.new_context(base_url=self.deployment.url, storage_state=storage_state,
                                           viewport={"width": width, "height": 800})
        context.set_default_timeout(WAIT_MS)
        if not live:
            context.route(re.compile(r"/events(\?|$)"), lambda route: route.abort())
        page = context.new_page()
        self.pages.append(page)
        return page

    def signed_in(self, person: str, path: str = "/", live: bool = True, width: int = 1200) -> Page:
        """A page of `person` at `path`. The module's first page of each person signs in
        through the form on the way to `path` (any page sends someone not signed in to
        /signin?next=<path>, which sends them back); later ones start with that sign-in's
        cookie, as another tab would, which saves the tests a sign-in each."""
        cookie = self.deployment.sign_ins.get(person)
        if cookie is not None:
            page = self.anonymous(cookie, live, width)
            page.goto(path)
            expect(page.locator("#principal")).to_have_text(person)
            return page
        page = self.anonymous(live=live, width=width)
        page.goto(path)
        expect(page.locator("form#signin")).to_be_visible()
        page.fill("form#signin input[name=principal]", person)
        page.fill("form#signin input[name=secret]", self.deployment.passwords[person])
        with page.expect_navigation():
            page.click("form#signin button[type=submit]")
        assert page.url == self.deployment.url + path, f"signed in, then at {page.url}, not {path}"
        expect(page.locator("#principal")).to_have_text(person)
        self.deployment.sign_ins[person] = page.context.storage_state()
        return page

    def close(self) -> None:
        for page in self.pages:
            page.context.close()


# ---- what the page tests share ------------------------------------------------------------------

@functools.cache
def axe_script() -> str:
    """axe-core (npm, pinned in tests/browser/js), to evaluate in a page: installed on first use."""
    folder = npm.installed(Path(__file__).parent.parent / "browser" / "js", "axe-core")
    return (folder / "node_modules" / "axe-core" / "axe.min.js").read_text()


WIDTHS = (375, 1280)
#: a value 250 characters long, over the payment form's `note` limit of 200, with no space to
#: break at: the error that echoes it must still wrap
LONG_NOTE = "x" * 250


@pytest.fixture(name="browsers")
def browsers_fixture(chromium: Browser, inbox_deployment: InboxDeployment, request: pytest.FixtureRequest,
                     tmp_path: Path) -> Iterator["Browsers"]:
    """New browser contexts for one test, closed after it; when the test failed, what each page
    showed (a screenshot in its tmp_path, its HTML) and what the processes said."""
    opened = Browsers(chromium, inbox_deployment)
    yield opened
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, page in enumerate(opened.pages):
            page.screenshot(path=str(tmp_path / f"failed-{i}.png"), full_page=True)
            print(f"----- page {i}: {page.url} -----\n{page.content()[:4000]}")
        print(inbox_deployment.procs.logs())
    opened.close()


def session_name(what: str) -> str:
    """A session of this test's own (the deployment is shared by the module)."""
    return f"{what}-{uuid.uuid4().hex[:8]}"


def resumed(d: InboxDeployment, session: str) -> list[dict[str, Any]]:
    return [e for e in d.events(session) if e["type"] == "interrupt.resumed"]


def listed(page: Page) -> list[str]:
    return page.locator("table#interrupts tbody tr.interrupt").evaluate_all(
        "rows => rows.map(row => row.dataset.session)")


def fits(page: Page) -> None:
    """Nothing on the page runs past the window's width (no sideways scroll)."""
    width = page.evaluate("() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})")
    assert width["scroll"] <= width["inner"], f"{page.url}: {width['scroll']} px wide in {width['inner']} px"


def axe_findings(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is, one line each."""
    # evaluated through the browser's debugging protocol: the page's CSP (script-src 'self')
    # would refuse a script tag, and must stay on for what is checked to be what users get
    page.evaluate(axe_script() + "\n;true")
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}): {v['help']}: {[n['target'] for n in v['nodes']][:3]}"
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


def fill_payment(page: Page, note: str) -> None:
    """The required fields of tests.apps.inbox_app's payment form, and its note."""
    page.fill('[name="answer.amount"]', "50")
    page.select_option('select[name="answer.currency"]', label="EUR")
    page.fill('[name="answer.payee.name"]', "Dan")
    page.fill('[name="answer.note"]', note)


def checked(page: Page, name: str, width: int) -> None:
    """The page fits its width, axe finds nothing serious, and a screenshot is kept if asked."""
    fits(page)
    findings = axe_findings(page)
    assert not findings, f"{name} at {width} px: {findings}"
    folder = os.environ.get("PARLEY_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
