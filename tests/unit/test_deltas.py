"""schemas/deltas.py: a streamed piece's entry, and the merge of a watcher's XREAD of a
session's events and deltas streams in the order they were written."""

from parley.schemas.deltas import Delta, delta_of, entry_fields, merged


def test_a_delta_round_trips_through_its_stream_fields_as_bytes_too():
    delta = Delta(call_id="llm-2", attempt=1, seq=3, text="Hel")
    fields = entry_fields(delta)
    assert fields == {"call": "llm-2", "attempt": "1", "seq": "3", "text": "Hel"}
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    assert Delta.model_validate(delta_of(as_bytes)) == delta


def test_a_reset_is_kept_and_only_written_when_set():
    reset = Delta(call_id="llm-1", attempt=2, seq=4, text="", reset=True)
    assert entry_fields(reset)["reset"] == "1"
    assert delta_of(entry_fields(reset)) == {"type": "llm.delta", "call_id": "llm-1", "attempt": 2,
                                             "seq": 4, "text": "", "reset": True}


def test_an_entry_that_is_not_a_delta_is_skipped():
    assert delta_of({b"event": b"{}"}) is None
    assert delta_of({"call": "llm-1", "attempt": "one", "seq": "1", "text": "x"}) is None


def test_entries_of_two_streams_come_out_in_the_order_they_were_written():
    events = ("ev", [(b"5-0", "e5"), (b"9-0", "e9")])
    deltas = ("dl", [(b"3-0", "d3"), (b"6-0", "d6"), (b"6-1", "d6b")])
    taken, last = merged([events, deltas], count=100)
    assert [(s, i) for s, i, _f in taken] == [("dl", "3-0"), ("ev", "5-0"), ("dl", "6-0"), ("dl", "6-1"),
                                             ("ev", "9-0")]
    assert last == {"ev": "9-0", "dl": "6-1"}


def test_a_full_read_holds_back_what_was_written_after_its_last_entry():
    """The deltas read came back full (more may follow 6-1): event 9-0 waits for the next read,
    so no piece written before it can come out after it."""
    events = ("ev", [(b"5-0", "e5"), (b"9-0", "e9")])
    deltas = ("dl", [(b"3-0", "d3"), (b"6-0", "d6"), (b"6-1", "d6b")])
    taken, last = merged([events, deltas], count=3)
    assert [i for _s, i, _f in taken] == ["3-0", "5-0", "6-0", "6-1"]
    assert last == {"ev": "5-0", "dl": "6-1"}  # the events stream is read again from 5-0


def test_an_empty_read_takes_nothing():
    assert merged([], count=10) == ([], {})
