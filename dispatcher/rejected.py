"""The copy of a bad entry kept in the rejected stream (docs/protocol.md, "Rejected entries").

Bounded in bytes whatever the producer sent: each field's value is cut to its first
`VALUE_BYTES`, its original size recorded next to it (`<field>_bytes`); names are cut to
`NAME_BYTES` and at most `MAX_FIELDS` fields are kept (how many more there were:
`fields_dropped`). So the stream's count cap is a cap in bytes too: 20 entries of 5 MB keep
about 80 KB, not 100 MB. Pure: no Redis here.
"""

from typing import Any

VALUE_BYTES = 4096
NAME_BYTES = 256
MAX_FIELDS = 8
#: the fields the dispatcher adds: a producer's own field of one of these names is not kept
OWN_FIELDS = (b"error", b"source", b"entry", b"fields_dropped")


def _raw(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")


def rejected_copy(fields: dict[Any, Any], error: str, source: str, entry: str) -> dict[bytes, Any]:
    """The fields to write for a bad entry of `source` (its id `entry`), rejected with `error`.
    Names and values stay the producer's bytes (never decoded: they need not be UTF-8)."""
    copy: dict[bytes, Any] = {}
    sizes: dict[bytes, int] = {}
    kept = 0
    dropped = 0
    for key, value in fields.items():
        name = _raw(key)[:NAME_BYTES]
        if name in OWN_FIELDS:
            continue
        if kept == MAX_FIELDS:
            dropped += 1
            continue
        kept += 1
        raw = _raw(value)
        copy[name] = raw[:VALUE_BYTES]
        if len(raw) > VALUE_BYTES:
            sizes[name + b"_bytes"] = len(raw)
    copy.update(sizes)  # a producer's own `<f>_bytes` gives way to the size of its cut `f`
    copy.update({b"error": _raw(error)[:VALUE_BYTES], b"source": source.encode(), b"entry": entry.encode()})
    if dropped:
        copy[b"fields_dropped"] = dropped
    return copy
