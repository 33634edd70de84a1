"""The answer form generated from a response_schema (parley/web/forms/): which field each
schema becomes, how a submitted form is read back (coercion, empty fields, arrays), where each
error goes, and that hostile input gets errors, never an exception or a huge allocation."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.web.forms import (
    APPROVE,
    DECLINE,
    MAX_ARRAY_ITEMS,
    ROOT,
    AnswerForm,
    FieldKind,
    FormField,
    answer_form,
    field_of_path,
    json_text,
    read_answer,
)


def root_of(schema: dict[str, Any]) -> FormField:
    root = answer_form(schema).root
    assert root is not None
    return root


def child(form_field: FormField, key: str) -> FormField:
    return next(c for c in form_field.children if c.key == key)


def obj(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def pairs(initial: dict[str, Any]) -> list[tuple[str, str]]:
    """A fresh form's values as the browser would send them (array item lists are not fields)."""
    return [(name, value) for name, value in initial.items() if isinstance(value, str)]


# --- the fields -----------------------------------------------------------------------------


def test_no_schema_is_approve_or_decline():
    assert answer_form(None) == AnswerForm(None)
    assert (APPROVE, DECLINE) == ({"approved": True}, {"approved": False})


@pytest.mark.parametrize(("schema", "input_type", "multiline"), [
    ({"type": "string"}, "text", False),
    ({"type": "string", "format": "email"}, "email", False),
    ({"type": "string", "format": "date"}, "date", False),
    ({"type": "string", "format": "uri"}, "url", False),
    ({"type": "string", "format": "date-time"}, "text", False),  # datetime-local drops the zone
    ({"type": "string", "maxLength": 201}, "text", True),
    ({"type": "string", "maxLength": 200}, "text", False),
    ({"type": "string", "x-multiline": True}, "text", True),
])
def test_strings_are_inputs_of_their_format_or_textareas_when_long(schema, input_type, multiline):
    field = root_of(schema)
    assert (field.kind, field.input_type, field.multiline) == (FieldKind.STRING, input_type, multiline)


def test_string_constraints_become_html_attributes_and_a_pattern_matches_anywhere_as_in_json_schema():
    field = root_of({"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^a"})
    assert field.attrs == {"minlength": "2", "maxlength": "5", "pattern": r"[\s\S]*(?:^a)[\s\S]*"}
    assert "pattern" not in root_of({"type": "string", "pattern": "a", "x-multiline": True}).attrs


def test_numbers_get_min_max_and_a_step_that_allows_what_the_schema_allows():
    number = root_of({"type": "number", "minimum": 0, "maximum": 2.5})
    assert (number.kind, number.input_type) == (FieldKind.NUMBER, "number")
    assert number.attrs == {"min": "0", "max": "2.5", "step": "any"}  # HTML's default step 1 refuses 0.5
    integer = root_of({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})
    assert (integer.kind, integer.attrs) == (FieldKind.INTEGER, {"min": "1", "max": "9", "step": "1"})
    assert root_of({"type": "number", "multipleOf": 0.25}).attrs == {"step": "0.25"}
    # the browser counts steps from min: 5s from 3 would be 3, 8, 13
    assert root_of({"type": "integer", "multipleOf": 5, "minimum": 3}).attrs == {"min": "3", "step": "1"}
    assert root_of({"type": "integer", "multipleOf": 5, "minimum": 10}).attrs == {"min": "10", "step": "5"}


def test_enums_of_any_json_values_have_their_json_text_as_option_values():
    field = root_of({"enum": ["red", "1", 1, True, None, {"a": [1]}]})
    assert field.kind is FieldKind.ENUM
    assert field.options == ("red", "1", 1, True, None, {"a": [1]})
    assert field.option_values == ('"red"', '"1"', "1", "true", "null", '{"a":[1]}')
    assert field.option_labels == ("red", "1", "1", "true", "null", '{"a":[1]}')
    const = root_of({"const": "yes"})
    assert (const.kind, const.options) == (FieldKind.ENUM, ("yes",))


