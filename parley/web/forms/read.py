"""A submitted answer form read back into the JSON payload (pure): `read_answer(schema, items)`
turns the form's (name, value) pairs into the payload and checks it against the schema
(check.py), with each error keyed by the field's HTML name so the page shows it beside that
field before anything is sent.

Empty fields: an empty text field of a *required* string property (and the root's) is `""`:
the schema decides whether that will do (a `minLength` of 1 gives its error beside the field),
and such a field has no HTML `required` attribute unless `minLength` is at least 1. Any other
empty field (an optional string, a number, a select, a JSON text area, an array item) is left
out of the answer (an empty required number, select or JSON field is then the schema's
"required" error beside it). An object whose fields give nothing but those empty strings and
unticked boxes is left out when optional (when required it is there, so its own required fields
are reported); an array item made only of empty fields is dropped, even when the item schema
would take `""`, and the remaining items keep their order. The root is always present (`{}` /
`[]` when empty; a root scalar not submitted at all, or an empty root number, select or JSON
field, is an error on `answer`).

Size: a single submitted value over MAX_VALUE_BYTES is an error beside its field and is never
parsed nor checked (a schema's `pattern` can take long on a long text).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from parley.web.forms.check import Sources, schema_errors, short
from parley.web.forms.generate import answer_form
from parley.web.forms.model import ROOT, FieldKind, FormField, ReadAnswer, item_cap

#: a submitted value longer than this (UTF-8 bytes) is refused beside its field before it is
#: parsed or checked: a backtracking `pattern` must never run over a huge text
MAX_VALUE_BYTES = 64 * 1024
#: integers the engine can encode (orjson: signed or unsigned 64-bit)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_INDEX = re.compile(r"^(0|[1-9][0-9]{0,8})$")
_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_WHOLE = re.compile(r"^[+-]?[0-9]+$")


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
    source: Sources = field(default_factory=dict)

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
        for name, message in schema_errors(schema, value, reading.source):
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
        elif len(raw) > MAX_VALUE_BYTES or len(raw.encode()) > MAX_VALUE_BYTES:
            # kept out of `raw`: never parsed nor matched; shown again so it can be shortened
            out.errors.setdefault(name, f"too long: at most {MAX_VALUE_BYTES // 1024} KiB")
            out.values[name] = raw
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
            if index >= item_cap(node):
                out.errors.setdefault(container, f"at most {item_cap(node)} items")
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


# --- the payload, field by field -----------------------------------------------------------


def _read(form_field: FormField, position: tuple[str | int, ...], name: str,
          path: tuple[str | int, ...], required: bool, reading: _Reading) -> tuple[bool, Any]:
    """(whether the field gives a value, the value): `position` is where its raw values are,
    `path` where its value goes in the payload (array items close up over dropped ones)."""
    reading.source[path] = (form_field, name)
    if form_field.kind is FieldKind.OBJECT:
        return _read_object(form_field, position, name, path, required, reading)
    if form_field.kind is FieldKind.ARRAY:
        return _read_array(form_field, position, name, path, required, reading)
    return _read_value(form_field, reading.submitted.raw.get(position), name, required, reading)


def _read_object(form_field: FormField, position: tuple[str | int, ...], name: str,
                 path: tuple[str | int, ...], required: bool, reading: _Reading) -> tuple[bool, Any]:
    found: dict[str, Any] = {}
    for child in form_field.children:
        present, value = _read(child, (*position, child.segment), f"{name}.{child.segment}",
                               (*path, child.key), child.required, reading)
        if present:
            found[child.key] = value
    if not required and all(_blank(c, found[c.key]) for c in form_field.children if c.key in found):
        return False, None  # nothing filled in (a required string's "" is not an answer alone)
    # an unticked required box is false, once its object is there at all
    return True, {c.key: found.get(c.key, False) for c in form_field.children
                  if c.key in found or (c.kind is FieldKind.BOOLEAN and c.checkbox)}


def _read_array(form_field: FormField, position: tuple[str | int, ...], name: str,
                path: tuple[str | int, ...], required: bool, reading: _Reading) -> tuple[bool, Any]:
    assert form_field.item is not None  # an ARRAY always has its item's field
    values: list[Any] = []
    for index in sorted(reading.submitted.indices.get(position, ())):
        present, value = _read(form_field.item, (*position, index), f"{name}.{index}",
                               (*path, len(values)), False, reading)
        if present:
            values.append(value)
    return (True, values) if values or required else (False, None)


def _read_value(form_field: FormField, raw: str | None, name: str, required: bool,
                reading: _Reading) -> tuple[bool, Any]:
    """A field of one value (not an object nor an array) from its raw text (None: not sent)."""
    kind = form_field.kind
    if kind is FieldKind.BOOLEAN:
        if raw is None or raw == "":  # unticked, or the select's "no answer"
            return False, None
        if raw in ("true", "on"):
            return True, True
        if raw == "false":
            return True, False
        reading.error(name, "not a yes / no value")
        return False, None
    if raw is None:
        return False, None
    if raw == "" and kind is FieldKind.STRING and required:
        return True, ""  # the schema decides whether "" will do (minLength)
    if raw == "" or (kind is not FieldKind.STRING and not raw.strip()):
        return False, None
    value, problem = _coerce(form_field, raw)
    if problem is not None:
        reading.error(name, problem)
        return False, None
    return True, value


def _blank(form_field: FormField, value: Any) -> bool:
    """Whether `value`, read from `form_field`, is only what untouched fields give (a required
    string's "", an unticked box, an object or array of nothing else): an optional object or an
    array item of only such values is left out, as if nothing were filled in."""
    kind = form_field.kind
    if kind is FieldKind.STRING:
        return value == ""
    if kind is FieldKind.BOOLEAN:
        return form_field.checkbox and value is False
    if kind is FieldKind.OBJECT:
        return isinstance(value, dict) and all(
            _blank(c, value[c.key]) for c in form_field.children if c.key in value)
    if kind is FieldKind.ARRAY:
        return value == []
    return False


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
        return None, short(f"not valid JSON: {exc}")


def _parse_number(raw: str) -> int | float | None:
    """A decimal number as a person or a number input writes it (`3`, `-0.5`, `.5`, `1e3`)."""
    text = raw.strip()
    if len(text) > 100 or not _NUMBER.match(text):
        return None
    if _WHOLE.match(text):
        return int(text)
    return float(text)


def _short_name(name: str) -> str:
    return repr(name) if len(name) <= 100 else repr(name[:100] + "…")
