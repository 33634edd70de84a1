"""An answer checked against its schema, each error placed beside the field it is about.

Checked as the engine checks it (Draft 2020-12, nothing fetched: schemas/answers.py).
An error goes beside the deepest field its value's path reaches (a path inside a JSON text
area is that text area's); a missing required property's error beside that property's field;
one about the whole payload, or a schema that cannot be used, beside `answer`. Messages are cut
to MAX_MESSAGE_CHARS (they quote the value).
"""

from collections.abc import Iterator
from functools import lru_cache
from itertools import islice
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

from parley.web.forms.model import ROOT, FieldKind, FormField

#: schema errors looked at (an answer can fail in as many places as it has items)
MAX_ERRORS_LOOKED_AT = 50
#: an error message beside a field is cut to this many characters (messages quote the value)
MAX_MESSAGE_CHARS = 300
#: no retrieval: a `$ref` outside the schema is never fetched (as in the engine)
_NO_RETRIEVAL: Registry[Any] = Registry()

#: where each value of an answer came from: its JSON path (keys and indices in the payload) ->
#: (the field, that field's name)
Sources = dict[tuple[str | int, ...], tuple[FormField, str]]


def schema_errors(schema: dict[str, Any], value: Any,
                  source: Sources) -> Iterator[tuple[str, str]]:
    """The schema's errors for `value`, each as (the field it belongs beside, the message)."""
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
        errors = list(islice(validator.iter_errors(value), MAX_ERRORS_LOOKED_AT))
    except (SchemaError, TypeError, ValueError, orjson.JSONEncodeError) as exc:
        yield ROOT, short(f"the question's response_schema cannot be used: {exc}")
        return
    except Unresolvable as exc:
        yield ROOT, short(f"the question's response_schema has a reference that cannot be resolved: {exc}")
        return
    by_field: dict[str, list[ValidationError]] = {}
    messages: dict[str, str] = {}
    for error in errors:
        for name, message in _placed(error, source):
            if message is not None:
                messages.setdefault(name, message)
            else:
                by_field.setdefault(name, []).append(error)
    for name, group in by_field.items():
        best = best_match(group)
        if best is not None and name not in messages:
            messages[name] = short(best.message)
    yield from messages.items()


def _placed(error: ValidationError, source: Sources) -> list[tuple[str, str | None]]:
    """Where `error` is shown: its value's field (the deepest one the path reaches), or for a
    missing required property that property's own field. A message of None: the error's own."""
    path = tuple(error.absolute_path)
    name, form_field = _deepest(path, source)
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


def _deepest(path: tuple[str | int, ...], source: Sources) -> tuple[str, FormField]:
    """The name and field of the deepest value along `path` that came from a field."""
    for end in range(len(path), -1, -1):
        found = source.get(path[:end])
        if found is not None:
            return found[1], found[0]
    raise AssertionError("the root is always a source")  # pragma: no cover


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> Draft202012Validator:
    """Built as the engine builds it (schemas/answers.py): Draft 2020-12, nothing fetched."""
    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_NO_RETRIEVAL)


def short(message: str) -> str:
    """`message` cut to MAX_MESSAGE_CHARS."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 1] + "…"