def test_a_one_of_of_consts_is_a_select_labelled_by_the_titles():
    field = root_of({"oneOf": [{"const": "p1", "title": "Urgent"}, {"const": "p2"}]})
    assert (field.kind, field.options) == (FieldKind.ENUM, ("p1", "p2"))
    assert field.option_labels == ("Urgent", "p2")


@pytest.mark.parametrize("schema", [
    {},
    True,
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"anyOf": [{"type": "string"}]},
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"type": ["string", "null"]},
    {"type": "null"},
    {"type": "object"},  # no properties: any object, written as JSON
    {"type": "array"},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": [{"required": ["a"]}]},
])
def test_anything_else_is_a_json_text_area(schema):
    assert root_of(schema).kind is FieldKind.JSON


def test_objects_keep_the_schemas_order_labels_descriptions_and_required_marks():
    schema = obj(["due_date"], due_date={"type": "string", "description": "when"},
                 dueTime={"type": "string"}, city={"type": "string", "title": "Town"})
    root = root_of(schema)
    assert root.kind is FieldKind.OBJECT
    assert [c.key for c in root.children] == ["due_date", "dueTime", "city"]
    assert [c.label for c in root.children] == ["Due date", "Due time", "Town"]
    assert [c.name for c in root.children] == ["answer.due_date", "answer.dueTime", "answer.city"]
    assert [c.path for c in root.children] == ["$.due_date", "$.dueTime", "$.city"]
    assert child(root, "due_date").description == "when"
    assert [c.required for c in root.children] == [True, False, False]
    assert root_of({"type": "string", "title": "Reason"}).label == "Reason"
    assert root_of({"type": "string"}).label == "Answer"


def test_the_browser_requires_a_field_only_when_nothing_around_it_may_be_left_empty():
    schema = obj(["name", "shipping", "ok", "lines", "note"],
                 name={"type": "string", "minLength": 1},
                 shipping=obj(["city"], city={"type": "string", "minLength": 1}),
                 billing=obj(["city"], city={"type": "string", "minLength": 1}),
                 note={"type": "string"},
                 ok={"type": "boolean"},
                 lines={"type": "array", "items": obj(["sku"], sku={"type": "string"})})
    root = root_of(schema)
    assert child(root, "name").html_required
    assert child(child(root, "shipping"), "city").html_required
    # a required string without minLength may be "": the browser must let it be sent empty
    assert child(root, "note").required and not child(root, "note").html_required
    # an optional object may be left empty as a whole
    assert child(child(root, "billing"), "city").required
    assert not child(child(root, "billing"), "city").html_required
    # a required box would have to be ticked: unticked is false instead
    assert not child(root, "ok").html_required
    item = child(root, "lines").item
    assert item is not None and not child(item, "sku").html_required  # an empty item is dropped


def test_arrays_have_one_item_field_named_with_index_zero():
    field = root_of({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4})
    assert (field.kind, field.min_items, field.max_items) == (FieldKind.ARRAY, 1, 4)
    assert field.item is not None
    assert (field.item.name, field.item.path, field.item.kind) == ("answer.0", "$[0]", FieldKind.STRING)
    # an item that is a box would vanish when unticked: yes / no instead
    booleans = root_of({"type": "array", "items": {"type": "boolean"}}).item
    assert booleans is not None and booleans.kind is FieldKind.ENUM
    assert booleans.option_values == ("true", "false")


def test_property_names_are_percent_encoded_in_field_names():
    text = {"type": "string"}
    root = root_of(obj(**{"a.b": text, "due date": text, "50%": text, "it's": text}))
    assert [c.name for c in root.children] == ["answer.a%2Eb", "answer.due%20date", "answer.50%25",
                                               "answer.it%27s"]
    assert [c.path for c in root.children] == ["$['a.b']", "$['due date']", "$['50%']", "$['it\\'s']"]
    assert read_answer(obj(**{"a.b": {"type": "string"}}), [("answer.a%2Eb", "x")]).value == {"a.b": "x"}


