"""orjson encode/decode for the wire, with the limits checked before pydantic sees anything."""

import os
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from parley.schemas.ids import is_session_id
from parley.schemas.inputs import INPUT_ADAPTER, INPUT_TYPES, Input

DEFAULT_MAX_INPUT_BYTES = 256 * 1024
MAX_DEPTH = 64


def max_input_bytes() -> int:
    return int(os.environ.get("PARLEY_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES))


class InputError(ValueError):
    """A stream entry that cannot be applied. `input_type` is None when its JSON did not parse."""

    def __init__(self, message: str, input_type: str | None = None, ids: dict[str, Any] | None = None):
        super().__init__(message)
        self.input_type = input_type
        self.ids = ids or {}


@dataclass(frozen=True, slots=True)
class InputEntry:
    """A decoded, valid entry of an input stream."""

    session: str
    input: Input
    idempotency_key: str | None
    principal: str | None = None


def _depth(value: Any, limit: int) -> int:
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


ID_FIELDS = ("interrupt_id", "call_id", "parent_id", "message_id", "head")


def entry_ids(value: dict[str, Any]) -> dict[str, Any]:
    """The ids an input names (`input.refused` reports them, so a sender can match its entry)."""
    return {k: value[k] for k in ID_FIELDS if isinstance(value.get(k), str)}


def _text(fields: dict[bytes | str, bytes | str], name: str) -> str | None:
    raw = fields.get(name.encode()) if name.encode() in fields else fields.get(name)
    if raw is None:
        return None
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def session_of(fields: dict[Any, Any]) -> str | None:
    """The entry's session when it is a valid id (so a bad entry can still be reported there)."""
    session = _text(fields, "session")
    return session if is_session_id(session) else None


def decode_input_entry(fields: dict[Any, Any], limit: int | None = None) -> InputEntry:
    """Validate one stream entry's fields; raise InputError with a clear message otherwise."""
    limit = max_input_bytes() if limit is None else limit
    session = _text(fields, "session")
    if session is None:
        raise InputError("entry has no `session` field")
    if not is_session_id(session):
        raise InputError("`session` must be 1-128 characters of [A-Za-z0-9._:-]")
    key = fields.get(b"input", fields.get("input"))
    if key is None:
        raise InputError("entry has no `input` field")
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8", "surrogatepass")
    if len(raw) > limit:
        raise InputError(f"`input` is {len(raw)} bytes, over the limit of {limit}")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"`input` is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError("`input` must be a JSON object")
    input_type = value.get("type")
    ids = entry_ids(value)
    type_name = input_type if isinstance(input_type, str) else None
    if _depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise InputError(f"`input` is nested deeper than {MAX_DEPTH}", type_name, ids)
    if not isinstance(input_type, str) or input_type not in INPUT_TYPES:
        raise InputError(f"unknown input type {input_type!r}", type_name, ids)
    try:
        parsed = INPUT_ADAPTER.validate_python(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'input'}: {e['msg']}" for e in exc.errors())
        raise InputError(f"invalid {input_type}: {problems}", type_name, ids) from None
    idem = _text(fields, "id")
    if idem is not None and not (0 < len(idem) <= 256):
        raise InputError("`id` must be 1-256 characters", type_name, ids)
    # `principal` is set by the dispatcher only once the entry's signature is verified.
    return InputEntry(session=session, input=parsed, idempotency_key=idem)
