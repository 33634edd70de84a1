"""Fuzz corpus for input entries (docs/protocol.md, Writing inputs, Inputs, Order of checks,
Rejected entries): valid inputs, and the ways to break them.

Everything here is driven by a `random.Random`, so the same generators serve the hypothesis
tests (through `st.randoms()`, which hypothesis controls and shrinks) and the live-dispatcher
fuzz (through a seeded `random.Random`, so a run is reproducible from its seed).

An entry is a `dict[bytes, bytes]`, exactly what a producer XADDs and what the dispatcher
reads back. Whether it is bad is never guessed here: `oracle()` asks the decoder itself.
"""

import random
import string
import time
from collections.abc import Callable
from typing import Any

import orjson

from parley.schemas.codec import (
    DEFAULT_MAX_INPUT_BYTES,
    MAX_DEPTH,
    InputEntry,
    InputError,
    decode_input_entry,
)
from parley.schemas.signing import Keyring, Unauthorized

Fields = dict[bytes, bytes]
Mutator = Callable[[random.Random, Fields, int], Fields]

TYPES = ("session.create", "message.create", "interrupt.resume", "branch.switch", "tool.result")
# Every field of every input type (the envelope's `type` included), for "wrong type" mutations.
FIELDS_OF = {
    "session.create": ("type", "budget", "metadata", "parent"),
    "message.create": ("type", "content", "parent_id", "message_id"),
    "interrupt.resume": ("type", "interrupt_id", "payload"),
    "branch.switch": ("type", "head"),
    "tool.result": ("type", "call_id", "result", "error"),
}
ID_ALPHABET = string.ascii_letters + string.digits + "._:-"
# Text that stresses JSON encoding: quotes, escapes, controls, non-BMP, RTL, combining marks.
TEXT_ALPHABET = (string.ascii_letters + string.digits + " \t\n\r\"\\/{}[]:,'\x00\x01\x1f\x7f"
                 + "éß中文😀𝄞\u200b\u202e\ufeff\u0301")
INVALID_UTF8 = (b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80")
# JSON-ish fragments spliced into the raw bytes.
SPLICES = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"\\ud800", b"\\udc00", b"\\u0000",
           b"\\x41", b"/* */", b"//", b",", b",,", b"}", b"]", b"{", b"[", b"\"", b"\\", b":", b"null",
           b"\x00", b"\xef\xbb\xbf", b"  \n\t ", b"0x10", b"01", b"1.", b".5", b"+1", b"true1",
           b"123456789012345678901234567890", b"\"type\"", b"\"type\":\"message.create\",")


# ---- random pieces -----------------------------------------------------------------------------


def rand_text(rng: random.Random, max_size: int = 40, alphabet: str = TEXT_ALPHABET) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_size)))


def rand_name(rng: random.Random, max_size: int = 24) -> str:
    return "".join(rng.choice(ID_ALPHABET) for _ in range(rng.randint(1, max_size)))


def rand_scalar(rng: random.Random) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**63), 2**64 - 1)  # orjson's integer range
    if kind == 3:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**63 - 1, 2**63, 2**64 - 1])
    if kind == 4:
        return rng.choice([0.0, -0.0, 1.5, -1e308, 1e308, 5e-324, 3.141592653589793])
    if kind == 5:
        return rng.uniform(-1e6, 1e6)
    if kind == 6:
        return rand_name(rng)
    return rand_text(rng)


