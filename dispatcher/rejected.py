"""The copy of a bad entry kept in the rejected stream (docs/protocol.md, "Rejected entries").

Bounded in bytes whatever the producer sent: the producer's fields share one budget of
`COPY_BYTES` (names and values together, in the entry's order): a value that does not fit is
cut to what is left, its original size recorded next to it (`<field>_bytes`); names are cut to
`NAME_BYTES`; fields past the budget, or past `MAX_FIELDS`, are left out (how many:
`fields_dropped`). The error is cut to `ERROR_BYTES`. So one copy holds at most about 5.5 KiB
whatever the entry, and the stream's count cap (about 10,000 copies) is a cap of about 55 MB:
20 entries of 5 MB keep about 80 KB, not 100 MB. Pure: no Redis here.
"""

from typing import Any

#: the producer's fields, names and values together, in one copy
COPY_BYTES = 4096
NAME_BYTES = 256
MAX_FIELDS = 8
ERROR_BYTES = 1024
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
    left = COPY_BYTES
    dropped = 0
    for key, value in fields.items():
        name = _raw(key)[:NAME_BYTES]
        if name in OWN_FIELDS:
            continue
        if len(copy) == MAX_FIELDS or len(name) >= left:
            dropped += 1
            continue
        raw = _raw(value)
        kept = raw[:left - len(name)]
        left -= len(name) + len(kept)
        copy[name] = kept
        if len(kept) < len(raw):
            sizes[name + b"_bytes"] = len(raw)
    copy.update(sizes)  # a producer's own `<f>_bytes` gives way to the size of its cut `f`
    copy.update({b"error": _raw(error)[:ERROR_BYTES], b"source": source.encode(), b"entry": entry.encode()})
    if dropped:
        copy[b"fields_dropped"] = dropped
    return copy
