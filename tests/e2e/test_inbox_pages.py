"""The inbox's every page at a phone's width and a desk's (issue 34), in Debian's chromium driven
by Playwright: no sideways scroll, and no serious or critical finding of axe-core (npm, pinned in
tests/browser/js) injected into each page, the pages that say no included; and 360 px, the
narrowest the list is made for.

With PARLEY_SCREENSHOTS=<folder> (`make screenshots`), each page is also saved there as
`<page>-<width>.png`: docs/screenshots/ holds the committed ones. A module of its own (its own
deployment, on its own test process), so that it runs beside tests/e2e/test_inbox_day.py.
"""

import uuid
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from parley.web import bulk
from parley.web.bulk import Pick
from tests.e2e.inbox_fixtures import (  # noqa: F401  (fixtures)
    LONG_NOTE,
    WIDTHS,
    Browsers,
    InboxDeployment,
    browsers_fixture,
    checked,
    chromium_fixture,
    fill_payment,
    fits,
    inbox_deployment_fixture,
    listed,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("inbox-pages")]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_screen_and_axe_finds_nothing_serious(
        browsers: Browsers, inbox_deployment: InboxDeployment, width: int) -> None:
    d = inbox_deployment
    tag = f"look{width}-{uuid.uuid4().hex[:4]}"
    # a long session id and a long unbroken payload value: the rows must still fit
    sessions = [f"{tag}-{n}-{'a-rather-long-session-name' * 2}" for n in range(3)]
    form, bobs, other, plain = f"{tag}-form", f"{tag}-bob", f"{tag}-other", f"{tag}-plain"
    *_, raised, _bobs, _other, _plain = d.ask_many([
        *[(s, "pay acme-holdings-international: " + "Z" * 90) for s in sessions],
        (form, "pay dan: [form] invoice 7"), (bobs, "pay erin: [bob-only] toner"),
        (other, "pay dan: [form] invoice 9"), (plain, "pay shop: pens")])

    anonymous = browsers.anonymous(width=width)
    anonymous.goto("/signin")
    checked(anonymous, "signin", width)
    anonymous.fill("form#signin input[name=principal]", "alice")
    anonymous.fill("form#signin input[name=secret]", "wrong")
    with anonymous.expect_navigation():
        anonymous.click("form#signin button[type=submit]")
    checked(anonymous, "signin-refused", width)

    page = browsers.signed_in("alice", "/?" + urlencode({"session": tag}), width=width)
    assert listed(page) == sessions  # by session id: the form's question is on the next page
    checked(page, "list", width)

    page.goto(d.page_url(form, raised["interrupt_id"]))
    checked(page, "question", width)
    # a browser that does not hold the field to its maxlength (or a pasted value): the server's
    # check refuses it beside the field
    page.locator('[name="answer.note"]').evaluate("el => el.removeAttribute('maxlength')")
    fill_payment(page, LONG_NOTE)
    page.locator("form#answer").evaluate("f => { f.noValidate = true; }")
    with page.expect_navigation():
        page.click("button#send")
    expect(page.locator('.field-error[data-for="answer.note"]')).to_be_visible()
    checked(page, "question-refused", width)

    page.goto("/?" + urlencode({"session": tag}))
    for session in sessions:
        page.locator(f'tr.interrupt[data-session="{session}"] input[name=pick]').check()
    with page.expect_navigation():
        page.click("#answer-selected")
    checked(page, "bulk", width)
    with page.expect_navigation():
        page.click("form#bulk-answer button[value=approve]")
    expect(page.locator("#bulk-results tr.bulk-result")).to_have_count(3)
    checked(page, "bulk-sent", width)

    page.goto(d.page_url(form, raised["interrupt_id"]))
    fill_payment(page, "fine")
    with page.expect_navigation():
        page.click("button#send")
    expect(page.locator("#outcome")).to_have_attribute("data-status", "delivered")
    checked(page, "answered", width)

    page.goto("/history?" + urlencode({"session": sessions[0]}))
    checked(page, "history-session", width)
    page.goto("/history?" + urlencode({"principal": "alice"}))
    checked(page, "history-approver", width)

    # the pages that say no: a bad filter, a bad history query, questions that differ, ones
    # already answered, one alice may only read, one that is not open
    page.goto("/?order=sideways")
    checked(page, "list-error", width)
    page.goto("/history")
    checked(page, "history-error", width)
    page.goto("/bulk?" + urlencode([("pick", bulk.token_of(Pick(s, "int-1"))) for s in (bobs, form)]))
    checked(page, "bulk-none", width)
    page.goto("/bulk?" + urlencode([("pick", bulk.token_of(Pick(s, "int-1"))) for s in (other, bobs)]))
    expect(page.locator("form#bulk-answer")).to_have_count(1)
    page.goto("/bulk?" + urlencode([("pick", bulk.token_of(Pick(s, "int-1"))) for s in (other, plain)]))
    expect(page.locator("#bulk-groups")).to_be_visible()
    checked(page, "bulk-groups", width)
    page.goto(d.page_url(bobs, "int-1"))
    expect(page.locator("#read-only")).to_be_visible()
    checked(page, "question-read-only", width)
    page.goto(d.page_url(form, "int-1"))  # answered above
    expect(page.locator("#not-open")).to_be_visible()
    checked(page, "question-not-open", width)


def test_at_360_px_the_list_and_a_question_fit(browsers: Browsers, inbox_deployment: InboxDeployment) -> None:
    d = inbox_deployment
    session = f"narrow-{uuid.uuid4().hex[:6]}-{'x' * 60}"
    raised = d.ask(session, "pay someone-with-a-very-long-name-indeed: " + "W" * 120)
    page = browsers.signed_in("bob", "/?" + urlencode({"session": session}), width=360)
    expect(page.locator("table#interrupts tbody tr.interrupt")).to_have_count(1)
    fits(page)
    page.goto(d.page_url(session, raised["interrupt_id"]))
    fits(page)
