"""`parley inbox` in a real browser (issue 20): Debian's chromium, driven by Playwright, signs in
to a running inbox in front of a running deployment and answers questions the way a person
does; what the page says became of an answer is checked against the session's own events.

One deployment and one browser serve the module (tests/e2e/inbox_fixtures.py); every test
raises its own questions in sessions of its own and uses fresh browser contexts. Nothing
sleeps: the tests wait on DOM conditions and on the sessions' events.
"""

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.conftest import wait_for
from tests.e2e.inbox_fixtures import (  # noqa: F401  (fixtures)
    PAGE_SIZE,
    WAIT_MS,
    Browsers,
    InboxDeployment,
    browsers_fixture,
    chromium_fixture,
    inbox_deployment_fixture,
    resumed,
    session_name,
)

# One deployment and one browser for the module: under `pytest -n 2 --dist loadgroup` its tests
# stay on one worker and share them (with plain `-n`, each worker starts its own).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("inbox-browser")]
expect.set_options(timeout=WAIT_MS)


def shows_no_key(page: Page, deployment: InboxDeployment) -> None:
    """The page shows no signing key, password or password hash."""
    leaked = deployment.secrets_in(page.content())
    assert not leaked, f"{page.url} shows {leaked}"


def answers_sent(deployment: InboxDeployment, session: str) -> list[dict[str, Any]]:
    """Every event about an `interrupt.resume` input of `session`: none when nothing was sent."""
    return [e for e in deployment.events(session)
            if (e.get("input") or {}).get("type") == "interrupt.resume"]


def rows(page: Page) -> list[str]:
    return page.locator("table#interrupts tbody tr.interrupt").evaluate_all(
        "rows => rows.map(row => row.dataset.session)")


def list_path(**filters: str) -> str:
    return "/?" + urlencode(filters)


