"""The fields of an answer form, generated from an interrupt's `response_schema` (pure).

`answer_form(schema)` describes the fields to render (templates/_form.html renders them), and
the raw values a fresh form shows (from the schema's `default`s). With no schema the form is
Approve / Decline.

Which schema becomes which field:
- `enum` or `const` (any JSON values), or a `oneOf`/`anyOf` whose every branch is a `const`
  (the branches' `title`s label the options): a select whose option values are the JSON text
  of each value, so `1`, `"1"`, `true` and `null` stay apart.
- `type: string`: a text input (`format` email / date / uri: input type email / date / url);
  a textarea when `maxLength` > 200 or `x-multiline` is true. A textarea's CRLF line ends (what
  browsers send) are read as LF.
- `type: number` / `integer`: a number input with min / max / step from `minimum` /
  `maximum` / `multipleOf`.
- `type: boolean`: a checkbox only where an unticked box can stand for `false`: a required
  property none of whose enclosing fields may be left out (the root, a required property of a
  required object, ...). A checkbox sends nothing when unticked, so there unticked is `false`.
  Every other boolean (an optional one, one inside an optional object or an array item) is a
  select of no answer / Yes / No, preselected from its `default`: an optional boolean's "no
  answer" leaves it out, its No is `false` (a checkbox there could not say `false` at all).
  An array's boolean items are a Yes / No select (an ENUM field; an empty one is dropped).
- `type: object` with `properties`: a fieldset of its properties' fields, in the schema's order.
- `type: array` with an `items` schema: a fieldset of items, each the item schema's field.
- anything else (`oneOf`, `anyOf`, `$ref`, a list of types, no type, an object without
  `properties`, `prefixItems`, nesting deeper than MAX_DEPTH): a textarea read as JSON.
"""

import json
import math
import re
from typing import Any

from parley.web.forms.model import ROOT, AnswerForm, FieldKind, FormField, item_cap
from parley.web.forms.names import json_path_child, segment_of

#: schemas nested deeper than this are a JSON text area (a schema may be up to 16 KiB of
#: nesting; the form stays small and its recursion shallow)
MAX_DEPTH = 16
#: a string longer than this (`maxLength`) or marked `x-multiline` is a textarea
MULTILINE_ABOVE = 200
#: string formats with an HTML input type that accepts the same texts
_INPUT_TYPE_OF_FORMAT = {"email": "email", "date": "date", "uri": "url"}
_MISSING: Any = object()


def answer_form(schema: dict[str, Any] | None) -> AnswerForm:
    """The fields of a form for `schema` (None: Approve / Decline)."""
    if schema is None:
        return AnswerForm(None)
    root = _field(schema, name=ROOT, path="$", segment=ROOT, key="", label=None,
                  required=True, html_required=True, in_array=False, depth=0)
    initial: dict[str, Any] = {}
    _initial_values(root, ROOT, _MISSING, initial)
    return AnswerForm(root, initial)


def _field(schema: Any, *, name: str, path: str, segment: str, key: str, label: str | None,
           required: bool, html_required: bool, in_array: bool, depth: int) -> FormField:
    node: dict[str, Any] = schema if isinstance(schema, dict) else {}
    title = node.get("title")
    description = node.get("description")
    common: dict[str, Any] = {
        "name": name, "path": path, "segment": segment, "key": key,
        "label": title if isinstance(title, str) and title else (label or "Answer"),
        "description": description if isinstance(description, str) and description else None,
        "required": required, "default": node.get("default"),
    }
    choices = _choices(node)
    if choices is not None:
        values, labels = choices
        return FormField(kind=FieldKind.ENUM, options=values, option_values=tuple(map(json_text, values)),
                         option_labels=labels, html_required=html_required, **common)
    kind = node.get("type")
    if depth >= MAX_DEPTH or not isinstance(schema, dict):
        return FormField(kind=FieldKind.JSON, html_required=html_required, **common)
    if kind == "string":
        return _string_field(node, html_required, common)
    if kind in ("number", "integer"):
        return _number_field(node, html_required, common)
    if kind == "boolean":
        if in_array and not key:  # an array's item: a yes / no select (see the module doc)
            return FormField(kind=FieldKind.ENUM, options=(True, False), option_values=("true", "false"),
                             option_labels=("Yes", "No"), **common)
        # unticked may mean false only where the value cannot be left out: wherever the
        # browser would require a field (a required box itself would have to be ticked)
        return FormField(kind=FieldKind.BOOLEAN, checkbox=html_required, **common)
    properties = node.get("properties")
    if kind in ("object", None) and isinstance(properties, dict) and properties \
            and not _has_combinators(node):
        return _object_field(node, properties, html_required, in_array, depth, common)
    items = node.get("items")
    if kind == "array" and isinstance(items, dict) and "prefixItems" not in node \
            and not _has_combinators(node):
        return _array_field(node, items, depth, common)
    return FormField(kind=FieldKind.JSON, html_required=html_required, **common)