def test_a_very_deep_schema_ends_in_a_json_text_area():
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        schema = obj(x=schema)
    node = root_of(schema)
    depth = 0
    while node.kind is FieldKind.OBJECT:
        node, depth = node.children[0], depth + 1
    assert node.kind is FieldKind.JSON and depth < 40


def test_defaults_fill_a_fresh_form():
    schema = obj(city={"type": "string", "default": "Paris"}, n={"type": "integer", "default": 3},
                 ok={"type": "boolean", "default": True}, off={"type": "boolean", "default": False},
                 color={"enum": ["red", 1], "default": 1},
                 tags={"type": "array", "items": {"type": "string"}, "default": ["a", "b"]},
                 meta={"default": {"k": 1}})
    assert answer_form(schema).initial == {
        "answer.city": "Paris", "answer.n": "3", "answer.ok": "true", "answer.off": "false",
        "answer.color": "1",
        "answer.tags": ["answer.tags.0", "answer.tags.1"], "answer.tags.0": "a", "answer.tags.1": "b",
        "answer.meta": '{\n  "k": 1\n}'}
    # an object's default is the instance: it wins over its properties' own
    whole = obj(city={"type": "string", "default": "Paris"})
    whole["default"] = {"city": "Lyon"}
    assert answer_form(whole).initial == {"answer.city": "Lyon"}


# --- reading a submitted form ---------------------------------------------------------------


def test_other_fields_of_the_page_are_ignored():
    schema = obj(city={"type": "string"})
    given_pairs = [("csrf", "t"), ("session", "s"), ("interrupt_id", "i"), ("decision", "x"),
                   ("answers.city", "no"), ("answer.city", "Paris")]
    assert read_answer(schema, given_pairs).value == {"city": "Paris"}


@pytest.mark.parametrize(("schema", "raw", "value"), [
    ({"type": "string"}, "  spaced  ", "  spaced  "),
    ({"type": "string", "x-multiline": True}, "a\r\nb", "a\nb"),
    ({"type": "number"}, "2.5", 2.5),
    ({"type": "number"}, "-3", -3),
    ({"type": "number"}, ".5", 0.5),
    ({"type": "number"}, "1e3", 1000.0),
    ({"type": "number"}, " 7 ", 7),
    ({"type": "number"}, "123456789012345678901234567890", 1.2345678901234568e29),
    ({"type": "integer"}, "42", 42),
    ({"type": "integer"}, "3.0", 3),
    ({"type": "integer"}, "1e2", 100),
    ({"type": "boolean"}, "true", True),
    ({"enum": ["1", 1, True, None]}, '"1"', "1"),
    ({"enum": ["1", 1, True, None]}, "1", 1),
    ({"enum": ["1", 1, True, None]}, "true", True),
    ({"enum": ["1", 1, True, None]}, "null", None),
    ({}, '{"a": [1, null]}', {"a": [1, None]}),
    ({}, '"text"', "text"),
])
def test_values_are_read_by_the_schema(schema, raw, value):
    result = read_answer(schema, [("answer", raw)])
    assert result.ok, result.errors
    assert result.value == value and type(result.value) is type(value)


@pytest.mark.parametrize(("schema", "raw", "message"), [
    ({"type": "number"}, "abc", "not a number"),
    ({"type": "number"}, "1,5", "not a number"),
    ({"type": "number"}, "nan", "not a number"),
    ({"type": "number"}, "Infinity", "not a number"),
    ({"type": "number"}, "1e999", "too large"),
    ({"type": "number"}, "1" * 101, "not a number"),
    ({"type": "integer"}, "3.5", "not a whole number"),
    ({"type": "integer"}, "99999999999999999999999", "too large"),
    ({"type": "integer"}, "1e300", "too large"),
    ({"type": "boolean"}, "maybe", "not a yes / no value"),
    ({"enum": ["a", "b"]}, "a", "not one of the choices"),  # the JSON text is '"a"'
    ({"enum": ["a", "b"]}, '"c"', "not one of the choices"),
    ({}, "{oops", "not valid JSON"),
    ({}, "NaN", "not valid JSON"),
    ({}, "[" * 5000 + "]" * 5000, "not valid JSON"),
])
def test_unreadable_values_are_errors_beside_their_field(schema, raw, message):
    result = read_answer(schema, [("answer", raw)])
    assert not result.ok
    assert result.errors["answer"].startswith(message)
    assert result.values == {"answer": raw}  # what was typed is shown again