def test_a_wrong_password_is_refused_and_the_right_one_leads_where_you_were_going(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("signin")
    d.ask(session, "pay carol: rent")
    target = d.page_url(session, "int-1")
    page = browsers.anonymous()
    page.goto(target)
    # not signed in: sent to the sign-in form, remembering where to
    where = urlsplit(page.url)
    assert (where.path, parse_qs(where.query)) == ("/signin", {"next": [target]}), page.url
    for principal, secret in [("alice", "not-her-password"), ("mallory", d.passwords["alice"]),
                              ("alice", d.passwords["bob"])]:
        page.fill("form#signin input[name=principal]", principal)
        page.fill("form#signin input[name=secret]", secret)
        with page.expect_navigation() as refused:
            page.click("form#signin button[type=submit]")
        response = refused.value
        assert response is not None and response.status == 401
        expect(page.locator("#signin-error")).to_be_visible()
        expect(page.locator("form#signin")).to_be_visible()
        assert "/signin" in page.url
        shows_no_key(page, d)
    # still not signed in: the list sends us back to the form
    page.goto("/")
    expect(page.locator("form#signin")).to_be_visible()
    page.goto(target)
    page.fill("form#signin input[name=principal]", "alice")
    page.fill("form#signin input[name=secret]", d.passwords["alice"])
    with page.expect_navigation():
        page.click("form#signin button[type=submit]")
    assert page.url == d.url + target
    expect(page.locator("form#answer")).to_be_visible()
    cookie = next(c for c in page.context.cookies() if c["name"] == "parley_inbox")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"


def test_signing_in_never_sends_you_to_another_site(browsers: Browsers,
                                                   inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    for evil in ["https://evil.example/x", "//evil.example/x"]:
        page = browsers.anonymous()
        page.goto("/signin?" + urlencode({"next": evil}))
        page.fill("form#signin input[name=principal]", "bob")
        page.fill("form#signin input[name=secret]", d.passwords["bob"])
        with page.expect_navigation():
            page.click("form#signin button[type=submit]")
        assert page.url == d.url + "/", f"next={evil} led to {page.url}"


@pytest.mark.parametrize(("decision", "approved"), [("approve", True), ("decline", False)])
def test_approve_or_decline_from_the_list(browsers: Browsers, inbox_deployment: InboxDeployment,
                                          decision: str, approved: bool) -> None:
    d = inbox_deployment
    session = session_name(decision)
    raised = d.ask(session, "pay carol: rent for March")
    page = browsers.signed_in("alice", list_path(session=session))
    row = page.locator(f'tr.interrupt[data-session="{session}"]')
    expect(row).to_have_count(1)
    assert row.get_attribute("data-interrupt") == raised["interrupt_id"]
    assert int(row.get_attribute("data-raised-at") or 0) == raised["at"]
    expect(row.locator(".reason")).to_have_text(re.compile(r"\bconfirm\b"))
    expect(row.locator(".session")).to_contain_text(session)
    expect(row.locator(".age")).not_to_be_empty()
    expect(row.locator(".read-only")).to_have_count(0)
    expect(row.locator(".countdown")).to_have_count(0)  # no deadline
    shows_no_key(page, d)

    row.locator("a.open").click()
    expect(page).to_have_url(re.compile(r"/interrupt\?"))
    expect(page.locator("#request")).to_contain_text("Make this payment?")
    expect(page.locator("#request")).to_contain_text("rent for March")
    expect(page.locator(".reason").first).to_contain_text("confirm")
    expect(page.locator("form#answer input[name=csrf]")).to_have_count(1)
    expect(page.locator("button#send")).to_have_count(0)
    shows_no_key(page, d)
    with page.expect_navigation():
        page.click(f"form#answer button[name=decision][value={decision}]")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "delivered")
    shows_no_key(page, d)

    (event,) = resumed(d, session)
    assert (event["payload"], event["principal"], event["delivered"]) == (
        {"approved": approved}, "alice", True)
    # the app got the answer: the call is settled as it says, and the turn goes on to its end
    events = wait_for(d.client, session, lambda e: e["type"] == "turn.completed")
    tool_messages = [e["message"]["content"] for e in events
                     if e["type"] == "message.created" and e["message"]["role"] == "tool"]
    assert tool_messages == ["paid" if approved else "declined"]
    # the question is not open any more: its page says so and offers no form
    page.goto(d.page_url(session, raised["interrupt_id"]))
    expect(page.locator("#not-open")).to_be_visible()
    expect(page.locator("form#answer")).to_have_count(0)


def test_an_answer_on_a_branch_the_user_left_is_recorded_not_delivered(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("branch")
    raised = d.ask(session, "pay ivy: the fee")
    # the user starts over (a new root): the question's branch is not the active one any more
    d.send(session, {"type": "message.create", "content": "never mind, hello", "parent_id": None})
    wait_for(d.client, session, lambda e: e["type"] == "turn.completed")
    page = browsers.signed_in("bob", d.page_url(session, raised["interrupt_id"]))
    # the conversation shown is the question's own branch
    messages = page.locator("ol#conversation li.message")
    expect(messages).to_have_count(2)
    expect(messages.first).to_contain_text("pay ivy: the fee")
    expect(page.locator("ol#conversation")).not_to_contain_text("never mind")
    with page.expect_navigation():
        page.click("form#answer button[name=decision][value=approve]")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "not_delivered")
    expect(page.locator("#outcome")).to_contain_text("branch")
    (event,) = resumed(d, session)
    assert (event["delivered"], event["principal"]) == (False, "bob")


def fill_payment(page: Page, amount: str) -> None:
    """Fill the fields of tests.apps.inbox_app's PAYMENT_SCHEMA (the IBAN left empty), with
    `amount` as typed."""
    page.fill('[name="answer.amount"]', amount)
    page.select_option('select[name="answer.currency"]', label="EUR")  # its value is JSON: "EUR"
    page.select_option('select[name="answer.urgent"]', label="Yes")  # optional: Yes / No / no answer
    page.fill('[name="answer.note"]', "invoice 7")
    page.fill('[name="answer.payee.name"]', "Dan")
    page.fill('[name="answer.payee.iban"]', "")
    page.fill('[name="answer.tags.0"]', "rent")  # an array shows one empty item to start with


def test_a_schema_form_is_refused_beside_the_field_then_accepted(
        browsers: Browsers, inbox_deployment: InboxDeployment, tmp_path: Path) -> None:
    d = inbox_deployment
    session = session_name("form")
    raised = d.ask(session, "pay dan: [form] invoice 7")
    page = browsers.signed_in("alice", d.page_url(session, raised["interrupt_id"]))
    form = page.locator("form#answer")
    expect(form).to_be_visible()
    expect(page.locator(".reason").first).to_contain_text("payment")
    for name in ["answer.amount", "answer.currency", "answer.urgent", "answer.note", "answer.payee.name"]:
        expect(form.locator(f'[name="{name}"]').first).to_be_attached()
    expect(form.locator("button[value=approve], button[value=decline]")).to_have_count(0)
    expect(page.locator("form#answer button#send")).to_be_visible()
    page.screenshot(path=str(tmp_path / "inbox-interrupt.png"), full_page=True)
    shows_no_key(page, d)

    fill_payment(page, "250")
    amount = page.locator('[name="answer.amount"]')
    # The field carries the schema's limit (max=100): the browser marks it invalid...
    assert amount.evaluate("el => el.checkValidity()") is False
    # ...but the server's check is the one that counts (a browser that does not check, a
    # hand-made POST): with the browser's own check off, the page comes back with the error
    # beside the field, and nothing is sent.
    form.evaluate("f => { f.noValidate = true; }")
    with page.expect_navigation() as sent:
        page.click("button#send")
    response = sent.value
    assert response is not None and response.status == 422
    expect(page.locator("#outcome")).to_have_attribute("data-status", "invalid")
    error = page.locator('.field-error[data-for="answer.amount"]')
    expect(error).to_be_visible()
    expect(error).to_contain_text("100")
    # nothing was sent: the engine heard of no answer and the question is still open
    assert answers_sent(d, session) == []
    assert d.is_open(session, raised["interrupt_id"])

    # the form comes back as it was sent
    expect(page.locator('[name="answer.payee.name"]')).to_have_value("Dan")
    fill_payment(page, "50")
    # the array's Add button (static/forms.js) adds items; one left empty is dropped
    add = page.locator('fieldset[data-name="answer.tags"] button.add-item')
    add.click()
    add.click()
    expect(page.locator('[name="answer.tags.2"]')).to_be_visible()
    page.fill('[name="answer.tags.2"]', "march")
    with page.expect_navigation():
        page.click("button#send")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "delivered")
    # one answer reached the engine: had the refused form sent anything, the engine would have
    # said so (inputs are applied in order) before this one
    assert [e["type"] for e in answers_sent(d, session)] == ["interrupt.resumed"]
    (event,) = resumed(d, session)
    answer = event["payload"]
    assert answer == {"amount": 50, "currency": "EUR", "urgent": True, "note": "invoice 7",
                      "payee": {"name": "Dan"}, "tags": ["rent", "march"]}, answer
    assert event["principal"] == "alice" and event["delivered"] is True