def _object_field(node: dict[str, Any], properties: dict[str, Any], html_required: bool,
                  in_array: bool, depth: int, common: dict[str, Any]) -> FormField:
    """A fieldset of the object's properties' fields, in the schema's order."""
    name, path = common["name"], common["path"]
    wanted = node.get("required")
    required_keys = {k for k in wanted if isinstance(k, str)} if isinstance(wanted, list) else set()
    children = tuple(
        _field(sub, name=f"{name}.{segment_of(prop)}", path=json_path_child(path, prop),
               segment=segment_of(prop), key=prop, label=_humanise(prop),
               required=prop in required_keys,
               html_required=html_required and prop in required_keys and not in_array,
               in_array=in_array, depth=depth + 1)
        for prop, sub in properties.items())
    return FormField(kind=FieldKind.OBJECT, children=children, **common)


def _array_field(node: dict[str, Any], items: dict[str, Any], depth: int,
                 common: dict[str, Any]) -> FormField:
    """A fieldset of items, each the item schema's field (named with index 0)."""
    name, path = common["name"], common["path"]
    item = _field(items, name=f"{name}.0", path=f"{path}[0]", segment="0", key="",
                  label="Item", required=False, html_required=False, in_array=True,
                  depth=depth + 1)
    return FormField(kind=FieldKind.ARRAY, item=item, min_items=_count(node.get("minItems")) or 0,
                     max_items=_count(node.get("maxItems")), **common)


def _string_field(node: dict[str, Any], html_required: bool, common: dict[str, Any]) -> FormField:
    attrs: dict[str, str] = {}
    min_length, max_length = _count(node.get("minLength")), _count(node.get("maxLength"))
    if min_length:
        attrs["minlength"] = str(min_length)
    if max_length is not None:
        attrs["maxlength"] = str(max_length)
    multiline = node.get("x-multiline") is True or (max_length is not None and max_length > MULTILINE_ABOVE)
    pattern = node.get("pattern")
    if isinstance(pattern, str) and not multiline:
        # a JSON Schema pattern matches anywhere in the text; an HTML one must match all of it
        attrs["pattern"] = f"[\\s\\S]*(?:{pattern})[\\s\\S]*"
    string_format = node.get("format")
    input_type = _INPUT_TYPE_OF_FORMAT.get(string_format, "text") if isinstance(string_format, str) \
        else "text"
    # an empty required string is "" (which the schema may allow): the browser refuses it only
    # when the schema does
    return FormField(kind=FieldKind.STRING, attrs=attrs, input_type=input_type, multiline=multiline,
                     html_required=html_required and bool(min_length), **common)


def _number_field(node: dict[str, Any], html_required: bool, common: dict[str, Any]) -> FormField:
    integer = node.get("type") == "integer"
    attrs: dict[str, str] = {}
    low, high = _number(node.get("minimum")), _number(node.get("maximum"))
    if integer:  # an exclusive bound is an inclusive one for whole numbers
        above, below = _number(node.get("exclusiveMinimum")), _number(node.get("exclusiveMaximum"))
        if above is not None and (low is None or above >= low):
            low = math.floor(above) + 1
        if below is not None and (high is None or below <= high):
            high = math.ceil(below) - 1
    if low is not None:
        attrs["min"] = _number_text(low)
    if high is not None:
        attrs["max"] = _number_text(high)
    step = _number(node.get("multipleOf"))
    # the browser counts steps from `min`: a multipleOf is a step only when min is one of its multiples
    if step is not None and step > 0 and (low is None or _is_multiple(low, step)):
        attrs["step"] = _number_text(step)
    else:
        attrs["step"] = "1" if integer else "any"  # HTML's default step (1) would refuse 0.5
    kind = FieldKind.INTEGER if integer else FieldKind.NUMBER
    return FormField(kind=kind, attrs=attrs, input_type="number", html_required=html_required, **common)


