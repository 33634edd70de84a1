"""static/forms.js in Debian's chromium: adding, removing and renumbering array items of a form
rendered from templates/_form.html, and what the browser then submits reading back to the
value it showed (the template's own checks, without a browser: tests/unit/test_form_template.py)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.web.forms import answer_form, read_answer
from tests.unit.test_form_template import obj, render

pytestmark = pytest.mark.e2e

WEB = Path(__file__).resolve().parents[2] / "parley" / "web"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield chromium
        chromium.close()


def test_forms_js_adds_removes_and_renumbers_items_in_a_browser(browser: Any) -> None:
    schema = obj(lines={"type": "array", "maxItems": 3,
                        "items": obj(["sku"], sku={"type": "string"},
                                     tags={"type": "array", "items": {"type": "string"}})})
    form = answer_form(schema)
    tab = browser.new_page()
    tab.set_default_timeout(5000)
    try:
        tab.set_content(f'<form id="answer">{render(form)}</form>')
        tab.add_script_tag(path=str(WEB / "static" / "forms.js"))
        add = tab.locator('fieldset[data-name="answer.lines"] > button.add-item')
        assert add.is_visible()
        tab.fill('[name="answer.lines.0.sku"]', "first")
        add.click()
        add.click()
        assert add.is_disabled()  # maxItems 3
        tab.fill('[name="answer.lines.1.sku"]', "second")
        tab.fill('[name="answer.lines.2.sku"]', "third")
        # a nested array inside an added item works too
        tab.locator('fieldset[data-name="answer.lines.2.tags"] > button.add-item').click()
        tab.fill('[name="answer.lines.2.tags.0"]', "t0")
        tab.fill('[name="answer.lines.2.tags.1"]', "t1")
        # remove the first item: the others move up, names, ids and labels with them
        tab.locator('li[data-name="answer.lines.0"] > button.remove-item').click()
        assert not add.is_disabled()
        names = tab.eval_on_selector_all("#answer [name]", "els => els.map(e => e.name)")
        assert names == ["answer.lines.0.sku", "answer.lines.0.tags.0",
                         "answer.lines.1.sku", "answer.lines.1.tags.0", "answer.lines.1.tags.1"]
        assert tab.inner_text('label[for="f-answer.lines.1.tags.1"] .item-number') == "2"
        assert tab.inner_text('li[data-name="answer.lines.1"] .item-number') == "2"
        sent = tab.evaluate("() => Array.from(new FormData(document.getElementById('answer')).entries())")
        result = read_answer(schema, [(name, value) for name, value in sent])
        assert result.ok, result.errors
        assert result.value == {"lines": [{"sku": "second"}, {"sku": "third", "tags": ["t0", "t1"]}]}
    finally:
        tab.close()


def test_an_optional_box_answered_no_and_an_empty_required_text_are_sent_in_a_browser(browser: Any) -> None:
    schema = obj(["note"], notify_customer={"type": "boolean", "default": True}, note={"type": "string"})
    tab = browser.new_page()
    tab.set_default_timeout(5000)
    try:
        tab.set_content(f'<form id="answer">{render(answer_form(schema))}</form>')
        tab.add_script_tag(path=str(WEB / "static" / "forms.js"))
        tab.select_option('[name="answer.notify_customer"]', label="No")
        # the browser lets the empty required text through (no `required` attribute)
        assert tab.evaluate("() => document.getElementById('answer').checkValidity()") is True
        sent = tab.evaluate("() => Array.from(new FormData(document.getElementById('answer')).entries())")
        result = read_answer(schema, [(name, value) for name, value in sent])
        assert (result.value, result.errors) == ({"notify_customer": False, "note": ""}, {})
        tab.select_option('[name="answer.notify_customer"]', label="—")
        sent = tab.evaluate("() => Array.from(new FormData(document.getElementById('answer')).entries())")
        assert read_answer(schema, [(name, value) for name, value in sent]).value == {"note": ""}
    finally:
        tab.close()
