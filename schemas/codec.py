"""orjson encode/decode for the wire, with the limits checked before pydantic sees anything."""

import json
import os
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from parley.schemas.codes import RefusalCode
from parley.schemas.decision_errors import did_you_mean
from parley.schemas.ids import is_session_id
from parley.schemas.inputs import INPUT_ADAPTER, INPUT_TYPES, Input

#: an entry's `input` field at most (1 MiB); the dispatcher's --max-input-bytes changes it
DEFAULT_MAX_INPUT_BYTES = 1024 * 1024
MAX_DEPTH = 64
#: an entry's fields together (names and values, but the submit function's `admitted`) may be
#: this much over the input limit, for the rest of the envelope (`session`, `id`, `principal`,
#: `ts`, `sig`); the submit function applies the same rule (dispatcher/lua/functions.lua)
ENVELOPE_BYTES = 4096


def entry_bytes(fields: dict[Any, Any]) -> int:
    """The size of a stream entry as both size checks count it: every field's name and value,
    in bytes, but `admitted` (the submit function's mark)."""
    size = 0
    for name, value in fields.items():
        if name in (b"admitted", "admitted"):
            continue
        size += _len(name) + _len(value)
    return size


def _len(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    return len(str(value).encode("utf-8", "surrogatepass"))


def max_input_bytes() -> int:
    return int(os.environ.get("PARLEY_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES))


class InputError(ValueError):
    """A stream entry that cannot be applied. `input_type` is None when its JSON did not parse.
    `idempotency_key` is the entry's `id` when that is a valid key (the refusal uses it up).
    `code`: `invalid_input`, or `too_large` for an `input` (or a whole entry) over the size limit."""

    def __init__(self, message: str, input_type: str | None = None, ids: dict[str, Any] | None = None,
                 idempotency_key: str | None = None, code: RefusalCode = RefusalCode.INVALID_INPUT):
        super().__init__(message)
        self.input_type = input_type
        self.ids = ids or {}
        self.idempotency_key = idempotency_key
        self.code = code


@dataclass(frozen=True, slots=True)
class InputEntry:
    """A decoded, valid entry of an input stream."""

    session: str
    input: Input
    idempotency_key: str | None
    principal: str | None = None


#: The integers orjson keeps exact (and can write back): a wider one would be read as a float.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _scan(value: Any, limit: int) -> tuple[int, bool]:
    """How deep `value` is nested (stopping past `limit`), and whether it holds a float as large
    as an integer orjson could not keep: the only trace of such an integer once parsed."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    wide = False
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth, wide
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, float) and not INT_MIN < item < INT_MAX:
            wide = True
    return deepest, wide


class _TooWide:
    """Stands for an integer literal outside [INT_MIN, INT_MAX] while finding where it is."""


def _exact_int(text: str) -> int | type[_TooWide]:
    # A length check first: Python refuses to parse very long integers at all.
    if len(text) > 21:
        return _TooWide
    n = int(text)
    return n if INT_MIN <= n <= INT_MAX else _TooWide


def wide_integer_path(value: Any) -> str | None:
    """The path (`payload.items[2]`) of the first integer in `value` that does not fit in 64 bits
    (orjson writes none of them, and reads them as floats), or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if item is _TooWide or (isinstance(item, int) and not isinstance(item, bool)
                                and not INT_MIN <= item <= INT_MAX):
            return path or "."
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def _wide_integer_in(raw: bytes) -> str | None:
    """Where `raw` (JSON that orjson parsed) has an integer literal beyond 64 bits, if anywhere."""
    return wide_integer_path(json.loads(raw, parse_int=_exact_int))


ID_FIELDS = ("interrupt_id", "call_id", "parent_id", "message_id", "head")


def entry_ids(value: dict[str, Any]) -> dict[str, Any]:
    """The ids an input names (`input.refused` reports them, so a sender can match its entry)."""
    return {k: value[k] for k in ID_FIELDS if isinstance(value.get(k), str)}


def input_refs(fields: dict[Any, Any]) -> tuple[str | None, dict[str, Any]]:
    """The input's `type` and ids as far as they can be read (for an `input.refused` about an
    entry refused before it was decoded): nothing when `input` is over the size limit, not
    JSON or not an object."""
    raw = fields.get(b"input", fields.get("input"))
    if raw is None:
        return None, {}
    raw = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogatepass")
    if len(raw) > max_input_bytes():
        return None, {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, {}
    if not isinstance(value, dict):
        return None, {}
    input_type = value.get("type")
    return (input_type if isinstance(input_type, str) else None), entry_ids(value)


def _text(fields: dict[bytes | str, bytes | str], name: str) -> str | None:
    """A field as text; UnicodeDecodeError when its bytes are not UTF-8 (never replaced: two
    different ids must not become one)."""
    raw = fields.get(name.encode()) if name.encode() in fields else fields.get(name)
    if raw is None:
        return None
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def session_of(fields: dict[Any, Any]) -> str | None:
    """The entry's session when it is a valid id (so a bad entry can still be reported there)."""
    try:
        session = _text(fields, "session")
    except UnicodeDecodeError:
        return None
    return session if is_session_id(session) else None


def idempotency_key_of(fields: dict[Any, Any]) -> str | None:
    """The entry's `id` when it is a valid idempotency key: 1-256 characters of UTF-8."""
    try:
        key = _text(fields, "id")
    except UnicodeDecodeError:
        return None
    return key if key is not None and 0 < len(key) <= 256 else None


def decode_input_entry(fields: dict[Any, Any], limit: int | None = None) -> InputEntry:
    """Validate one stream entry's fields; raise InputError with a clear message otherwise.
    The error carries the entry's idempotency key when that is valid, for the refusal to use up."""
    idem = idempotency_key_of(fields)
    try:
        return _decode(fields, max_input_bytes() if limit is None else limit, idem)
    except InputError as exc:
        exc.idempotency_key = idem
        raise


def _decode(fields: dict[Any, Any], limit: int, idem: str | None) -> InputEntry:
    # The sizes first, in the submit function's order (`input`, then the whole entry), so both
    # refuse an entry alike. Every field counts, not only `input`: a producer appending to its
    # own stream directly may add fields of any size, held in a dispatcher's memory otherwise.
    key = fields.get(b"input", fields.get("input"))
    raw = key if key is None or isinstance(key, bytes) else str(key).encode("utf-8", "surrogatepass")
    if raw is not None and len(raw) > limit:
        raise InputError(f"`input` is {len(raw)} bytes, over the limit of {limit}",
                         code=RefusalCode.TOO_LARGE)
    if (size := entry_bytes(fields)) > limit + ENVELOPE_BYTES:
        raise InputError(f"the entry has {size} bytes, over the limit of {limit + ENVELOPE_BYTES} "
                         f"(the input limit and {ENVELOPE_BYTES} bytes for the other fields)",
                         code=RefusalCode.TOO_LARGE)
    try:
        session = _text(fields, "session")
    except UnicodeDecodeError:
        raise InputError("`session` is not valid UTF-8") from None
    if session is None:
        raise InputError("entry has no `session` field")
    if not is_session_id(session):
        raise InputError("`session` must be 1-128 characters of [A-Za-z0-9._:/-]; a tenant's id is "
                         "<tenant>/<id>, the tenant 1-64 characters of [A-Za-z0-9._-]")
    if raw is None:
        raise InputError("entry has no `input` field")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"`input` is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError("`input` must be a JSON object")
    input_type = value.get("type")
    ids = entry_ids(value)
    type_name = input_type if isinstance(input_type, str) else None
    depth, wide = _scan(value, MAX_DEPTH)
    if depth > MAX_DEPTH:
        raise InputError(f"`input` is nested deeper than {MAX_DEPTH}", type_name, ids)
    if wide and (path := _wide_integer_in(raw)) is not None:
        raise InputError(f"`input` has an integer beyond 64 bits at {path} (it would lose digits); "
                         "send it as a string", type_name, ids)
    if not isinstance(input_type, str) or input_type not in INPUT_TYPES:
        hint = did_you_mean(input_type, sorted(INPUT_TYPES)) if isinstance(input_type, str) else ""
        raise InputError(f"unknown input type {input_type!r}{hint}; the types are "
                         f"{', '.join(sorted(INPUT_TYPES))}", type_name, ids)
    try:
        parsed = INPUT_ADAPTER.validate_python(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'input'}: {e['msg']}" for e in exc.errors())
        raise InputError(f"invalid {input_type}: {problems}", type_name, ids) from None
    if idem is None:
        try:
            given = _text(fields, "id")
        except UnicodeDecodeError:
            raise InputError("`id` is not valid UTF-8", type_name, ids) from None
        if given is not None:
            raise InputError("`id` must be 1-256 characters", type_name, ids)
    # `principal` is set by the dispatcher only once the entry's signature is verified.
    return InputEntry(session=session, input=parsed, idempotency_key=idem)
