"""The rejected stream's copy of a bad entry is bounded in bytes (docs/protocol.md, "Rejected
entries"): values cut to 4 KiB with their size recorded, names cut, at most 8 fields."""

from parley.dispatcher.rejected import MAX_FIELDS, NAME_BYTES, VALUE_BYTES, rejected_copy


def copy_of(fields: dict, error: str = "bad") -> dict:
    return rejected_copy(fields, error, "parley:inputs", "5-1")


def test_a_small_entry_is_kept_whole_with_why_where_and_which():
    fields = {b"session": b"s-1", b"input": b"not json", b"\xff": b"x"}
    assert copy_of(fields) == {**fields, b"error": b"bad", b"source": b"parley:inputs", b"entry": b"5-1"}


def test_a_large_value_is_cut_to_4_kib_and_its_size_recorded():
    big = b"x" * (5 * 1024 * 1024)
    copy = copy_of({b"session": b"s-1", b"input": big})
    assert copy[b"input"] == big[:VALUE_BYTES] and copy[b"input_bytes"] == len(big)
    assert copy[b"session"] == b"s-1" and b"session_bytes" not in copy
    assert sum(len(v) for v in copy.values() if isinstance(v, bytes)) < 2 * VALUE_BYTES


def test_a_value_exactly_4_kib_is_not_cut():
    copy = copy_of({"input": "y" * VALUE_BYTES})
    assert copy[b"input"] == b"y" * VALUE_BYTES and b"input_bytes" not in copy


def test_the_dispatchers_own_fields_win_over_a_producers_fields_of_those_names():
    copy = copy_of({b"error": b"mine", b"source": b"x", b"entry": b"y", b"fields_dropped": b"0",
                    b"input": b"z" * (VALUE_BYTES + 1), b"input_bytes": b"7"})
    assert (copy[b"error"], copy[b"source"], copy[b"entry"]) == (b"bad", b"parley:inputs", b"5-1")
    assert b"fields_dropped" not in copy
    assert copy[b"input_bytes"] == VALUE_BYTES + 1  # the true size, not the producer's claim


def test_many_fields_long_names_and_a_long_error_are_bounded_too():
    fields = {f"f{n}".encode() + b"n" * 10_000: b"v" for n in range(1000)}
    copy = copy_of(fields, error="e" * 100_000)
    kept = [k for k in copy if k not in (b"error", b"source", b"entry", b"fields_dropped")]
    assert len(kept) == MAX_FIELDS and all(len(k) == NAME_BYTES for k in kept)
    assert copy[b"fields_dropped"] == 1000 - MAX_FIELDS
    assert len(copy[b"error"]) == VALUE_BYTES