def test_empty_optional_fields_are_left_out_and_empty_required_ones_are_required():
    schema = obj(["n", "color", "meta"], n={"type": "integer"}, color={"enum": ["r"]}, meta={},
                 note={"type": "string"}, k={"type": "number"}, j={})
    result = read_answer(schema, [("answer.n", " "), ("answer.color", ""), ("answer.meta", "  "),
                                  ("answer.note", ""), ("answer.k", ""), ("answer.j", "")])
    assert result.value == {}
    assert result.errors == {"answer.n": "required", "answer.color": "required", "answer.meta": "required"}


def test_an_empty_required_string_is_the_empty_string_and_the_schema_decides():
    note = obj(["note"], note={"type": "string"})
    result = read_answer(note, [("answer.note", "")])
    assert (result.value, result.errors) == ({"note": ""}, {})  # what the engine accepts
    short = obj(["note"], note={"type": "string", "minLength": 1})
    assert read_answer(short, [("answer.note", "")]).errors == {"answer.note": "'' should be non-empty"}
    # an optional one left empty is left out, not ""
    assert read_answer(obj(note={"type": "string"}), [("answer.note", "")]).value == {}
    assert read_answer({"type": "string"}, [("answer", "")]).value == ""  # the root is required


def test_an_empty_required_string_alone_does_not_make_an_optional_object_present():
    schema = obj(extra=obj(["note"], note={"type": "string"}, n={"type": "integer"}),
                 to=obj(inner=obj(["city"], city={"type": "string"})))
    assert read_answer(schema, [("answer.extra.note", ""), ("answer.extra.n", ""),
                                ("answer.to.inner.city", "")]).value == {}
    assert read_answer(schema, [("answer.extra.note", ""), ("answer.extra.n", "2")]).value == \
        {"extra": {"note": "", "n": 2}}


def test_empty_array_items_are_dropped_even_when_the_item_schema_takes_the_empty_string():
    schema = {"type": "array", "items": {"type": "string"}}
    assert read_answer(schema, [("answer.0", ""), ("answer.1", "x"), ("answer.2", "")]).value == ["x"]
    # an item object of a required string is dropped when it is empty, kept with "" when not
    lines = {"type": "array", "items": obj(["sku"], sku={"type": "string"}, n={"type": "integer"})}
    assert read_answer(lines, [("answer.0.sku", ""), ("answer.0.n", ""), ("answer.1.sku", ""),
                               ("answer.1.n", "3")]).value == [{"sku": "", "n": 3}]


def test_a_missing_root_scalar_is_an_error_on_the_answer():
    assert read_answer({"type": "string"}, []).errors == {"answer": "an answer is required"}
    assert read_answer({"type": "integer"}, [("answer", "")]).errors == {"answer": "an answer is required"}


def test_an_unticked_box_is_false_when_required_and_left_out_when_optional():
    schema = obj(["must"], must={"type": "boolean"}, may={"type": "boolean"})
    assert read_answer(schema, []).value == {"must": False}
    assert read_answer(schema, [("answer.must", "true"), ("answer.may", "true")]).value == \
        {"must": True, "may": True}
    assert read_answer({"type": "boolean"}, []).value is False  # the root is always there
    assert read_answer({"type": "boolean"}, [("answer", "true")]).value is True


