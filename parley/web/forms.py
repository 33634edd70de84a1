"""The answer form of an interrupt, generated from its `response_schema` (pure, no I/O).

`answer_form(schema)` describes the fields to render (templates/_form.html renders them);
`read_answer(schema, items)` turns a submitted form back into the JSON payload and checks it
against the schema (Draft 2020-12, as the engine does), with each error keyed by the field's
HTML name so the page shows it beside that field before anything is sent. With no schema the
form is Approve / Decline: `APPROVE` / `DECLINE` are the payloads.

Field names: the root is `answer`; an object's property `city` is `answer.city`; an array's
items are `answer.tags.0`, `answer.tags.1`, ... (nested the same way). Their JSON paths, as the
engine reports a refusal's `path`, are `$`, `$.city`, `$.tags[0]`. A property name with
characters other than ASCII letters, digits, `_` and `-` is percent-encoded in the field name
(`due date` -> `answer.due%20date`), so a name is always unambiguous and usable as an HTML id.

Which schema becomes which field:
- `enum` or `const` (any JSON values), or a `oneOf`/`anyOf` whose every branch is a `const`
  (the branches' `title`s label the options): a select whose option values are the JSON text
  of each value, so `1`, `"1"`, `true` and `null` stay apart.
- `type: string`: a text input (`format` email / date / uri: input type email / date / url);
  a textarea when `maxLength` > 200 or `x-multiline` is true. A textarea's CRLF line ends (what
  browsers send) are read as LF.
- `type: number` / `integer`: a number input with min / max / step from `minimum` /
  `maximum` / `multipleOf`.
- `type: boolean`: a checkbox. No hidden companion field is sent, so an unchecked box cannot be
  told from a missing one: an unchecked *required* boolean is read as `false`, an unchecked
  optional one is left out of the answer. An array's boolean items are a yes / no select
  instead (an unchecked box would make the item vanish).
- `type: object` with `properties`: a fieldset of its properties' fields, in the schema's order.
- `type: array` with an `items` schema: a fieldset of items, each the item schema's field.
- anything else (`oneOf`, `anyOf`, `$ref`, a list of types, no type, an object without
  `properties`, `prefixItems`, nesting deeper than MAX_DEPTH): a textarea read as JSON.

Empty fields: an empty text, number, select or JSON field is left out of the answer (an empty
required field is then the schema's "required" error beside it). An object none of whose fields
is filled is left out when optional (`{}` when required, so its own required fields are
reported); an array item none of whose fields is filled is dropped, and the remaining items
keep their order. The root is always present (`{}` / `[]` when empty; a missing root scalar is
an error on `answer`).
"""

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from itertools import islice
from typing import Any
from urllib.parse import unquote

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

APPROVE: dict[str, Any] = {"approved": True}
DECLINE: dict[str, Any] = {"approved": False}
ROOT = "answer"

#: schemas nested deeper than this are a JSON text area (a schema may be up to 16 KiB of
#: nesting; the form stays small and its recursion shallow)
MAX_DEPTH = 16
#: the most items an array field reads when its schema sets no smaller `maxItems`: a submitted
#: name like `answer.tags.999999999` must not make a huge list
MAX_ARRAY_ITEMS = 1000
#: a string longer than this (`maxLength`) or marked `x-multiline` is a textarea
MULTILINE_ABOVE = 200
#: schema errors looked at (an answer can fail in as many places as it has items)
MAX_ERRORS_LOOKED_AT = 50
#: an error message beside a field is cut to this many characters (messages quote the value)
MAX_MESSAGE_CHARS = 300
#: integers the engine can encode (orjson: signed or unsigned 64-bit)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
#: string formats with an HTML input type that accepts the same texts
_INPUT_TYPE_OF_FORMAT = {"email": "email", "date": "date", "uri": "url"}
#: no retrieval: a `$ref` outside the schema is never fetched (as in the engine)
_NO_RETRIEVAL: Registry[Any] = Registry()
#: a name segment keeps these characters; the others are percent-encoded
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_-]*$")
#: jsonschema writes a property as `.name` when it matches this, else `['name']`
_PLAIN_PROPERTY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")
_INDEX = re.compile(r"^(0|[1-9][0-9]{0,8})$")
_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_WHOLE = re.compile(r"^[+-]?[0-9]+$")
_MISSING: Any = object()