def rand_json(rng: random.Random, depth: int = 3) -> Any:
    """A random JSON value: scalars, lists and objects, a few levels deep."""
    roll = rng.random()
    if depth <= 0 or roll < 0.5:
        return rand_scalar(rng)
    if roll < 0.75:
        return [rand_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {rand_text(rng, 8): rand_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def nested_bytes(rng: random.Random, depth: int) -> bytes:
    """`depth` levels of nested arrays/objects, built as text (orjson.dumps stops at 255)."""
    opens, closes = [], []
    for _ in range(depth - 1):
        if rng.random() < 0.5:
            opens.append(b"[")
            closes.append(b"]")
        else:
            opens.append(b'{"k":')
            closes.append(b"}")
    return b"".join(opens) + b"[1]" + b"".join(reversed(closes))


# ---- valid inputs and entries ------------------------------------------------------------------


def valid_input(rng: random.Random, kind: str | None = None, content: str | None = None) -> dict[str, Any]:
    """A valid input of `kind` (random when None), optional fields present or not."""
    kind = kind or rng.choice(TYPES)
    value: dict[str, Any] = {"type": kind}
    if kind == "session.create":
        if rng.random() < 0.5:
            keys = [k for k in ("llm_calls", "tool_calls", "tokens") if rng.random() < 0.5]
            value["budget"] = None if rng.random() < 0.2 else {
                k: rng.choice([None, 0, rng.randint(0, 2**63 - 1)]) for k in keys}
        if rng.random() < 0.5:
            value["metadata"] = None if rng.random() < 0.2 else {
                rand_text(rng, 8): rand_json(rng) for _ in range(rng.randint(0, 4))}
    elif kind == "message.create":
        value["content"] = content if content is not None else rand_text(rng, 200)
        if rng.random() < 0.3:
            value["parent_id"] = None  # a new root
        if rng.random() < 0.3:
            value["message_id"] = rng.choice([None, rand_name(rng, 128)])
    elif kind == "interrupt.resume":
        value["interrupt_id"] = rand_name(rng, 128)
        if rng.random() < 0.7:
            value["payload"] = rand_json(rng)
    elif kind == "branch.switch":
        value["head"] = rand_name(rng, 128)
    else:
        value["call_id"] = rand_name(rng, 128)
        if rng.random() < 0.5:
            value["result"] = rand_json(rng)
        else:
            value["error"] = rand_text(rng, 100)
    return value


def entry(session: str, value: Any, idempotency_key: str | None = None, **extra: bytes) -> Fields:
    fields: Fields = {b"session": session.encode(), b"input": orjson.dumps(value)}
    if idempotency_key is not None:
        fields[b"id"] = idempotency_key.encode()
    fields.update({k.encode(): v for k, v in extra.items()})
    return fields


# ---- mutations ---------------------------------------------------------------------------------
# Each takes (rng, fields, limit) and returns new fields; `limit` is the input size limit in force.


def _value(fields: Fields) -> Any:
    """The input's JSON value; None when it does not parse, or nests too deep to dump again."""
    try:
        value = orjson.loads(fields.get(b"input", b""))
        orjson.dumps(value)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    return value


def _kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def _with_value(fields: Fields, value: Any) -> Fields:
    try:
        return {**fields, b"input": orjson.dumps(value)}
    except orjson.JSONEncodeError:
        return dict(fields)


def _with_raw(fields: Fields, raw: bytes) -> Fields:
    return {**fields, b"input": raw}


def drop_field(rng: random.Random, fields: Fields, limit: int) -> Fields:
    value = _value(fields)
    if not isinstance(value, dict) or not value:
        return drop_entry_field(rng, fields, limit)
    value.pop(rng.choice(sorted(value)))
    return _with_value(fields, value)


def retype_field(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """Any field of the input's type (present or not) set to a random JSON value of any type."""
    value = _value(fields)
    if not isinstance(value, dict):
        return flip_bytes(rng, fields, limit)
    names = FIELDS_OF.get(_kind(value) or "", ("type",))
    value[rng.choice(names)] = rand_json(rng)
    return _with_value(fields, value)


def garbage_key(rng: random.Random, fields: Fields, limit: int) -> Fields:
    value = _value(fields)
    if not isinstance(value, dict):
        return splice(rng, fields, limit)
    key = rng.choice([rand_text(rng, 12), "Type", "type ", "content\x00", "budget", "extra", "__proto__",
                      "parent", "payload", "principal", ""])
    value[key] = rand_json(rng)
    return _with_value(fields, value)


def bad_budget(rng: random.Random, fields: Fields, limit: int) -> Fields:
    value = _value(fields)
    if not isinstance(value, dict):
        return truncate(rng, fields, limit)
    value["budget"] = rng.choice([{"tokens": -1}, {"llm_calls": 1.5}, {"tool_calls": "3"}, {"tokens": 2**63},
                                  {"tokens": 1e300}, {"nope": 1}, [], "x", {"tokens": True}])
    return _with_value(fields, value)


def bad_type(rng: random.Random, fields: Fields, limit: int) -> Fields:
    value = _value(fields)
    if not isinstance(value, dict):
        value = {}
    value["type"] = rng.choice([None, 1, True, [], {}, "", "Message.Create", "message.create ",
                                "message_create", "session.delete", rand_text(rng, 16), "tool.result\x00",
                                rng.choice(TYPES)])
    return _with_value(fields, value)


def bad_name(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """An id field (interrupt_id, call_id, head, parent_id, message_id) outside [A-Za-z0-9._:-]{1,128}."""
    value = _value(fields)
    if not isinstance(value, dict):
        return drop_entry_field(rng, fields, limit)
    key = rng.choice(["interrupt_id", "call_id", "head", "parent_id", "message_id"])
    value[key] = rng.choice(["", "a" * 129, "a b", "é", "a/b", "a\n", "\na", rand_text(rng, 20),
                             "a" * 128, "ok-id"])
    return _with_value(fields, value)


def tool_outcomes(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """tool.result with both or neither of `result` and `error`."""
    value = {"type": "tool.result", "call_id": rand_name(rng)}
    if rng.random() < 0.5:
        value.update(result=rand_json(rng), error=rand_text(rng))
    return _with_value(fields, value)


def wrong_root(rng: random.Random, fields: Fields, limit: int) -> Fields:
    value = _value(fields)
    keys = list(value) if isinstance(value, dict) else None
    return _with_value(fields, rng.choice([[value], keys, "message.create", 42, 1.5, None, True, [],
                                           rand_json(rng)]))


def deep_nesting(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """A payload/metadata/result (or any field) nested around MAX_DEPTH, or past orjson's 1024."""
    value = _value(fields)
    kind = _kind(value) or ""
    depth = rng.choice([MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2,
                        rng.randint(MAX_DEPTH, 300), 1100])
    field = {"session.create": "metadata", "tool.result": "result"}.get(kind, "payload")
    if kind == "session.create":
        nested = b'{"m":' + nested_bytes(rng, depth - 1) + b"}"
    else:
        nested = nested_bytes(rng, depth)
    try:
        head = orjson.dumps(value if isinstance(value, dict) else None)[:-1]
    except orjson.JSONEncodeError:  # already nested past what orjson.dumps allows
        head = b"nul"
    if not head.startswith(b"{"):
        head = b'{"type":"interrupt.resume","interrupt_id":"i"'
    sep = b"," if head != b"{" else b""
    return _with_raw(fields, head + sep + b'"' + field.encode() + b'":' + nested + b"}")


def oversize(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """Pad a string field so the input lands within a few bytes of the limit, either side."""
    value = _value(fields)
    if not isinstance(value, dict):
        value = {"type": "message.create", "content": ""}
    key = {"message.create": "content", "tool.result": "error"}.get(_kind(value) or "", "pad")
    value[key] = ""
    if key == "error":
        value.pop("result", None)
    base = len(orjson.dumps(value))
    value[key] = "x" * max(0, limit - base + rng.randint(-3, 3))
    return _with_value(fields, value)


def truncate(rng: random.Random, fields: Fields, limit: int) -> Fields:
    raw = fields.get(b"input", b"")
    return _with_raw(fields, raw[: rng.randrange(len(raw))] if raw else raw)


def flip_bytes(rng: random.Random, fields: Fields, limit: int) -> Fields:
    raw = bytearray(fields.get(b"input", b"") or b"{}")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(raw))
        raw[i] ^= rng.randint(1, 255)
    return _with_raw(fields, bytes(raw))


def invalid_utf8(rng: random.Random, fields: Fields, limit: int) -> Fields:
    raw = fields.get(b"input", b"") or b"{}"
    quotes = [i for i, c in enumerate(raw) if c == ord('"')] or [0]
    i = rng.choice(quotes) + 1 if rng.random() < 0.7 else rng.randrange(len(raw) + 1)
    return _with_raw(fields, raw[:i] + rng.choice(INVALID_UTF8) + raw[i:])


def splice(rng: random.Random, fields: Fields, limit: int) -> Fields:
    raw = fields.get(b"input", b"") or b"{}"
    i = rng.randrange(len(raw) + 1)
    return _with_raw(fields, raw[:i] + rng.choice(SPLICES) + raw[i:])


def duplicate_key(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """Repeat a key inside the object text: orjson keeps the last one."""
    raw = fields.get(b"input", b"") or b"{}"
    value = _value(fields)
    key = rng.choice(sorted(value)) if isinstance(value, dict) and value else "type"
    dup = b'"' + key.encode() + b'":' + orjson.dumps(rand_json(rng, 1))
    if rng.random() < 0.5 and raw.startswith(b"{"):  # first occurrence: the original wins
        return _with_raw(fields, b"{" + dup + (b"," if raw != b"{}" else b"") + raw[1:])
    if raw.endswith(b"}"):  # last occurrence: the duplicate wins
        return _with_raw(fields, raw[:-1] + (b"," if raw != b"{}" else b"") + dup + b"}")
    return _with_raw(fields, raw + dup)


def escaped_keys(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """`"type"` spelled with \\u escapes, whitespace around tokens: still the same JSON."""
    raw = fields.get(b"input", b"") or b"{}"
    raw = raw.replace(b'"type"', b'"\\u0074ype"', 1) if rng.random() < 0.5 else raw
    return _with_raw(fields, b" \n" + raw.replace(b":", b" : ", 1) + b"\t")


def drop_entry_field(rng: random.Random, fields: Fields, limit: int) -> Fields:
    fields = dict(fields)
    for key in rng.sample([b"session", b"input", b"id"], rng.randint(1, 2)):
        fields.pop(key, None)
    return fields or {b"x": b""}


def bad_session(rng: random.Random, fields: Fields, limit: int) -> Fields:
    session = fields.get(b"session", b"s")
    bad = rng.choice([b"", b"a" * 129, b"a" * 257, b"bad id!", b"s/1", "sé".encode(), b"s{1}", b"\xff\xfe",
                      session + b" ", b" " + session, session + rng.choice(INVALID_UTF8),
                      session + b"\x00", b"a" * 128 + b":sub-1", b"a" * 250 + b":sub-1", session + b"\n",
                      rand_text(rng, 30).encode()])
    return {**fields, b"session": bad}


def bad_id(rng: random.Random, fields: Fields, limit: int) -> Fields:
    idem = rng.choice([b"", b"k" * 257, b"k" * 256, "é".encode() * 200, "é".encode() * 257, b"\xff\xfe\xfd",
                       rand_text(rng, 20).encode()])
    return {**fields, b"id": idem}


def extra_fields(rng: random.Random, fields: Fields, limit: int, utf8_keys: bool = True) -> Fields:
    """Unknown fields, case variants of known ones, fields the rejected copy adds, signing fields."""
    keys = [b"Session", b"INPUT", b" session", b"input ", b"error", b"source", b"entry", b"principal",
            b"ts", b"trace", rand_text(rng, 10).encode() or b"k"]
    if not utf8_keys:
        keys += [b"\xff", b"in\xc3put", b"\xed\xa0\x80"]
    extra = {rng.choice(keys): rng.choice([b"", b"x", fields.get(b"input", b""), rng.choice(INVALID_UTF8),
                                           rand_text(rng, 20).encode()])
             for _ in range(rng.randint(1, 3))}
    return {**fields, **extra}


def signed_looking(rng: random.Random, fields: Fields, limit: int) -> Fields:
    """A `sig` with signing off: the dispatcher refuses it `unauthorized` (also to the rejected stream)."""
    return {**fields, b"sig": rng.choice([b"", b"00", b"f" * 64]), b"principal": b"mallory",
            b"ts": str(int(time.time() * 1000)).encode(), b"id": fields.get(b"id", b"k-signed")}


def swap_fields(rng: random.Random, fields: Fields, limit: int) -> Fields:
    return {**fields, b"session": fields.get(b"input", b""), b"input": fields.get(b"session", b"")}


MUTATORS: tuple[Mutator, ...] = (
    drop_field, retype_field, garbage_key, bad_budget, bad_type, bad_name, tool_outcomes, wrong_root,
    deep_nesting, oversize, truncate, flip_bytes, invalid_utf8, splice, duplicate_key, escaped_keys,
    drop_entry_field, bad_session, bad_id, extra_fields, signed_looking, swap_fields,
)


def mutate(rng: random.Random, fields: Fields, limit: int = DEFAULT_MAX_INPUT_BYTES,
           utf8_keys: bool = True, rounds: int | None = None) -> tuple[Fields, list[str]]:
    """Apply 1-3 random mutations; returns the new fields and the mutations' names."""
    names = []
    for _ in range(rounds if rounds is not None else rng.choice([1, 1, 1, 2, 3])):
        m = rng.choice(MUTATORS)
        names.append(m.__name__)
        fields = extra_fields(rng, fields, limit, utf8_keys) if m is extra_fields else m(rng, fields, limit)
    return fields, names


def random_fields(rng: random.Random, utf8_keys: bool = True) -> Fields:
    """A random field map: missing, extra and random keys, random bytes or JSON-ish values."""
    keys = [b"session", b"input", b"id", b"sig", b"principal", b"ts", b"type", b"content"]
    fields: Fields = {}
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.7:
            key = rng.choice(keys)
        else:
            key = bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
            if utf8_keys:
                key = key.decode("utf-8", "replace").encode()
        kind = rng.randrange(5)
        if kind == 0:
            val = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        elif kind == 1:
            val = rand_name(rng).encode()
        elif kind == 2:
            val = orjson.dumps(rand_json(rng))
        elif kind == 3:
            val = orjson.dumps(valid_input(rng))
        else:
            val = rand_text(rng).encode()
        fields[key] = val
    return fields


# ---- the oracle --------------------------------------------------------------------------------

NO_KEYS = Keyring({})


def oracle(fields: dict[Any, Any], limit: int | None = None) -> InputEntry | InputError | Unauthorized:
    """What the dispatcher must make of an entry: the decoded entry, or why it is rejected.

    As in `EntryDecoder.prepare`, an entry carrying a `sig` is verified first (with signing off,
    no principal is known: refused `unauthorized`); then the decoder decides.
    """
    try:
        NO_KEYS.verify(fields, int(time.time() * 1000))
    except Unauthorized as exc:
        return exc
    try:
        return decode_input_entry(fields, limit)
    except InputError as exc:
        return exc