def test_an_optional_boolean_is_a_select_that_can_say_no_or_nothing():
    schema = obj(notify_customer={"type": "boolean", "default": True})
    field = child(root_of(schema), "notify_customer")
    assert (field.kind, field.checkbox) == (FieldKind.BOOLEAN, False)
    assert answer_form(schema).initial == {"answer.notify_customer": "true"}  # Yes preselected
    assert read_answer(schema, [("answer.notify_customer", "false")]).value == {"notify_customer": False}
    assert read_answer(schema, [("answer.notify_customer", "true")]).value == {"notify_customer": True}
    assert read_answer(schema, [("answer.notify_customer", "")]).value == {}  # no answer
    assert answer_form(obj(off={"type": "boolean", "default": False})).initial == {"answer.off": "false"}


def test_a_box_is_a_checkbox_only_where_unticked_can_mean_false():
    schema = obj(["must", "to"], must={"type": "boolean"}, may={"type": "boolean"},
                 to=obj(["sure"], sure={"type": "boolean"}),
                 extra=obj(["sure"], sure={"type": "boolean"}),
                 lines={"type": "array", "items": obj(["gift"], gift={"type": "boolean"})})
    root = root_of(schema)
    assert child(root, "must").checkbox and child(child(root, "to"), "sure").checkbox
    assert root_of({"type": "boolean"}).checkbox
    assert not child(root, "may").checkbox
    # inside an optional object or an array item a required box unticked could not say false
    # without making its object present: a select there
    assert not child(child(root, "extra"), "sure").checkbox
    item = child(root, "lines").item
    assert item is not None and not child(item, "gift").checkbox
    assert read_answer(schema, [("answer.extra.sure", "false"), ("answer.lines.0.gift", "false")]).value == \
        {"must": False, "to": {"sure": False}, "extra": {"sure": False}, "lines": [{"gift": False}]}
    left = read_answer(schema, [("answer.lines.0.gift", "")])
    assert (left.value, left.errors) == ({"must": False, "to": {"sure": False}}, {})


def test_an_optional_object_left_empty_is_left_out_even_with_a_required_box_inside():
    schema = obj(extra=obj(["sure"], sure={"type": "boolean"}, note={"type": "string"}))
    assert read_answer(schema, [("answer.extra.note", ""), ("answer.extra.sure", "")]).value == {}
    # the box is a select there: left without an answer it is the schema's "required"
    result = read_answer(schema, [("answer.extra.note", "hi"), ("answer.extra.sure", "")])
    assert result.errors == {"answer.extra.sure": "required"}
    assert read_answer(schema, [("answer.extra.note", "hi"), ("answer.extra.sure", "false")]).value == \
        {"extra": {"note": "hi", "sure": False}}


def test_a_required_object_left_empty_reports_its_own_required_fields():
    schema = obj(["to"], to=obj(["zip"], zip={"type": "integer"}))
    result = read_answer(schema, [("answer.to.zip", "")])
    assert result.value == {"to": {}}
    assert result.errors == {"answer.to.zip": "required"}


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^(a+)+$"}, {"type": "integer"}, {}, {"enum": ["a"]},
])
def test_a_value_over_64_kib_is_an_error_beside_its_field_and_is_never_parsed(schema):
    huge = "a" * (64 * 1024) + "!"  # would make the pattern backtrack for ages
    result = read_answer(obj(["v"], v=schema), [("answer.v", huge)])
    assert result.errors == {"answer.v": "too long: at most 64 KiB"}
    assert result.values == {"answer.v": huge}  # shown again, to be shortened
    # counted in UTF-8 bytes, as sent
    wide = read_answer(obj(v={"type": "string"}), [("answer.v", "é" * (32 * 1024 + 1))])
    assert wide.errors == {"answer.v": "too long: at most 64 KiB"}
    assert read_answer(obj(v={"type": "string"}), [("answer.v", "é" * (32 * 1024))]).ok


