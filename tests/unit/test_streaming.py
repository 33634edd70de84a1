"""workers/streaming.py: how `parley.stream_delta` batches a model's pieces into writes, what
a reset writes, and that streaming never fails the call."""

import pytest
import redis
from rq.timeouts import JobTimeoutException

import parley
from parley.schemas.deltas import Delta
from parley.workers.streaming import FLUSH_CHARS, FLUSH_S, DeltaSink, stream_delta, stream_reset, streaming


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sink(writes: list[list[Delta]], clock: Clock) -> DeltaSink:
    return DeltaSink(call_id="llm-1", attempt=1, write=writes.append, clock=clock)


def test_the_first_piece_goes_at_once_and_the_next_ones_in_batches():
    writes: list[list[Delta]] = []
    clock = Clock()
    with streaming(sink(writes, clock)):
        stream_delta("Hel")
        assert [[d.text for d in w] for w in writes] == [["Hel"]]
        stream_delta("lo")
        stream_delta(", ")
        assert len(writes) == 1  # within FLUSH_S: held
        clock.now += 2 * FLUSH_S
        stream_delta("world")
        stream_delta("!")
    assert [[(d.seq, d.text) for d in w] for w in writes] == [[(1, "Hel")], [(2, "lo, world")], [(3, "!")]]


def test_a_batch_is_written_once_it_holds_enough_text():
    writes: list[list[Delta]] = []
    with streaming(sink(writes, Clock())):
        stream_delta("a")
        stream_delta("b" * FLUSH_CHARS)
        assert [d.text for w in writes for d in w] == ["a", "b" * FLUSH_CHARS]


def test_a_reset_drops_what_is_held_and_is_written_before_the_new_text():
    writes: list[list[Delta]] = []
    with streaming(sink(writes, Clock())):
        stream_delta("first try")
        stream_delta(" (held)")
        stream_reset()
        stream_delta("second")
    flat = [d for w in writes for d in w]
    assert [(d.seq, d.text, d.reset) for d in flat] == [(1, "first try", False), (2, "", True),
                                                        (3, "second", False)]


def test_a_reset_before_any_text_writes_nothing():
    writes: list[list[Delta]] = []
    with streaming(sink(writes, Clock())):
        stream_reset()
    assert writes == []


def test_a_failing_write_drops_the_pieces_and_the_call_goes_on(caplog: pytest.LogCaptureFixture):
    def broken(_batch: list[Delta]) -> None:
        raise ConnectionError("redis away")

    clock = Clock()
    with streaming(DeltaSink(call_id="llm-1", attempt=1, write=broken, clock=clock)):
        stream_delta("a")
        clock.now += 1
        stream_delta("b")
    assert [r.message for r in caplog.records].count("stream deltas dropped") == 1


def test_a_redis_error_in_a_write_is_dropped_too():
    def broken(_batch: list[Delta]) -> None:
        raise redis.exceptions.ConnectionError("Connection refused")

    with streaming(DeltaSink(call_id="llm-1", attempt=1, write=broken, clock=Clock())):
        stream_delta("a")  # no error reaches the call


def test_the_jobs_time_limit_raised_during_a_write_reaches_the_call():
    """RQ's time limit is an Exception raised by a signal wherever the call is; in a write it
    must not be taken for a failed write and swallowed, or the call would run past its limit."""

    def interrupted(_batch: list[Delta]) -> None:
        raise JobTimeoutException("Task exceeded maximum timeout value (30 seconds)")

    with pytest.raises(JobTimeoutException), \
            streaming(DeltaSink(call_id="llm-1", attempt=1, write=interrupted, clock=Clock())):
        stream_delta("a")


def test_outside_a_model_call_stream_delta_does_nothing():
    parley.stream_delta("nobody listens")  # no error, nothing kept
    stream_reset()


def test_empty_pieces_are_not_written():
    writes: list[list[Delta]] = []
    with streaming(sink(writes, Clock())):
        stream_delta("")
    assert writes == []
