"""templates/_form.html rendered with Jinja2 directly: the fields' names, types, constraints and
options, errors beside their fields, escaping, re-filling after an error; what a browser would
submit from it reads back to the value it showed. static/forms.js in Debian's chromium:
tests/e2e/test_forms_browser.py."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jinja2
import pytest

from parley.web.forms import AnswerForm, answer_form, read_answer

WEB = Path(__file__).resolve().parents[2] / "parley" / "web"
VOID = {"input", "br", "hr", "img", "meta", "link", "source", "wbr", "area", "base", "col", "embed", "param",
        "track"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str | None]
    parent: "Element | None" = None
    children: list["Element"] = field(default_factory=list)
    text: str = ""
    #: inside a <template> (not part of the form until forms.js clones it)
    inert: bool = False

    def walk(self) -> Iterator["Element"]:
        for child in self.children:
            yield child
            yield from child.walk()

    def all(self, tag: str | None = None, **attrs: str) -> list["Element"]:
        return [e for e in self.walk() if (tag is None or e.tag == tag) and not e.inert
                and all(e.attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]

    def one(self, tag: str | None = None, **attrs: str) -> "Element":
        found = self.all(tag, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]

    def full_text(self) -> str:
        return self.text + "".join(c.full_text() for c in self.children)


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.at = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs), self.at, inert=self.at.inert or self.at.tag == "template")
        self.at.children.append(element)
        if tag not in VOID:
            self.at = element

    def handle_endtag(self, tag: str) -> None:
        assert self.at.tag == tag, f"</{tag}> closes <{self.at.tag}>"
        assert self.at.parent is not None
        self.at = self.at.parent

    def handle_data(self, data: str) -> None:
        self.at.text += data


ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(WEB / "templates")), autoescape=True,
                         undefined=jinja2.StrictUndefined)


def render(form: AnswerForm, values: dict[str, Any] | None = None,
           errors: dict[str, str] | None = None) -> str:
    macro = ENV.from_string('{% from "_form.html" import answer_fields %}'
                            "{{ answer_fields(form, values, errors) }}")
    return macro.render(form=form, values=values or {}, errors=errors or {})


def parse(html: str) -> Element:
    builder = TreeBuilder()
    builder.feed(html)
    builder.close()
    assert builder.at is builder.root, "every element is closed"
    return builder.root


def page(schema: dict[str, Any], values: dict[str, Any] | None = None,
         errors: dict[str, str] | None = None) -> Element:
    return parse(render(answer_form(schema), values, errors))


def submitted(root: Element) -> list[tuple[str, str]]:
    """The pairs a browser sends for the form (templates' contents are not part of it)."""
    out: list[tuple[str, str]] = []
    for e in root.walk():
        name = e.attrs.get("name")
        if e.inert or name is None:
            continue
        if e.tag == "input" and e.attrs.get("type") == "checkbox":
            if "checked" in e.attrs:
                out.append((name, e.attrs.get("value") or "on"))
        elif e.tag == "input":
            out.append((name, e.attrs.get("value") or ""))
        elif e.tag == "textarea":
            text = e.text[1:] if e.text.startswith("\n") else e.text  # the parser drops it too
            out.append((name, text))
        elif e.tag == "select":
            options = [o for o in e.all("option")]
            chosen = [o for o in options if "selected" in o.attrs] or options[:1]
            out.append((name, chosen[0].attrs.get("value") or ""))
    return out


def selected(select: Element) -> list[str | None]:
    return [o.attrs["value"] for o in select.all("option") if "selected" in o.attrs]


def obj(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or []}


# --- fields ---------------------------------------------------------------------------------


def test_each_kind_has_its_control_name_and_type() -> None:
    schema = obj(["name", "sure"],
                 name={"type": "string", "minLength": 1, "maxLength": 9, "pattern": "^[a-z]+$"},
                 mail={"type": "string", "format": "email"}, day={"type": "string", "format": "date"},
                 site={"type": "string", "format": "uri"}, note={"type": "string", "maxLength": 1000},
                 n={"type": "integer", "minimum": 1, "maximum": 5}, x={"type": "number"},
                 ok={"type": "boolean"}, sure={"type": "boolean"},
                 meta={"oneOf": [{"type": "string"}, {"type": "integer"}]})
    root = page(schema)
    name = root.one("input", name="answer.name")
    assert name.attrs | {} == {"type": "text", "id": "f-answer.name", "name": "answer.name", "value": "",
                               "minlength": "1", "maxlength": "9", "pattern": r"[\s\S]*(?:^[a-z]+$)[\s\S]*",
                               "required": None}
    assert root.one("input", name="answer.mail").attrs["type"] == "email"
    assert root.one("input", name="answer.day").attrs["type"] == "date"
    assert root.one("input", name="answer.site").attrs["type"] == "url"
    assert root.one("textarea", name="answer.note").attrs["maxlength"] == "1000"
    n = root.one("input", name="answer.n")
    assert (n.attrs["type"], n.attrs["min"], n.attrs["max"], n.attrs["step"]) == ("number", "1", "5", "1")
    assert root.one("input", name="answer.x").attrs["step"] == "any"
    sure = root.one("input", name="answer.sure")  # required: unticked is false
    assert (sure.attrs["type"], sure.attrs["value"]) == ("checkbox", "true")
    # optional: no answer / Yes / No, so it can be answered false
    ok = root.one("select", name="answer.ok")
    assert [(o.attrs["value"], o.full_text()) for o in ok.all("option")] == \
        [("", "—"), ("true", "Yes"), ("false", "No")]
    assert root.all("input", name="answer.ok") == []
    assert "json" in (root.one("textarea", name="answer.meta").attrs["class"] or "")
    # each control has its label
    for control in root.all("input") + root.all("textarea") + root.all("select"):
        assert len(root.all("label", for_=control.attrs["id"] or "")) == 1, control.attrs


def test_required_fields_are_marked_and_the_browser_requires_only_what_may_not_be_left_empty() -> None:
    schema = obj(["name", "ok", "color", "note"], name={"type": "string", "minLength": 1},
                 nick={"type": "string"}, note={"type": "string"},
                 ok={"type": "boolean"}, color={"enum": ["r", "g"]},
                 billing=obj(["city"], city={"type": "string", "minLength": 1}))
    root = page(schema)
    assert "required" in root.one("input", name="answer.name").attrs
    assert "required" not in root.one("input", name="answer.note").attrs  # "" is an answer
    assert "required" not in root.one("input", name="answer.nick").attrs
    assert "required" not in root.one("input", name="answer.ok").attrs  # unticked is false
    assert "required" in root.one("select", name="answer.color").attrs
    assert "required" not in root.one("input", name="answer.billing.city").attrs  # billing is optional
    marked = {e.attrs["data-name"] for e in root.all() if e.attrs.get("data-name")
              and any(c.attrs.get("class") == "required-marker" for c in e.walk()
                      if c.parent is not None and c.parent.parent is e)}
    assert marked == {"answer.name", "answer.color", "answer.note", "answer.billing.city"}


def test_a_select_offers_every_value_as_json_text_after_an_empty_choice() -> None:
    root = page({"enum": ["red", "1", 1, True, None]})
    select = root.one("select", name="answer")
    options = [(o.attrs["value"], o.full_text()) for o in select.all("option")]
    assert options == [("", "—"), ('"red"', "red"), ('"1"', "1"), ("1", "1"), ("true", "true"),
                       ("null", "null")]
    again = page({"enum": ["red", "1", 1, True, None]}, {"answer": "1"})
    chosen = [o.attrs["value"] for o in again.all("option") if "selected" in o.attrs]
    assert chosen == ["1"]


def test_objects_are_fieldsets_with_their_legend_description_and_nested_names() -> None:
    schema = obj(to=dict(obj(["city"], city={"type": "string", "description": "The city"}), title="Ship to"))
    root = page(schema)
    fieldset = root.one("fieldset", data_name="answer.to")
    assert fieldset.all("legend")[0].full_text().strip() == "Ship to"
    city = fieldset.one("input", name="answer.to.city")
    assert city.attrs["aria-describedby"] == "d-answer.to.city"
    assert root.one("p", id="d-answer.to.city").full_text() == "The city"


def test_arrays_render_their_items_with_renumberable_names_and_a_template_for_new_ones() -> None:
    schema = obj(lines={"type": "array", "minItems": 2, "maxItems": 5,
                        "items": obj(sku={"type": "string"},
                                     tags={"type": "array", "items": {"type": "string"}})})
    root = page(schema)
    array = root.one("fieldset", data_name="answer.lines")
    assert (array.attrs["data-min-items"], array.attrs["data-max-items"]) == ("2", "5")
    assert [li.attrs["data-name"] for li in array.all("li", **{"class": "array-item"})
            if li.parent is not None and li.parent.parent is array] == ["answer.lines.0", "answer.lines.1"]
    assert {e.attrs["name"] for e in root.all("input")} == {
        "answer.lines.0.sku", "answer.lines.0.tags.0", "answer.lines.1.sku", "answer.lines.1.tags.0"}
    template = next(e for e in array.children if e.tag == "template")
    assert {e.attrs["name"] for e in template.walk() if e.tag == "input"} == {
        "answer.lines.__new__.sku", "answer.lines.__new__.tags.0", "answer.lines.__new__.tags.__new__"}
    # without forms.js the buttons do nothing: they are hidden until it shows them
    buttons = [e for e in root.walk() if e.tag == "button"]
    assert buttons and all("hidden" in b.attrs and b.attrs["type"] == "button" for b in buttons)


def test_an_array_shows_its_submitted_items_or_one_empty_item_or_none_when_it_may_have_none() -> None:
    schema = obj(tags={"type": "array", "items": {"type": "string"}})
    assert [e.attrs["name"] for e in page(schema).all("input")] == ["answer.tags.0"]
    again = page(schema, {"answer.tags": ["answer.tags.0", "answer.tags.3"], "answer.tags.3": "x"})
    assert [(e.attrs["name"], e.attrs["value"]) for e in again.all("input")] == \
        [("answer.tags.0", ""), ("answer.tags.3", "x")]
    assert [e.full_text() for e in again.all("span", **{"class": "item-number"})] == ["1", "2"]
    never = obj(tags={"type": "array", "items": {"type": "string"}, "maxItems": 0})
    assert page(never).all("input") == []


def test_ids_are_unique() -> None:
    schema = obj(["a"], a={"type": "string", "description": "d"}, b=obj(c={"type": "integer"}),
                 d={"type": "array", "items": obj(e={"type": "boolean"})})
    root = page(schema, {}, {"answer.a": "bad", "answer.b.c": "bad"})
    ids = [e.attrs["id"] for e in root.all() if e.attrs.get("id")]
    assert len(ids) == len(set(ids)) and len(ids) > 5


# --- errors and values ---------------------------------------------------------------------


def test_errors_are_shown_beside_their_fields() -> None:
    schema = obj(["n"], n={"type": "integer"}, to=obj(city={"type": "string"}),
                 tags={"type": "array", "items": {"type": "string"}})
    errors = {"answer.n": "not a number", "answer.to.city": "required", "answer.tags": "too short",
              "answer.tags.0": "'a' is too short", "answer": "{} is bad"}
    root = page(schema, {"answer.n": "x", "answer.tags": ["answer.tags.0"], "answer.tags.0": "a"}, errors)
    for name, message in errors.items():
        shown = root.one("p", data_for=name)
        assert shown.attrs["class"] == "field-error" and shown.full_text() == message
        # beside the field: inside the wrapper of that very field
        assert shown.parent is not None and shown.parent.attrs.get("data-name") == name
    assert root.one("input", name="answer.n").attrs["aria-invalid"] == "true"
    assert root.one("input", name="answer.n").attrs["aria-describedby"] == "e-answer.n"


def test_labels_values_descriptions_options_and_errors_are_escaped() -> None:
    evil = '"><script>alert(1)</script>'
    schema = obj(**{evil: {"type": "string", "title": evil, "description": evil},
                    "e": {"enum": [evil], "title": "<b>E</b>"}, "t": {"type": "string", "x-multiline": True}})
    html = render(answer_form(schema), {"answer.e": '"x"', "answer.t": "</textarea><script>x</script>"},
                  {"answer.e": evil})
    assert "<script>" not in html and "<b>" not in html
    root = parse(html)
    assert root.all("script") == [] and root.all("b") == []
    assert any(label.full_text().startswith(evil) for label in root.all("label"))
    assert root.one("option", value='"\\"><script>alert(1)</script>"').full_text() == evil
    assert root.one("textarea", name="answer.t").text == "\n</textarea><script>x</script>"
    assert root.one("p", data_for="answer.e").full_text() == evil


def test_a_fresh_form_shows_the_defaults_and_a_submitted_one_what_was_sent() -> None:
    schema = obj(city={"type": "string", "default": "Paris"}, ok={"type": "boolean", "default": True},
                 tags={"type": "array", "items": {"type": "string"}, "default": ["a", "b"]})
    fresh = page(schema)
    assert fresh.one("input", name="answer.city").attrs["value"] == "Paris"
    assert selected(fresh.one("select", name="answer.ok")) == ["true"]
    off = page(obj(ok={"type": "boolean", "default": False}))
    assert selected(off.one("select", name="answer.ok")) == ["false"]
    assert [e.attrs["value"] for e in fresh.all("input", type="text")] == ["Paris", "a", "b"]
    # after an error the choice and the city stay as sent
    result = read_answer(schema, [("answer.city", "Lyon"), ("answer.ok", "false"), ("answer.tags.0", "z")])
    again = page(schema, result.values, {"answer.city": "no"})
    assert again.one("input", name="answer.city").attrs["value"] == "Lyon"
    assert selected(again.one("select", name="answer.ok")) == ["false"]
    unanswered = page(schema, read_answer(schema, [("answer.ok", "")]).values, {"answer.city": "no"})
    assert selected(unanswered.one("select", name="answer.ok")) == [""]
    box = obj(["sure"], sure={"type": "boolean", "default": True})
    assert "checked" in page(box).one("input", name="answer.sure").attrs
    assert "checked" not in page(box, {"answer.sure": "false"}, {"answer": "no"}).one(
        "input", name="answer.sure").attrs
    assert [e.attrs["name"] for e in again.all("input", type="text")] == ["answer.city", "answer.tags.0"]


def test_a_textarea_keeps_a_leading_newline() -> None:
    root = page({"type": "string", "x-multiline": True}, {"answer": "\nindented"})
    assert submitted(root) == [("answer", "\nindented")]


def test_what_a_browser_sends_from_a_fresh_form_reads_back_to_its_defaults() -> None:
    value = {"s": "héllo <b>", "n": 3, "x": 0.5, "ok": True, "e": None, "c": 1,
             "o": {"p": "q", "l": [1, 2]},
             "arr": [{"name": "n1", "flags": [True, False]}, {"name": "n2"}],
             "j": {"any": ["thing", None]}}
    schema = obj(["s"], s={"type": "string"}, n={"type": "integer"}, x={"type": "number"},
                 ok={"type": "boolean"}, no={"type": "boolean"}, e={"enum": ["a", None]}, c={"const": 1},
                 o=obj(p={"type": "string"}, l={"type": "array", "items": {"type": "integer"}}),
                 arr={"type": "array", "items": obj(name={"type": "string"},
                                                    flags={"type": "array", "items": {"type": "boolean"}})},
                 j={})
    schema["default"] = value
    result = read_answer(schema, submitted(page(schema)))
    assert result.ok, result.errors
    assert result.value == value


@pytest.mark.parametrize("value", [{"ok": False, "note": ""}, {"ok": True, "note": "x"}, {"note": ""}])
def test_a_false_optional_box_and_an_empty_required_string_read_back_as_shown(value: dict[str, Any]) -> None:
    schema = obj(["note"], ok={"type": "boolean"}, note={"type": "string"})
    schema["default"] = value
    result = read_answer(schema, submitted(page(schema)))
    assert result.ok, result.errors
    assert result.value == value