def test_arrays_are_read_in_index_order_closing_up_over_dropped_items():
    schema = obj(tags={"type": "array", "items": {"type": "string"}})
    result = read_answer(schema, [("answer.tags.2", "c"), ("answer.tags.0", "a"), ("answer.tags.1", ""),
                                  ("answer.tags.10", "k")])
    assert result.value == {"tags": ["a", "c", "k"]}
    assert result.values["answer.tags"] == ["answer.tags.2", "answer.tags.0", "answer.tags.1",
                                            "answer.tags.10"]
    # nothing filled: an optional array is left out, a required one is empty
    assert read_answer(schema, [("answer.tags.0", "")]).value == {}
    assert read_answer({"type": "array", "items": {"type": "string"}}, []).value == []


def test_nested_objects_in_arrays_in_objects_round_trip_with_errors_at_the_submitted_names():
    line = obj(["sku", "qty"], sku={"type": "string", "minLength": 3}, qty={"type": "integer", "minimum": 1},
               gift={"type": "boolean"})
    schema = obj(["order"], order=obj(["lines"], lines={"type": "array", "items": line, "minItems": 1}))
    good = [("answer.order.lines.0.sku", "abc"), ("answer.order.lines.0.qty", "2"),
            ("answer.order.lines.1.sku", "def"), ("answer.order.lines.1.qty", "1"),
            ("answer.order.lines.1.gift", "true")]
    assert read_answer(schema, good).value == {"order": {"lines": [
        {"sku": "abc", "qty": 2}, {"sku": "def", "qty": 1, "gift": True}]}}
    # item 1 left empty is dropped: item 2 is the payload's $.order.lines[1], yet its errors go
    # beside the fields it was typed in
    bad = [("answer.order.lines.0.sku", "abc"), ("answer.order.lines.0.qty", "2"),
           ("answer.order.lines.1.sku", ""), ("answer.order.lines.1.qty", ""),
           ("answer.order.lines.2.sku", "x"), ("answer.order.lines.2.qty", "0")]
    result = read_answer(schema, bad)
    assert result.errors == {"answer.order.lines.2.sku": "'x' is too short",
                             "answer.order.lines.2.qty": "0 is less than the minimum of 1"}
    missing = read_answer(schema, [("answer.order.lines.0.sku", "abc")])
    assert missing.errors == {"answer.order.lines.0.qty": "required"}
    empty = read_answer(schema, [("answer.order.lines.0.sku", "")])
    assert empty.errors == {"answer.order.lines": "[] should be non-empty"}


def test_schema_errors_go_beside_the_failing_field():
    schema = obj(["email"], email={"type": "string", "maxLength": 5}, n={"type": "integer", "maximum": 3},
                 tags={"type": "array", "items": {"type": "string"}, "minItems": 2},
                 meta={"type": "object", "properties": {}, "required": ["k"]})
    result = read_answer(schema, [("answer.email", "toolong"), ("answer.n", "4"), ("answer.tags.0", "a"),
                                  ("answer.meta", '{"j": 1}')])
    assert result.errors == {
        "answer.email": "'toolong' is too long",
        "answer.n": "4 is greater than the maximum of 3",
        "answer.tags": "['a'] is too short",
        "answer.meta": "'k' is a required property",  # inside a JSON text area: the area itself
    }


def test_a_whole_payload_error_goes_on_the_answer():
    schema = obj(a={"type": "string"}, b={"type": "string"})
    schema["minProperties"] = 1
    assert read_answer(schema, []).errors == {"answer": "{} should be non-empty"}
    closed = obj(a={"type": "string"})
    closed["additionalProperties"] = False
    assert read_answer(closed, [("answer.a", "x")]).ok


def test_an_unreadable_field_does_not_hide_the_other_fields_errors():
    schema = obj(["name"], name={"type": "integer"}, n={"type": "integer"})
    result = read_answer(schema, [("answer.name", ""), ("answer.n", "x")])
    assert result.errors == {"answer.n": "not a number", "answer.name": "required"}
    required = read_answer(obj(["n"], n={"type": "integer"}), [("answer.n", "x")])
    assert required.errors == {"answer.n": "not a number"}  # its own message, not "required"


