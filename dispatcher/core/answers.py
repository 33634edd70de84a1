"""Typed answers: an interrupt's `response_schema` (JSON Schema, Draft 2020-12).

Checked twice, both pure: when the decision raising the interrupt is validated (the schema
itself, its size, and the `default` a deadline would deliver), and when a resume arrives
(its payload). Validators are compiled once per schema text and reused: a schema is parsed
when its interrupt is raised and again for each resume, often the same few schemas fleet-wide.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing.exceptions import Unresolvable

#: the largest `response_schema`, as compact JSON: it is stored in the session and the index
MAX_SCHEMA_BYTES = 16_384


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
    try:
        _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
    except SchemaError as exc:
        return f"is not valid JSON Schema (Draft 2020-12): {exc.message} at {exc.json_path}"
    return None


def mismatch(schema: dict[str, Any], value: Any) -> Mismatch | None:
    """How `value` fails `schema` (the most relevant error), or None when it matches.

    Nothing is fetched: a `$ref` to a document outside the schema cannot be resolved, and no
    answer can match it (the engine does no I/O while applying an input)."""
    validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
    try:
        error = best_match(validator.iter_errors(value))
    except Unresolvable as exc:
        return Mismatch(f"the schema's reference cannot be resolved: {exc}", "$")
    return None if error is None else Mismatch(error.message, error.json_path)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)