def _choices(node: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[str, ...]] | None:
    """An `enum`, a `const`, or a `oneOf` / `anyOf` of `const`s: (values, labels)."""
    if isinstance(node.get("enum"), list) and node["enum"]:
        values = tuple(node["enum"])
        return values, tuple(map(_option_label, values))
    if "const" in node:
        return (node["const"],), (_option_label(node["const"]),)
    for keyword in ("oneOf", "anyOf"):
        branches = node.get(keyword)
        if isinstance(branches, list) and branches \
                and all(isinstance(b, dict) and "const" in b for b in branches):
            values = tuple(b["const"] for b in branches)
            labels = tuple(b["title"] if isinstance(b.get("title"), str) and b["title"]
                           else _option_label(b["const"]) for b in branches)
            return values, labels
    return None


def _has_combinators(node: dict[str, Any]) -> bool:
    """Keywords that make an object or array more than its fields: written as JSON instead."""
    return any(k in node for k in ("oneOf", "anyOf", "allOf", "not", "if", "$ref", "$dynamicRef"))


# --- the raw values of a fresh form ---------------------------------------------------------


def _initial_values(form_field: FormField, name: str, value: Any, out: dict[str, Any]) -> None:
    """The raw values showing `value` (a schema `default`) in `form_field`, into `out`."""
    if value is _MISSING and form_field.default is not None:  # (a null default is not told apart)
        value = form_field.default
    kind = form_field.kind
    if kind is FieldKind.OBJECT:
        # the object's own default is the instance; its properties' defaults fill the rest
        given = value if isinstance(value, dict) else {}
        for child in form_field.children:
            _initial_values(child, f"{name}.{child.segment}", given.get(child.key, _MISSING), out)
    elif kind is FieldKind.ARRAY:
        if isinstance(value, list) and form_field.item is not None:
            names = [f"{name}.{i}" for i in range(min(len(value), item_cap(form_field)))]
            out[name] = names
            for item_name, item in zip(names, value, strict=False):
                _initial_values(form_field.item, item_name, item, out)
    elif value is not _MISSING:
        text = _raw_text(form_field, value)
        if text is not None:
            out[name] = text


def _raw_text(form_field: FormField, value: Any) -> str | None:
    """How `value` is written in `form_field` (None: it cannot be)."""
    kind = form_field.kind
    if kind is FieldKind.STRING:
        return value if isinstance(value, str) else None
    if kind in (FieldKind.NUMBER, FieldKind.INTEGER):
        number = _number(value)
        return None if number is None else _number_text(number)
    if kind is FieldKind.BOOLEAN:
        return "true" if value is True else "false" if value is False else None
    if kind is FieldKind.ENUM:
        text = json_text(value)
        return text if text in form_field.option_values else None
    return json.dumps(value, indent=2, ensure_ascii=False)


# --- values as the form writes them, and schema keywords as values ---------------------------


def json_text(value: Any) -> str:
    """The JSON text of an option's value, as its `<option value>` (compact, keys sorted)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _option_label(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)


def _humanise(key: str) -> str:
    """`due_date` / `dueDate` / `due-date` -> `Due date`."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ").replace("-", " ")
    words = [w if w.isupper() and len(w) > 1 else w.lower() for w in spaced.split()]
    if not words:
        return key or "Value"
    words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words)


def _count(value: Any) -> int | None:
    """A non-negative integer keyword (`minItems`, `maxLength`...), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value < 0 or value != int(value):
        return None
    return int(value)


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _number_text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _is_multiple(value: int | float, step: int | float) -> bool:
    try:
        return float(value / step).is_integer()
    except (OverflowError, ZeroDivisionError):
        return False