def test_a_schema_the_validator_refuses_is_an_error_not_an_exception():
    broken = {"type": "string", "minLength": -1}
    assert "cannot be used" in read_answer(broken, [("answer", "x")]).errors[ROOT]
    far = {"$ref": "https://example.com/schema.json"}
    assert "cannot be resolved" in read_answer(far, [("answer", "1")]).errors[ROOT]


# --- hostile input --------------------------------------------------------------------------


def test_a_huge_index_is_an_error_and_allocates_nothing():
    schema = obj(tags={"type": "array", "items": {"type": "string"}})
    result = read_answer(schema, [("answer.tags.999999999", "x")])
    assert result.errors == {"answer.tags": f"at most {MAX_ARRAY_ITEMS} items"}
    assert "answer.tags.999999999" not in result.values
    capped = obj(tags={"type": "array", "items": {"type": "string"}, "maxItems": 2})
    assert read_answer(capped, [("answer.tags.2", "x")]).errors == {"answer.tags": "at most 2 items"}
    assert read_answer(capped, [("answer.tags.1", "x")]).value == {"tags": ["x"]}


@pytest.mark.parametrize("name", [
    "answer.tags.01", "answer.tags.-1", "answer.tags.+1", "answer.tags. 1", "answer.tags.1e3",
    "answer.tags." + "9" * 5000, "answer.tags.x", "answer.nope", "answer.tags.0.deeper", "answer.",
    "answer.tags", "answer..tags",
])
def test_names_the_form_does_not_have_are_errors(name):
    schema = obj(tags={"type": "array", "items": {"type": "string"}})
    result = read_answer(schema, [(name, "x")])
    assert result.errors.keys() == {"answer"}
    assert result.errors["answer"].startswith("the form has no field")
    assert len(result.errors["answer"]) < 200


def test_a_field_given_twice_is_an_error():
    result = read_answer(obj(a={"type": "string"}), [("answer.a", "x"), ("answer.a", "y")])
    assert result.errors == {"answer.a": "given more than once"}


def test_a_file_upload_instead_of_text_is_an_error():
    upload: Any = object()  # what a multipart form parser gives for a file part
    result = read_answer(obj(a={"type": "string"}), [("answer.a", upload)])
    assert result.errors == {"answer.a": "not a text value"}


def test_odd_number_keywords_do_not_break_the_form():
    assert root_of({"type": "integer", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2.5}).attrs == \
        {"min": "-1", "max": "2", "step": "1"}
    huge = root_of({"type": "number", "minimum": 10**400, "multipleOf": 1e-300})
    assert huge.attrs["step"] == "any"


def test_error_messages_are_kept_short():
    result = read_answer({"type": "string", "maxLength": 3}, [("answer", "x" * 100_000)])
    assert len(result.errors["answer"]) <= 300


HOSTILE_SCHEMA = obj(["a"], a={"type": "string"}, n={"type": "number"},
                     l={"type": "array", "items": obj(m={"type": "array", "items": {"type": "integer"}})},
                     b={"type": "boolean"}, e={"enum": [1, "1"]}, j={})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.sampled_from(["answer", "answer.a", "answer.n", "answer.l.0.m.1", "answer.b", "answer.e",
                               "answer.j", "answer.l.1.m.0", "csrf"]),
              st.text(alphabet="answer.lmj0123456789%-_ ", max_size=30)),
    st.one_of(st.text(max_size=20), st.sampled_from(["1", "true", "", "[1]", '"1"', "1e999", "-0"])),
), max_size=12))
def test_any_submission_is_read_without_an_exception(items):
    result = read_answer(HOSTILE_SCHEMA, items)
    assert isinstance(result.errors, dict)
    if result.ok:
        assert isinstance(result.value, dict) and "a" in result.value


# --- round trips ----------------------------------------------------------------------------