class FieldKind(StrEnum):
    STRING = "string"
    NUMBER = "number"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    #: `enum` (or `const`): one of the listed values, as a select
    ENUM = "enum"
    OBJECT = "object"
    ARRAY = "array"
    #: anything the generator does not render field by field: a JSON text area
    JSON = "json"


@dataclass(frozen=True)
class FormField:
    #: the HTML name (`answer`, `answer.city`, `answer.tags.0`)
    name: str
    #: the JSON path of its value (`$`, `$.city`, `$.tags[0]`)
    path: str
    label: str
    kind: FieldKind
    required: bool = False
    description: str | None = None
    #: ENUM: the values, in the schema's order
    options: tuple[Any, ...] = ()
    #: OBJECT: its properties' fields, in the schema's order
    children: tuple["FormField", ...] = ()
    #: ARRAY: the field of one item (named with index 0; the template renumbers)
    item: "FormField | None" = None
    #: HTML constraint attributes checked by the browser too (minlength, maxlength, min, max,
    #: step, pattern)
    attrs: dict[str, str] = field(default_factory=dict)
    default: Any = None
    #: an object's property: its name in the schema ("" for the root and array items)
    key: str = ""
    #: the last part of `name` (`city`, `0`, `due%20date`): templates build an item's names
    #: from its array's name and these
    segment: str = ROOT
    #: STRING / NUMBER / INTEGER: the input's `type` (text, email, date, url, number)
    input_type: str = "text"
    #: STRING: a textarea
    multiline: bool = False
    #: the browser's `required` attribute: a required field none of whose enclosing fields may
    #: be left empty (not inside an optional object, nor an array item, nor a boolean)
    html_required: bool = False
    #: ENUM: the option values as sent (the JSON text of each of `options`)
    option_values: tuple[str, ...] = ()
    #: ENUM: what each option shows
    option_labels: tuple[str, ...] = ()
    #: ARRAY: items rendered at least, and at most (None: MAX_ARRAY_ITEMS)
    min_items: int = 0
    max_items: int | None = None


@dataclass(frozen=True)
class AnswerForm:
    #: None: no schema, Approve / Decline
    root: FormField | None
    #: the raw values of a fresh form (from the schema's `default`s), in the shape of
    #: `ReadAnswer.values`: what the template shows when given no submitted values
    initial: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadAnswer:
    #: the payload (meaningful only when `errors` is empty)
    value: Any
    #: field name -> message, for the fields whose value is missing, unreadable or fails the
    #: schema; `answer` for an error about the whole payload
    errors: dict[str, str]
    #: what was submitted, to fill the form again after an error: field name -> raw string, and
    #: an array's name -> its items' names as submitted (templates/_form.html `values`)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


# --- the form ------------------------------------------------------------------------------


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
        return FormField(kind=FieldKind.BOOLEAN, **common)
    properties = node.get("properties")
    if kind in ("object", None) and isinstance(properties, dict) and properties \
            and not _has_combinators(node):
        wanted = node.get("required")
        required_keys = {k for k in wanted if isinstance(k, str)} if isinstance(wanted, list) else set()
        children = tuple(
            _field(sub, name=f"{name}.{_segment_of(prop)}", path=_json_path_child(path, prop),
                   segment=_segment_of(prop), key=prop, label=_humanise(prop),
                   required=prop in required_keys,
                   html_required=html_required and prop in required_keys and not in_array,
                   in_array=in_array, depth=depth + 1)
            for prop, sub in properties.items())
        return FormField(kind=FieldKind.OBJECT, children=children, **common)
    items = node.get("items")
    if kind == "array" and isinstance(items, dict) and "prefixItems" not in node \
            and not _has_combinators(node):
        item = _field(items, name=f"{name}.0", path=f"{path}[0]", segment="0", key="",
                      label="Item", required=False, html_required=False, in_array=True,
                      depth=depth + 1)
        return FormField(kind=FieldKind.ARRAY, item=item, min_items=_count(node.get("minItems")) or 0,
                         max_items=_count(node.get("maxItems")), **common)
    return FormField(kind=FieldKind.JSON, html_required=html_required, **common)


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
    return FormField(kind=FieldKind.STRING, attrs=attrs, input_type=input_type, multiline=multiline,
                     html_required=html_required, **common)


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
            names = [f"{name}.{i}" for i in range(min(len(value), _cap(form_field)))]
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
        return "true" if value is True else None
    if kind is FieldKind.ENUM:
        text = json_text(value)
        return text if text in form_field.option_values else None
    return json.dumps(value, indent=2, ensure_ascii=False)


