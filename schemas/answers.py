"""Typed answers: an interrupt's `response_schema` (JSON Schema, Draft 2020-12).

Checked twice, both pure: when the decision raising the interrupt is validated (the schema
itself, its size, and the `default` a deadline would deliver), and when a resume arrives
(its payload). Validators are compiled once per schema text and reused: a schema is parsed
when its interrupt is raised and again for each resume, often the same few schemas fleet-wide.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

# jsonschema is imported when the first typed question is checked, not with the core: it is a
# tenth of a second of every dispatcher's and CLI command's start, and most sessions ask none.

#: the largest `response_schema`, as compact JSON: it is stored in the session and the index
MAX_SCHEMA_BYTES = 16_384
#: the largest answer to a typed question, as compact JSON. A producer's payload is checked
#: inside the dispatcher's transition: its cost must stay small whatever the producer sends.
MAX_TYPED_ANSWER_BYTES = 16_384
#: errors looked at to pick the one reported (an answer can fail in as many places as it has items)
MAX_ERRORS_LOOKED_AT = 50
#: keywords refused in a response_schema: checking them costs more than linear time in the
#: answer (uniqueItems compares every pair of items)
REFUSED_KEYWORDS = frozenset({"uniqueItems"})


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Why an answer does not match: the validator's message and where (a JSON path, `$...`)."""

    message: str
    path: str


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot be an interrupt's response_schema, or None when it can."""
    size = len(orjson.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        return f"is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES}"
    for key, value in _keywords(schema):
        if key in REFUSED_KEYWORDS:
            return f"uses `{key}`, which is not supported (its check is quadratic in the answer)"
        if key in ("$ref", "$dynamicRef") and not (isinstance(value, str) and value.startswith("#")):
            return f"has `{key}: {value!r}`: references must stay inside the schema (`#...`)"
    from jsonschema.exceptions import SchemaError

    try:
        _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
    except SchemaError as exc:
        return f"is not valid JSON Schema (Draft 2020-12): {exc.message} at {exc.json_path}"
    return None


def mismatch(schema: dict[str, Any], value: Any) -> Mismatch | None:
    """How `value` fails `schema` (the most relevant error), or None when it matches.

    Nothing is fetched: a `$ref` to a document outside the schema cannot be resolved, and no
    answer can match it (the engine does no I/O while applying an input). An answer over
    MAX_TYPED_ANSWER_BYTES does not match, whatever the schema."""
    size = len(orjson.dumps(value))
    if size > MAX_TYPED_ANSWER_BYTES:
        return Mismatch(f"an answer to a typed question is at most {MAX_TYPED_ANSWER_BYTES} bytes "
                        f"as JSON; this one is {size}", "$")
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
    try:
        error = best_match(islice(validator.iter_errors(value), MAX_ERRORS_LOOKED_AT))
    except Unresolvable as exc:
        return Mismatch(f"the schema's reference cannot be resolved: {exc}", "$")
    return None if error is None else Mismatch(error.message, error.json_path)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> "Draft202012Validator":
    from jsonschema import Draft202012Validator
    from referencing import Registry

    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    # an empty registry: a reference outside the schema is never fetched (the engine does no
    # I/O while applying an input; jsonschema's default would download it)
    return Draft202012Validator(schema, registry=Registry())


def _keywords(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of every object in a schema, nested ones included."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                yield key, value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