def test_two_approvers_answering_at_once_one_is_told_it_was_already_answered(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("race")
    raised = d.ask(session, "pay erin: the deposit")
    path = d.page_url(session, raised["interrupt_id"])
    # Live updates off: a page that heard of the other's answer would disable its buttons
    # before its own click, and the server's side of the race is what this is about.
    pages = {person: browsers.signed_in(person, path, live=False) for person in ("alice", "bob")}
    for page in pages.values():
        expect(page.locator("form#answer button[value=approve]")).to_be_visible()
    # Both press Approve at once: each form is submitted without waiting for its page to load
    # what comes back, so both answers are on their way before either is through.
    for page in pages.values():
        page.evaluate("() => { const form = document.querySelector('form#answer'); "
                      "form.requestSubmit(form.querySelector('button[name=decision][value=approve]')); }")
    for page in pages.values():
        expect(page.locator("#outcome")).to_be_attached()
    outcomes = {person: page.locator("#outcome").get_attribute("data-status") or ""
                for person, page in pages.items()}
    assert sorted(outcomes.values()) == ["already_answered", "delivered"], outcomes
    (event,) = resumed(d, session)
    assert outcomes[event["principal"]] == "delivered"


def test_a_question_raised_while_the_list_is_open_appears_live(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    prefix = session_name("live")
    page = browsers.signed_in("alice", list_path(session=prefix, reason="confirm"))
    expect(page.locator("#empty")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-live", "connected")
    page.evaluate("() => { window.notReloaded = true; }")
    # Questions the page's filters do not show (another session, another reason), then one
    # they do: by the time that one is in, the others have passed through the stream too.
    d.ask(f"other-{prefix}", "pay carol: rent")
    d.ask(f"{prefix}-form", "pay dan: [form] invoice 7")
    raised = d.ask(f"{prefix}-1", "pay erin: the deposit")
    row = page.locator(f'tr.interrupt[data-session="{prefix}-1"]')
    expect(row).to_have_count(1)
    assert rows(page) == [f"{prefix}-1"]
    assert row.get_attribute("data-interrupt") == raised["interrupt_id"]
    expect(row.locator("a.open")).to_have_attribute("href", re.compile(r"/interrupt\?"))
    expect(page.locator("#empty")).to_have_count(0)
    assert page.evaluate("() => window.notReloaded") is True


def test_a_question_answered_elsewhere_leaves_the_list_and_its_page_says_so(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("elsewhere")
    raised = d.ask(session, "pay erin: the deposit")
    page = browsers.signed_in("alice", list_path(session=session))
    row = page.locator(f'tr.interrupt[data-session="{session}"]')
    expect(row).to_have_count(1)
    question = browsers.signed_in("alice", d.page_url(session, raised["interrupt_id"]))
    for opened in (page, question):
        expect(opened.locator("body")).to_have_attribute("data-live", "connected")
        opened.evaluate("() => { window.notReloaded = true; }")
    expect(question.locator("#gone-notice")).to_be_hidden()
    # bob answers with the client, not through this page
    d.client.resume(session, raised["interrupt_id"], {"approved": True}, principal="bob",
                    key=d.keys["bob"], wait=True)
    expect(row).to_have_count(0)
    expect(page.locator("#empty")).to_be_visible()
    expect(question.locator("#gone-notice")).to_be_visible()
    expect(question.locator("form#answer button[value=approve]")).to_be_disabled()
    expect(question.locator("form#answer button[value=decline]")).to_be_disabled()
    for opened in (page, question):
        assert opened.evaluate("() => window.notReloaded") is True


def test_a_deadline_passing_while_the_list_is_open_takes_the_row_away(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("deadline")
    # the list is open (and following) before the question is raised: on a loaded box, a page
    # opened after the raise could come after its 3 s deadline too
    page = browsers.signed_in("alice", list_path(session=session))
    expect(page.locator("body")).to_have_attribute("data-live", "connected")
    page.evaluate("() => { window.notReloaded = true; }")
    raised = d.ask(session, "pay fay: [deadline-3s] the fee")
    row = page.locator(f'tr.interrupt[data-session="{session}"]')
    expect(row).to_have_count(1)
    countdown = row.locator(".deadline span.countdown[data-expires-at]")
    assert int(countdown.get_attribute("data-expires-at") or 0) == raised["at"] + 3000
    expect(row).to_have_count(0)
    assert page.evaluate("() => window.notReloaded") is True
    (event,) = resumed(d, session)
    assert event["timed_out"] is True


def test_a_question_for_someone_else_is_read_only(browsers: Browsers,
                                                  inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("bobs")
    raised = d.ask(session, "pay gus: [bob-only] the invoice")
    path = d.page_url(session, raised["interrupt_id"])
    alice = browsers.signed_in("alice", list_path(session=session))
    row = alice.locator(f'tr.interrupt[data-session="{session}"]')
    expect(row.locator(".read-only")).to_be_visible()
    # "answerable by me": not hers
    alice.goto(list_path(session=session, mine="1"))
    expect(alice.locator("#empty")).to_be_visible()
    expect(alice.locator("tr.interrupt")).to_have_count(0)
    alice.goto(path)
    expect(alice.locator("#read-only")).to_be_visible()
    expect(alice.locator("#request")).to_contain_text("Make this payment?")
    expect(alice.locator("form#answer")).to_have_count(0)
    expect(alice.locator("button[name=decision]")).to_have_count(0)
    # bob may: it is his in his list, and his answer is delivered
    bob = browsers.signed_in("bob", list_path(session=session, mine="1"))
    expect(bob.locator(f'tr.interrupt[data-session="{session}"]')).to_have_count(1)
    expect(bob.locator("tr.interrupt .read-only")).to_have_count(0)
    bob.goto(path)
    expect(bob.locator("#read-only")).to_have_count(0)
    with bob.expect_navigation():
        bob.click("form#answer button[name=decision][value=approve]")
    expect(bob.locator("#outcome")).to_have_attribute("data-status", "delivered")
    (event,) = resumed(d, session)
    assert event["principal"] == "bob"


def test_the_conversation_leading_to_a_question_shows_its_tool_call(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("talk")
    raised = d.ask(session, "look up the invoice")
    page = browsers.signed_in("alice", d.page_url(session, raised["interrupt_id"]))
    messages = page.locator("ol#conversation li.message")
    expect(messages).to_have_count(3)
    assert messages.evaluate_all("items => items.map(m => m.dataset.role)") == ["user", "assistant", "tool"]
    expect(messages.nth(0)).to_contain_text("look up the invoice")
    expect(messages.nth(1)).to_contain_text("lookup")  # the tool call: its name and arguments
    expect(messages.nth(1)).to_contain_text("the invoice")
    expect(messages.nth(2)).to_contain_text("found the invoice")
    expect(page.locator("#request")).to_contain_text("Is this lookup right?")
    expect(page.locator(".reason").first).to_contain_text("review")


def test_the_list_in_oldest_and_newest_order(browsers: Browsers, inbox_deployment: InboxDeployment,
                                             tmp_path: Path) -> None:
    d = inbox_deployment
    prefix = session_name("order")
    asked = [(f"{prefix}-1", "pay carol: rent for March [deadline-1h]"),
             (f"{prefix}-2", "pay dan: [form] invoice 7"),
             (f"{prefix}-3", "pay gus: [bob-only] the audit"),
             (f"{prefix}-4", "look up the invoice")]
    for session, text in asked:  # one after the other: their raise times are in this order
        d.ask(session, text)
    sessions = [session for session, _text in asked]
    # oldest first, in pages of PAGE_SIZE (3) rows
    page = browsers.signed_in("alice", list_path(session=prefix, order="oldest"))
    expect(page.locator("tr.interrupt")).to_have_count(PAGE_SIZE)
    assert rows(page) == sessions[:3]
    raised_at = page.locator("tr.interrupt").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.raisedAt))")
    assert raised_at == sorted(raised_at)
    reasons = page.locator("tr.interrupt .reason").all_inner_texts()  # then a read-only badge
    assert [r.split()[0] for r in reasons] == ["confirm", "payment", "confirm"]
    expect(page.locator("tr.interrupt .read-only")).to_have_count(1)
    expect(page.locator(f'tr.interrupt[data-session="{sessions[2]}"] .read-only')).to_be_visible()
    # the deadline an hour ahead counts down in the browser
    expect(page.locator("tr.interrupt .countdown")).to_have_count(1)
    countdown = page.locator(f'tr.interrupt[data-session="{sessions[0]}"] .deadline span.countdown')
    expect(countdown).to_have_text(re.compile(r"59m"))
    shown = countdown.inner_text()
    expect(countdown).not_to_have_text(shown)  # it ticks
    # the filters' form shows what the list is filtered by
    expect(page.locator('form#filters [name="session"]')).to_have_value(prefix)
    expect(page.locator('form#filters [name="order"]')).to_have_value("oldest")
    expect(page.locator("body")).to_have_attribute("data-live", "connected")
    page.screenshot(path=str(tmp_path / "inbox-list.png"), full_page=True)
    with page.expect_navigation():
        page.click("a#next-page")
    assert rows(page) == sessions[3:]
    expect(page.locator("a#next-page")).to_have_count(0)
    # newest first
    page.goto(list_path(session=prefix, order="newest"))
    expect(page.locator("tr.interrupt")).to_have_count(PAGE_SIZE)
    assert rows(page) == sessions[::-1][:3]
    with page.expect_navigation():
        page.click("a#next-page")
    assert rows(page) == sessions[:1]
    expect(page.locator("a#next-page")).to_have_count(0)


def test_a_post_without_the_csrf_token_is_refused_and_sends_nothing(
        browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("csrf")
    raised = d.ask(session, "pay hal: the bill")
    page = browsers.signed_in("alice", d.page_url(session, raised["interrupt_id"]))
    token = page.locator("form#answer input[name=csrf]").get_attribute("value")
    assert token
    answer = {"session": session, "interrupt_id": raised["interrupt_id"], "decision": "approve"}
    # signed in (the context's cookie goes along), but no token, or a wrong one
    for form in [answer, {**answer, "csrf": ""}, {**answer, "csrf": token[::-1]}]:
        response = page.request.post("/interrupt/answer", form=form, max_redirects=0)
        assert response.status == 403, form
    response = page.request.post("/signout", form={}, max_redirects=0)
    assert response.status == 403
    assert answers_sent(d, session) == []
    assert d.is_open(session, raised["interrupt_id"])
    # still signed in (the refused sign-out did nothing), and the token does work
    page.reload()
    with page.expect_navigation():
        page.click("form#answer button[name=decision][value=approve]")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "delivered")
    # had a refused POST sent anything, the engine would have said so before this answer
    assert [e["type"] for e in answers_sent(d, session)] == ["interrupt.resumed"]


def test_no_page_shows_a_signing_key(browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = session_name("keys")
    raised = d.ask(session, "pay dan: [form] invoice 7")
    page = browsers.anonymous()
    page.goto("/signin")
    shows_no_key(page, d)
    for person in ("alice", "bob"):
        page = browsers.signed_in(person)
        for path in ["/", list_path(session=session), d.page_url(session, raised["interrupt_id"])]:
            response = page.goto(path)
            assert response is not None and response.ok, path
            shows_no_key(page, d)
        for path in ["/healthz", "/metrics", "/static/inbox.js", "/static/forms.js"]:
            reply = page.request.get(path)
            assert reply.ok and not d.secrets_in(reply.text()), path