# --- reading a submitted form --------------------------------------------------------------


@dataclass
class _Submitted:
    """A submitted form's `answer` fields, sorted out along the form's tree."""

    #: raw value by position (segments and item indices after `answer`)
    raw: dict[tuple[str | int, ...], str] = field(default_factory=dict)
    #: an array's position -> the indices submitted under it
    indices: dict[tuple[str | int, ...], set[int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Reading:
    """The payload as it is built: where each of its values came from, and the errors."""

    submitted: _Submitted
    errors: dict[str, str]
    #: a value's JSON path (keys and indices in the payload) -> (the field it came from, its name)
    source: dict[tuple[str | int, ...], tuple[FormField, str]] = field(default_factory=dict)

    def error(self, name: str, message: str) -> None:
        self.errors.setdefault(name, message)


def read_answer(schema: dict[str, Any], items: Sequence[tuple[str, str]]) -> ReadAnswer:
    """The payload of a submitted form (its (name, value) pairs, in order), checked."""
    form = answer_form(schema)
    assert form.root is not None  # a schema always has a root field
    submitted = _sort_out(form.root, items)
    reading = _Reading(submitted, dict(submitted.errors))
    present, value = _read(form.root, (), ROOT, (), True, reading)
    if not present and form.root.kind is FieldKind.BOOLEAN:
        present, value = True, False  # an unchecked box: the root is always required
    if not present:
        reading.error(ROOT, "an answer is required")
    else:
        # checked even after an unreadable field, so every error shows at once; the unreadable
        # field's own message stays first beside it
        for name, message in _schema_errors(schema, value, reading):
            reading.error(name, message)
    return ReadAnswer(value if present else None, reading.errors, submitted.values)


def _sort_out(root: FormField, items: Sequence[tuple[str, str]]) -> _Submitted:
    """The `answer...` pairs placed on the form's tree: other names are the page's own fields
    (csrf, session, ...); a name under `answer` the form does not have is an error."""
    out = _Submitted()
    for name, raw in items:
        if name != ROOT and not name.startswith(ROOT + "."):
            continue
        placed = _place(root, name, out)
        if placed is None:
            continue
        position, node = placed
        if not isinstance(raw, str):  # a file upload (multipart), not typed text
            out.errors.setdefault(name, "not a text value")
        elif node.kind in (FieldKind.OBJECT, FieldKind.ARRAY):
            out.errors.setdefault(ROOT, f"the form has no field {_short_name(name)}")
        elif position in out.raw:
            out.errors.setdefault(name, "given more than once")
        else:
            out.raw[position] = raw
            out.values[name] = raw
    return out


def _place(root: FormField, name: str,
           out: _Submitted) -> tuple[tuple[str | int, ...], FormField] | None:
    """The position and field of `name` (None, with an error, when the form has no such field)."""
    position: list[str | int] = []
    node = root
    container = ROOT
    for segment in name.split(".")[1:]:
        if node.kind is FieldKind.OBJECT:
            child = next((c for c in node.children if c.segment == segment), None)
            if child is None:
                break
            node = child
            position.append(segment)
        elif node.kind is FieldKind.ARRAY and node.item is not None and _INDEX.match(segment):
            index = int(segment)
            if index >= _cap(node):
                out.errors.setdefault(container, f"at most {_cap(node)} items")
                return None
            out.indices.setdefault(tuple(position), set()).add(index)
            item_names = out.values.setdefault(container, [])
            if f"{container}.{index}" not in item_names:
                item_names.append(f"{container}.{index}")
            node = node.item
            position.append(index)
        else:
            break
        container = f"{container}.{segment}"
    else:
        return tuple(position), node
    out.errors.setdefault(ROOT, f"the form has no field {_short_name(name)}")
    return None


def _read(form_field: FormField, position: tuple[str | int, ...], name: str,
          path: tuple[str | int, ...], required: bool, reading: _Reading) -> tuple[bool, Any]:
    """(whether the field gives a value, the value): `position` is where its raw values are,
    `path` where its value goes in the payload (array items close up over dropped ones)."""
    reading.source[path] = (form_field, name)
    kind = form_field.kind
    if kind is FieldKind.OBJECT:
        found: dict[str, Any] = {}
        for child in form_field.children:
            present, value = _read(child, (*position, child.segment), f"{name}.{child.segment}",
                                   (*path, child.key), child.required, reading)
            if present:
                found[child.key] = value
        if not found and not required:
            return False, None
        # an unchecked required box is false, once its object is there at all
        return True, {c.key: found.get(c.key, False) for c in form_field.children
                      if c.key in found or (c.kind is FieldKind.BOOLEAN and c.required)}
    if kind is FieldKind.ARRAY:
        assert form_field.item is not None  # an ARRAY always has its item's field
        values: list[Any] = []
        for index in sorted(reading.submitted.indices.get(position, ())):
            present, value = _read(form_field.item, (*position, index), f"{name}.{index}",
                                   (*path, len(values)), False, reading)
            if present:
                values.append(value)
        return (True, values) if values or required else (False, None)
    raw = reading.submitted.raw.get(position)
    if kind is FieldKind.BOOLEAN:
        if raw is None:
            return False, None
        if raw in ("true", "on"):
            return True, True
        if raw == "false":
            return True, False
        reading.error(name, "not a yes / no value")
        return False, None
    if raw is None or raw == "" or (kind is not FieldKind.STRING and not raw.strip()):
        return False, None
    value, problem = _coerce(form_field, raw)
    if problem is not None:
        reading.error(name, problem)
        return False, None
    return True, value


def _coerce(form_field: FormField, raw: str) -> tuple[Any, str | None]:
    """A field's raw text as its value, or why it cannot be (a message for beside the field)."""
    kind = form_field.kind
    if kind is FieldKind.STRING:
        return (raw.replace("\r\n", "\n") if form_field.multiline else raw), None
    if kind is FieldKind.ENUM:
        if raw in form_field.option_values:
            return form_field.options[form_field.option_values.index(raw)], None
        return None, "not one of the choices"
    if kind is FieldKind.INTEGER:
        number = _parse_number(raw)
        if number is None:
            return None, "not a number"
        if isinstance(number, float) and not number.is_integer():
            return None, "not a whole number"
        whole = int(number)
        if not _INT_MIN <= whole <= _INT_MAX:
            return None, "too large"
        return whole, None
    if kind is FieldKind.NUMBER:
        number = _parse_number(raw)
        if number is None:
            return None, "not a number"
        if isinstance(number, int) and not _INT_MIN <= number <= _INT_MAX:
            number = float(number)  # sent as a double, as a JSON reader would
        if number in (float("inf"), float("-inf")):
            return None, "too large"
        return number, None
    try:  # FieldKind.JSON
        return orjson.loads(raw.replace("\r\n", "\n")), None
    except orjson.JSONDecodeError as exc:
        return None, _short(f"not valid JSON: {exc}")


def _parse_number(raw: str) -> int | float | None:
    """A decimal number as a person or a number input writes it (`3`, `-0.5`, `.5`, `1e3`)."""
    text = raw.strip()
    if len(text) > 100 or not _NUMBER.match(text):
        return None
    if _WHOLE.match(text):
        return int(text)
    return float(text)


def _schema_errors(schema: dict[str, Any], value: Any,
                   reading: _Reading) -> Iterator[tuple[str, str]]:
    """The schema's errors for `value`, each as (the field it belongs beside, the message)."""
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
        errors = list(islice(validator.iter_errors(value), MAX_ERRORS_LOOKED_AT))
    except (SchemaError, TypeError, ValueError, orjson.JSONEncodeError) as exc:
        yield ROOT, _short(f"the question's response_schema cannot be used: {exc}")
        return
    except Unresolvable as exc:
        yield ROOT, _short(f"the question's response_schema has a reference that cannot be resolved: {exc}")
        return
    by_field: dict[str, list[ValidationError]] = {}
    messages: dict[str, str] = {}
    for error in errors:
        for name, message in _placed(error, reading):
            if message is not None:
                messages.setdefault(name, message)
            else:
                by_field.setdefault(name, []).append(error)
    for name, group in by_field.items():
        best = best_match(group)
        if best is not None and name not in messages:
            messages[name] = _short(best.message)
    yield from messages.items()


def _placed(error: ValidationError, reading: _Reading) -> list[tuple[str, str | None]]:
    """Where `error` is shown: its value's field (the deepest one the path reaches), or for a
    missing required property that property's own field. A message of None: the error's own."""
    path = tuple(error.absolute_path)
    name, form_field = _deepest(path, reading)
    if error.validator == "required" and form_field.kind is FieldKind.OBJECT \
            and isinstance(error.instance, dict) and isinstance(error.validator_value, list):
        missing = [k for k in error.validator_value if isinstance(k, str) and k not in error.instance]
        placed: list[tuple[str, str | None]] = []
        for key in missing:
            child = next((c for c in form_field.children if c.key == key), None)
            if child is not None:
                placed.append((f"{name}.{child.segment}", "required"))
        if placed:
            return placed
    return [(name, None)]


def _deepest(path: tuple[str | int, ...], reading: _Reading) -> tuple[str, FormField]:
    for end in range(len(path), -1, -1):
        found = reading.source.get(path[:end])
        if found is not None:
            return found[1], found[0]
    raise AssertionError("the root is always a source")  # pragma: no cover


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> Draft202012Validator:
    """Built as the engine builds it (dispatcher/core/answers.py): Draft 2020-12, nothing fetched."""
    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_NO_RETRIEVAL)


# --- names and paths -----------------------------------------------------------------------


def field_of_path(path: str | None, form: AnswerForm | None = None) -> str:
    """The field name of an engine refusal's JSON `path` (`$.tags[0]` -> `answer.tags.0`).

    With `form`, the deepest field of that form the path reaches (a path inside a JSON text
    area is that text area's name). A path that cannot be read is the whole answer's."""
    parts = _parse_json_path(path) if path else []
    if parts is None:
        return ROOT
    name = ROOT
    node = form.root if form is not None else None
    for part in parts:
        if form is not None:
            if node is None:
                break
            if node.kind is FieldKind.OBJECT and isinstance(part, str):
                node = next((c for c in node.children if c.key == part), None)
                if node is None:
                    break
            elif node.kind is FieldKind.ARRAY and isinstance(part, int):
                node = node.item
            else:
                break
        name += "." + (str(part) if isinstance(part, int) else _segment_of(part))
    return name


def _parse_json_path(path: str) -> list[str | int] | None:
    """`$.a[0]['b c']` as jsonschema writes it -> ["a", 0, "b c"] (None: not such a path)."""
    if not path.startswith("$"):
        return None
    parts: list[str | int] = []
    i, end = 1, len(path)
    while i < end:
        if path[i] == ".":
            match = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*").match(path, i + 1)
            if match is None:
                return None
            parts.append(match.group())
            i = match.end()
        elif path.startswith("['", i):
            key, i = [], i + 2
            while i < end and path[i] != "'":
                if path[i] == "\\" and i + 1 < end:
                    i += 1
                key.append(path[i])
                i += 1
            if not path.startswith("']", i):
                return None
            parts.append("".join(key))
            i += 2
        elif path[i] == "[":
            match = re.compile(r"\[([0-9]{1,9})\]").match(path, i)
            if match is None:
                return None
            parts.append(int(match.group(1)))
            i = match.end()
        else:
            return None
    return parts


def _segment_of(key: str) -> str:
    """A property name as a part of a field name: `.` and `%` (and anything but letters,
    digits, `_`, `-`) percent-encoded, so names split on `.` and work as HTML ids."""
    if _SAFE_SEGMENT.match(key):
        return key
    return "".join(c if _SAFE_SEGMENT.match(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in key)


def key_of_segment(segment: str) -> str:
    """The property name a field name's segment stands for (`due%20date` -> `due date`)."""
    return unquote(segment)


def _json_path_child(path: str, key: str) -> str:
    if _PLAIN_PROPERTY.match(key):
        return f"{path}.{key}"
    return "{}['{}']".format(path, key.replace("\\", "\\\\").replace("'", "\\'"))


# --- small helpers -------------------------------------------------------------------------


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


def _cap(array: FormField) -> int:
    return MAX_ARRAY_ITEMS if array.max_items is None else min(array.max_items, MAX_ARRAY_ITEMS)


def _short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 1] + "…"


def _short_name(name: str) -> str:
    return repr(name) if len(name) <= 100 else repr(name[:100] + "…")
