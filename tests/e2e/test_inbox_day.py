"""An approver's whole day in the inbox (issue 34), in Debian's chromium driven by Playwright:
search, answering several questions at once (and what it refuses), what the page says after an
answer (the answer, what the session did next, the next question), the history of answers, a
kept name after a failed sign-in, the live region and the headers. Every page's width and
accessibility: tests/e2e/test_inbox_pages.py.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from parley.client.inbox import InterruptFilter
from parley.web import bulk
from parley.web.bulk import Pick
from tests.e2e.inbox_fixtures import (  # noqa: F401  (fixtures)
    WAIT_MS,
    Browsers,
    InboxDeployment,
    browsers_fixture,
    chromium_fixture,
    inbox_deployment_fixture,
    listed,
    resumed,
    session_name,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("inbox-day")]


def test_search_finds_a_question_by_a_word_of_its_payload_and_combines_with_the_filters(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    tag = uuid.uuid4().hex[:6]
    turnips, rent = session_name(f"search-{tag}"), session_name(f"search-{tag}")
    d.ask_many([(turnips, f"pay zanzibar-{tag}: turnips for the canteen"),
                (rent, f"pay acme-{tag}: rent for March")])
    page = browsers.signed_in("alice", "/?" + urlencode({"session": f"search-{tag}"}))
    expect(page.locator("table#interrupts tbody tr.interrupt")).to_have_count(2)
    page.fill("form#filters input[name=q]", "TURNIPS canteen")  # words of the payload, any case
    with page.expect_navigation():
        page.click("form#filters button[type=submit]")
    assert listed(page) == [turnips]
    expect(page.locator("table#interrupts caption")).to_contain_text("matching the filters")
    page.goto("/?" + urlencode({"q": f"zanzibar-{tag}"}))  # a word of the payload, no other filter
    assert listed(page) == [turnips]
    page.goto("/?" + urlencode({"q": "turnips", "reason": "review", "session": f"search-{tag}"}))
    assert listed(page) == []  # the filters combine: its reason is confirm
    expect(page.locator("#empty")).to_contain_text("match these filters")
    page.goto("/?" + urlencode({"q": rent}))  # the session id is searched too
    assert listed(page) == [rent]


def test_three_alike_questions_answered_together_deliver_three_resumes_each_reported(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    tag = f"bulk-{uuid.uuid4().hex[:6]}"
    alike = [f"{tag}-{n}" for n in range(3)]
    form = f"{tag}-form"
    d.ask_many([*[(session, f"pay shop-{n}: stationery") for n, session in enumerate(alike)],
                (form, "pay dan: [form] invoice 7")])  # another kind of answer: a form
    # with a session prefix the list runs by session id: the three alike fill the first page
    page = browsers.signed_in("alice", "/?" + urlencode({"session": tag}))
    assert listed(page) == alike
    button = page.locator("#answer-selected")
    expect(button).to_be_disabled()  # nothing picked yet
    for session in alike:
        page.locator(f'tr.interrupt[data-session="{session}"] input[name=pick]').check()
    expect(button).to_have_text("Answer the 3 selected together")
    with page.expect_navigation():
        button.click()
    expect(page.locator("#bulk-questions li")).to_have_count(3)
    chosen = page.url
    # all four ask for two kinds of answer: the page offers the groups instead of one form
    page.goto("/bulk?" + urlencode([("pick", bulk.token_of(Pick(s, "int-1"))) for s in [*alike, form]]))
    groups = page.locator("#bulk-groups a.bulk-group")
    expect(groups).to_have_count(2)
    expect(groups.first).to_contain_text("3 questions")
    expect(page.locator("form#bulk-answer")).to_have_count(0)
    with page.expect_navigation():
        groups.first.click()
    assert page.url == chosen
    expect(page.locator("#bulk-questions li")).to_have_count(3)
    assert all(resumed(d, s) == [] for s in alike)  # nothing sent by choosing
    # the form as the browser sends it, to send it a second time below
    fields = page.locator("form#bulk-answer").evaluate("f => [...new FormData(f)]")
    with page.expect_navigation():
        page.click("form#bulk-answer button[value=approve]")
    results = page.locator("#bulk-results tr.bulk-result")
    expect(results).to_have_count(3)
    assert results.evaluate_all("rows => rows.map(r => r.dataset.status)") == ["delivered"] * 3
    expect(page.locator("#sent-answer")).to_have_text("Approved")
    for session in alike:
        [event] = resumed(d, session)
        assert (event["principal"], event["payload"], event["delivered"]) == (
            "alice", {"approved": True}, True)
    assert resumed(d, form) == []
    # the next open question is offered (the form one is the oldest left of this test's)
    expect(page.locator("#next-question")).to_be_visible()
    # the same form sent again (a double click, a resend) sends nothing more: each answer has
    # its own idempotency key, and the questions are no longer open
    again = page.request.post("/bulk/answer", data=urlencode([*map(tuple, fields), ("decision", "approve")]),
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert again.status == 200 and 'id="bulk-none"' in again.text(), again.text()[:2000]
    assert 'data-status="delivered"' not in again.text()
    assert all(len(resumed(d, s)) == 1 for s in alike)
    page.goto(chosen)  # the chosen questions again: answered, so no form
    expect(page.locator("#bulk-none")).to_be_visible()
    expect(page.locator("#bulk-set-aside li")).to_have_count(3)


def test_after_an_answer_the_page_shows_it_what_the_session_did_next_and_the_next_question(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    first, second = session_name("next-a"), session_name("next-b")
    raised, _ = d.ask_many([(first, "pay carol: rent for April"), (second, "pay dave: rent for May")])
    page = browsers.signed_in("alice", d.page_url(first, raised["interrupt_id"]))
    with page.expect_navigation():
        page.click("form#answer button[value=approve]")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "delivered")
    expect(page.locator("#sent-answer")).to_have_text("Approved")
    # the app settles the call with the approval, and the model sums up: the page read those
    # events after the answer's interrupt.resumed
    steps = page.locator("#next-events li")
    expect(steps.first).to_be_visible()
    assert "Tool result: paid" in steps.all_inner_texts()
    # the next question is the oldest open one alice may answer: this test's second one, unless
    # another test's older question is still open (the deployment is shared), never the first
    nxt = page.locator("#next-question")
    expect(nxt).to_be_visible()
    oldest = d.client.interrupt_page(InterruptFilter(principal="alice"), limit=5).items
    expected = next(r for r in oldest if r.session != first)
    with page.expect_navigation():
        nxt.click()
    assert page.url == d.url + d.page_url(expected.session, expected.interrupt_id)
    assert d.is_open(second, "int-1")


def test_history_shows_who_answered_what_per_session_and_per_approver(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    by_alice, by_bob = session_name("hist-a"), session_name("hist-b")
    d.ask_many([(session, "pay erin: a history lesson") for session in (by_alice, by_bob)])
    alice = browsers.signed_in("alice", d.page_url(by_alice, "int-1"))
    with alice.expect_navigation():
        alice.click("form#answer button[value=approve]")
    bob = browsers.signed_in("bob", d.page_url(by_bob, "int-1"))
    with bob.expect_navigation():
        bob.click("form#answer button[value=decline]")
    # the question's page links its session's history
    with alice.expect_navigation():
        alice.click("#session-history")
    row = alice.locator(f'table#history tr.ended[data-session="{by_alice}"]')
    expect(row).to_have_count(1)
    assert row.get_attribute("data-principal") == "alice" and row.get_attribute("data-ending") == "answered"
    expect(row).to_contain_text('"approved": true')
    assert "bob" not in alice.locator("table#history").inner_text()
    alice.goto("/history?" + urlencode({"principal": "bob"}))
    theirs = alice.locator(f'table#history tr.ended[data-session="{by_bob}"]')
    expect(theirs).to_have_count(1)
    expect(theirs).to_contain_text('"approved": false')
    assert by_alice not in alice.locator("table").inner_text()
    alice.goto("/")
    with alice.expect_navigation():
        alice.click("#my-history")
    expect(alice.locator("table")).to_contain_text(by_alice)


def test_a_failed_sign_in_keeps_the_name_and_a_live_row_is_announced(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    page = browsers.anonymous()
    page.goto("/signin")
    page.fill("form#signin input[name=principal]", "alice")
    page.fill("form#signin input[name=secret]", "not-her-password")
    with page.expect_navigation():
        page.click("form#signin button[type=submit]")
    expect(page.locator("#signin-error")).to_be_visible()
    expect(page.locator("form#signin input[name=principal]")).to_have_value("alice")
    expect(page.locator("form#signin input[name=secret]")).to_have_value("")
    # headers: no page with session data may be kept by the browser
    for path in ("/signin", "/"):
        reply = page.request.get(path)
        assert reply.headers.get("cache-control") == "no-store", path
    assert page.request.get("/static/inbox.css").headers.get("cache-control") != "no-store"

    session = session_name("live")
    listing = browsers.signed_in("bob", "/?" + urlencode({"session": session}))
    live = listing.locator("#live-status")
    assert live.get_attribute("aria-live") == "polite"
    d.ask(session, "pay frank: a live one")
    expect(listing.locator(f'tr.interrupt[data-session="{session}"]')).to_have_count(1, timeout=WAIT_MS)
    expect(live).to_contain_text("New question: confirm")


def form_post(page: Page, path: str, fields: list[tuple[str, str]]) -> Any:
    """A POST of `fields` as a browser's form, with the page's cookies."""
    return page.request.post(path, data=urlencode(fields),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})


def test_a_bulk_answer_refuses_what_it_cannot_use_and_sends_nothing_for_it(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    tag = f"bulkbad-{uuid.uuid4().hex[:6]}"
    plain, form, bobs = f"{tag}-plain", f"{tag}-form", f"{tag}-bob"
    d.ask_many([(plain, "pay shop: pens"), (form, "pay dan: [form] invoice 8"),
                (bobs, "pay erin: [bob-only] toner")])
    page = browsers.signed_in("alice", "/?" + urlencode({"session": tag}))
    csrf = page.locator("input[name=csrf]").first.get_attribute("value") or ""
    pick = {s: ("pick", bulk.token_of(Pick(s, "int-1"))) for s in (plain, form, bobs)}
    approve = ("decision", "approve")

    assert browsers.anonymous().request.post("/bulk/answer", data="pick=x").status == 401
    assert form_post(page, "/bulk/answer", [pick[plain], approve]).status == 403  # no CSRF token
    assert form_post(page, "/bulk/answer", [("csrf", "forged"), pick[plain], approve]).status == 403
    forged = form_post(page, "/bulk/answer", [("csrf", csrf), ("pick", "bm90LWEtcGljaw"), approve])
    assert forged.status == 400 and "not one the list offered" in forged.text()
    assert page.request.get("/bulk").status == 400  # nothing picked
    huge = page.request.post("/bulk/answer", data="pick=" + "A" * 300_000,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert huge.status == 413
    # two kinds of answer in one form: refused whole
    mixed = form_post(page, "/bulk/answer", [("csrf", csrf), pick[plain], pick[form], approve])
    assert mixed.status == 400 and 'id="bulk-groups"' in mixed.text()
    # an answer that does not fit the schema: refused beside its field
    unfit = form_post(page, "/bulk/answer", [("csrf", csrf), pick[form], ("answer.amount", "500"),
                                             ("answer.currency", '"EUR"'), ("answer.payee.name", "Dan"),
                                             ("decision", "send")])
    assert unfit.status == 422 and 'data-for="answer.amount"' in unfit.text()
    assert resumed(d, plain) == [] and resumed(d, form) == []
    # one alice may not answer ([bob-only]) goes with one she may: hers is sent, bob's left out
    sent = form_post(page, "/bulk/answer", [("csrf", csrf), ("answer_id", "form-of-test-1"),
                                            pick[plain], pick[bobs], approve])
    assert sent.status == 200 and 'id="bulk-set-aside"' in sent.text()
    assert "you may not answer it" in sent.text()
    assert [e["principal"] for e in resumed(d, plain)] == ["alice"]
    assert resumed(d, bobs) == [] and d.is_open(bobs, "int-1")


def test_the_same_bulk_form_sent_twice_at_once_answers_each_question_once(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    tag = f"twice-{uuid.uuid4().hex[:6]}"
    sessions = [f"{tag}-{n}" for n in range(3)]
    d.ask_many([(session, "pay shop: staples") for session in sessions])
    page = browsers.signed_in("alice", "/")
    csrf = page.locator("input[name=csrf]").first.get_attribute("value") or ""
    fields = [("csrf", csrf), ("answer_id", f"form-{tag}"), ("decision", "approve"),
              *[("pick", bulk.token_of(Pick(s, "int-1"))) for s in sessions]]
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    # both posts find the questions open, so both send: the idempotency keys make the second
    # send of each answer a duplicate, never a second answer
    with httpx.Client(base_url=d.url, cookies=cookies, timeout=30) as web, \
            ThreadPoolExecutor(2) as pool:
        body = urlencode(fields)
        form_type = {"Content-Type": "application/x-www-form-urlencoded"}
        replies = list(pool.map(lambda _: web.post("/bulk/answer", content=body, headers=form_type),
                                range(2)))
    assert [r.status_code for r in replies] == [200, 200]
    for session in sessions:
        assert [e["principal"] for e in resumed(d, session)] == ["alice"]
        ignored = [e["code"] for e in d.events(session) if e["type"] == "input.ignored"]
        assert set(ignored) <= {"duplicate"}, ignored  # never already_resumed: no second answer