EVERY_TYPE = obj(
    ["s", "i", "b"],
    s={"type": "string"}, mail={"type": "string", "format": "email"},
    text={"type": "string", "maxLength": 500},
    i={"type": "integer"}, x={"type": "number"}, b={"type": "boolean"}, b2={"type": "boolean"},
    e={"enum": ["a", 2, False, None, [1]]}, c={"const": "fixed"},
    o=obj(["p"], p={"type": "string"}, q={"type": "array", "items": {"type": "integer"}}),
    arr={"type": "array",
         "items": obj(name={"type": "string"}, flags={"type": "array", "items": {"type": "boolean"}})},
    nul={"type": "null"}, any_of={"anyOf": [{"type": "string"}, {"type": "array"}]},
    loose={"type": "object"},
)

EVERY_VALUE = {
    "s": "héllo <b>&", "mail": "a@b.c", "text": "line 1\nline 2", "i": -7, "x": 0.25, "b": True, "b2": True,
    "e": [1], "c": "fixed", "o": {"p": "q", "q": [3, 1, 2]},
    "arr": [{"name": "n1", "flags": [True, False]}, {"name": "n2"}],
    "nul": None, "any_of": ["z"], "loose": {"deep": {"er": [None, 1.5]}},
}


def test_a_value_of_every_json_type_round_trips_through_the_form():
    schema = dict(EVERY_TYPE, default=EVERY_VALUE)
    form = answer_form(schema)
    result = read_answer(schema, pairs(form.initial))
    assert result.ok, result.errors
    assert result.value == EVERY_VALUE


@pytest.mark.parametrize("value", [
    {"s": "", "i": 0, "b": False},  # a required string's "" comes back as ""
    {"s": "x", "i": 0, "b": False, "e": None, "o": {"p": "", "q": []}},
])
def test_empty_values_come_back_as_shown(value):
    schema = dict(EVERY_TYPE, default=value)
    result = read_answer(schema, pairs(answer_form(schema).initial))
    # an optional object of nothing but a required string's "" is left out
    assert result.ok, result.errors
    assert result.value.get("e", "absent") == value.get("e", "absent")
    assert result.value["s"] == value["s"] and result.value["b"] is False
    assert "o" not in result.value


@settings(max_examples=150, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10))
def test_any_json_value_round_trips_through_a_json_text_area(value):
    schema = {"default": [value]}  # (a null default is no default: the value goes in a list)
    result = read_answer(schema, pairs(answer_form(schema).initial))
    assert result.ok, result.errors
    assert result.value == [value]


@pytest.mark.parametrize("value", ["a", 1, 1.5, True, False, None, {"k": [1]}, "1"])
def test_enum_values_round_trip_by_their_json_text(value):
    schema = {"enum": ["a", 1, 1.5, True, False, None, {"k": [1]}, "1"]}
    result = read_answer(schema, [("answer", json_text(value))])
    assert result.ok and result.value == value and type(result.value) is type(value)


# --- paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "name"), [
    ("$", "answer"), (None, "answer"), ("", "answer"),
    ("$.tags[0]", "answer.tags.0"), ("$.a.b[12].c", "answer.a.b.12.c"), ("$[3]", "answer.3"),
    ("$['due date']", "answer.due%20date"), ("$['a.b']", "answer.a%2Eb"), ("$['it\\'s']", "answer.it%27s"),
    ("$['0']", "answer.0"),
    # not a path jsonschema writes: the whole answer
    ("tags[0]", "answer"), ("$.", "answer"), ("$[x]", "answer"), ("$['open", "answer"), ("$.a b", "answer"),
    ("$[99999999999999]", "answer"),
])
def test_field_of_path(path, name):
    assert field_of_path(path) == name


def test_field_of_path_with_a_form_stops_at_its_deepest_field():
    form = answer_form(obj(meta={}, tags={"type": "array", "items": obj(x={"type": "string"})}))
    assert field_of_path("$.meta.a[0]", form) == "answer.meta"
    assert field_of_path("$.tags[2].x", form) == "answer.tags.2.x"
    assert field_of_path("$.tags[2].y", form) == "answer.tags.2"
    assert field_of_path("$.nope", form) == "answer"
    assert field_of_path("$.tags.x", form) == "answer.tags"
