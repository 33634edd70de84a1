"""The rejected stream's copy of a bad entry is bounded in bytes (docs/protocol.md, "Rejected
entries"): the producer's fields share 4 KiB, a cut value's size recorded, names cut, at
most 8 fields, the error cut to 1 KiB."""

from parley.dispatcher.rejected import COPY_BYTES, ERROR_BYTES, MAX_FIELDS, NAME_BYTES, rejected_copy


def size(copy: dict) -> int:
    return sum(len(k) + (len(v) if isinstance(v, bytes) else len(str(v))) for k, v in copy.items())


def copy_of(fields: dict, error: str = "bad") -> dict:
    return rejected_copy(fields, error, "parley:inputs", "5-1")


def test_a_small_entry_is_kept_whole_with_why_where_and_which():
    fields = {b"session": b"s-1", b"input": b"not json", b"\xff": b"x"}
    assert copy_of(fields) == {**fields, b"error": b"bad", b"source": b"parley:inputs", b"entry": b"5-1"}


def test_a_large_value_is_cut_to_what_the_budget_leaves_and_its_size_recorded():
    big = b"x" * (5 * 1024 * 1024)
    copy = copy_of({b"session": b"s-1", b"input": big})
    assert copy[b"session"] == b"s-1" and b"session_bytes" not in copy
    left = COPY_BYTES - len(b"session") - len(b"s-1") - len(b"input")
    assert copy[b"input"] == big[:left] and copy[b"input_bytes"] == len(big)
    assert size(copy) < COPY_BYTES + 200


def test_an_entry_exactly_at_the_budget_is_kept_whole():
    copy = copy_of({"input": "y" * (COPY_BYTES - len("input"))})
    assert copy[b"input"] == b"y" * (COPY_BYTES - 5) and b"input_bytes" not in copy


def test_eight_large_values_share_one_budget():
    fields = {f"f{n}".encode(): b"v" * 100_000 for n in range(MAX_FIELDS)}
    copy = copy_of(fields)
    assert size(copy) < COPY_BYTES + 400  # the budget, its size records, where, which, why
    assert copy[b"f0"] == b"v" * (COPY_BYTES - 2) and copy[b"f0_bytes"] == 100_000
    assert copy[b"fields_dropped"] == MAX_FIELDS - 1  # nothing was left for the others


def test_the_dispatchers_own_fields_win_over_a_producers_fields_of_those_names():
    copy = copy_of({b"error": b"mine", b"source": b"x", b"entry": b"y", b"fields_dropped": b"0",
                    b"input_bytes": b"7", b"input": b"z" * (COPY_BYTES + 1)})
    assert (copy[b"error"], copy[b"source"], copy[b"entry"]) == (b"bad", b"parley:inputs", b"5-1")
    assert b"fields_dropped" not in copy
    assert copy[b"input_bytes"] == COPY_BYTES + 1  # the true size, not the producer's claim


def test_many_fields_long_names_and_a_long_error_are_bounded_too():
    fields = {f"f{n}".encode() + b"n" * 10_000: b"v" for n in range(1000)}
    copy = copy_of(fields, error="e" * 100_000)
    kept = [k for k in copy if k not in (b"error", b"source", b"entry", b"fields_dropped")]
    assert len(kept) == MAX_FIELDS and all(len(k) == NAME_BYTES for k in kept)
    assert copy[b"fields_dropped"] == 1000 - MAX_FIELDS
    assert len(copy[b"error"]) == ERROR_BYTES
