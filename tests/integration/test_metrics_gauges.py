"""The interrupt gauges read at scrape time (parley/runtime/metrics.py) against a real Redis.

docs/operations.md, "Metrics": a scrape costs the same whatever the number of open interrupts,
and `parley_parked_branches` stays exact when an outbox flush is done again after a crash.
"""

from typing import Any

import pytest
import redis

from parley.dispatcher.core import IndexAdd, IndexRemove
from parley.dispatcher.enqueue import Outbox
from parley.runtime.metrics import RedisStateCollector
from tests.integration.conftest import KEYS


def gauges(r: redis.Redis) -> dict[str, Any]:
    return {m.name: m.samples[0].value for m in RedisStateCollector(r, KEYS).collect()
            if m.samples and not m.samples[0].labels}


def add(interrupt_id: str, anchor: str | None, seq: int = 1) -> IndexAdd:
    return IndexAdd(seq=seq, interrupt_id=interrupt_id, reason="confirm", anchor=anchor,
                    raised_at=1_000, deadline=None, parent=None)


def remove(interrupt_id: str, seq: int = 2) -> IndexRemove:
    return IndexRemove(seq=seq, interrupt_id=interrupt_id)


def output_bytes(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


@pytest.fixture
def outbox(r: redis.Redis) -> Outbox:
    return Outbox(r, KEYS)


def test_a_scrape_reads_the_same_whatever_the_number_of_open_interrupts(
        r: redis.Redis, outbox: Outbox) -> None:
    """Redis sends a scrape the same bytes with 10 or 2,000 open interrupts: nothing is read per
    interrupt. (What differs is the width of numbers: the counts, and INFO's own reply, which
    the measure includes; reading each interrupt's details would be ~100 bytes per interrupt.)"""
    outbox.flush_many([(f"g-{i:05}", [add("int-1", "m-1")]) for i in range(10)])
    gauges(r)
    before = output_bytes(r)
    small = gauges(r)
    small_bytes = output_bytes(r) - before

    outbox.flush_many([(f"g-{i:05}", [add("int-1", "m-1")]) for i in range(10, 2_000)])
    before = output_bytes(r)
    large = gauges(r)
    large_bytes = output_bytes(r) - before
    assert (small["parley_open_interrupts"], small["parley_parked_branches"]) == (10, 10)
    assert (large["parley_open_interrupts"], large["parley_parked_branches"]) == (2_000, 2_000)
    assert abs(large_bytes - small_bytes) < 100, (small_bytes, large_bytes)


def test_parked_branches_count_distinct_anchors_per_session(r: redis.Redis, outbox: Outbox) -> None:
    outbox.flush_many([("p-1", [add("a", "m-1", 1), add("b", "m-1", 2), add("c", "m-2", 3)]),
                       ("p-2", [add("a", "m-1", 1), add("g", None, 2)])])
    assert gauges(r)["parley_parked_branches"] == 4  # p-1: m-1, m-2; p-2: m-1, global
    outbox.flush_many([("p-1", [remove("a", 4)])])
    assert gauges(r)["parley_parked_branches"] == 4  # b still parks m-1
    outbox.flush_many([("p-1", [remove("b", 5), remove("c", 6)]), ("p-2", [remove("g", 3)])])
    assert gauges(r)["parley_parked_branches"] == 1
    outbox.flush_many([("p-2", [remove("a", 4)])])
    assert gauges(r)["parley_parked_branches"] == 0
    assert gauges(r)["parley_open_interrupts"] == 0


def test_parked_branches_stay_exact_when_a_flush_is_done_again(r: redis.Redis, outbox: Outbox) -> None:
    """A flush done twice (a replay after a crash that left its outbox) adds and removes once."""
    first = [("x-1", [add("a", "m-1")]), ("x-2", [add("a", None)])]
    outbox.flush_many(first)
    outbox.flush_many(first)
    assert gauges(r)["parley_parked_branches"] == 2
    outbox.flush_many([("x-1", [remove("a")])])
    outbox.flush_many([("x-1", [remove("a")])])
    outbox.flush_many([("x-1", [remove("never-raised", 3)])])
    assert gauges(r)["parley_parked_branches"] == 1
    outbox.flush_many([("x-1", [add("a", "m-1", 4)])])
    assert gauges(r)["parley_parked_branches"] == 2


def test_counts_of_an_index_written_before_they_were_kept_are_rebuilt_once(
        r: redis.Redis, outbox: Outbox) -> None:
    """Open interrupts indexed by an older dispatcher (no counts kept): the first dispatcher to
    start counts them once, and the counts stay exact from there."""
    outbox.flush_many([("o-1", [add("a", "m-1", 1), add("b", "m-2", 2)])])
    r.delete(KEYS.interrupt_anchors)
    r.hdel(KEYS.stats, "parked")
    Outbox(r, KEYS)
    assert gauges(r)["parley_parked_branches"] == 2
    outbox.flush_many([("o-1", [remove("a", 3)])])
    Outbox(r, KEYS)  # counts exist: nothing rebuilt again
    assert gauges(r)["parley_parked_branches"] == 1
