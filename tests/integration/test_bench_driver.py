"""The benchmark's driver (bench/driver.py) against a real Redis: it follows sessions through the
fleet-wide feed and reads a session's own stream only when the feed cannot tell it enough (at
the session's end; when the feed goes quiet; while resuming it one at a time), and keeps every
check it made when it polled every stream.

The engine here is a script (`Engine`): a thread that answers the driver's inputs by writing a
session's events and their feed copies the way the commit script does (docs/protocol.md,
"Feed"), so that each test can make one session go wrong in a chosen way. The last test runs
the real engine (`bench.fleet.Fleet`) for a few sessions."""

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from bench import driver
from bench.driver import FINAL, DriveError, Producer, Track, read_parked, resume_closed_loop, run_flow
from parley.schemas.events import FEED_EVENT_TYPES
from parley.schemas.keys import Keys

KEYS = Keys()


class Engine(threading.Thread):
    """Answers message.create with interrupt.raised and interrupt.resume with the rest of the seed
    flow, except for the sessions in `fail` (an event type the feed does not carry, written
    instead of finishing the turn), `final` (their last assistant message), `undelivered`
    (their resume said not delivered) and `ignored` (never answered)."""

    def __init__(self, url: str, fail: dict[str, str] | None = None, final: dict[str, str] | None = None,
                 undelivered: frozenset[str] = frozenset(), ignored: frozenset[str] = frozenset()):
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url)
        self.fail = fail or {}
        self.final = final or {}
        self.undelivered = undelivered
        self.ignored = ignored
        self.stopping = threading.Event()
        self.at = 1_000

    def emit(self, session: str, event: dict[str, Any]) -> None:
        self.at += 1
        event = {**event, "at": self.at}
        raw = orjson.dumps(event)
        entry = self.r.xadd(KEYS.events(session), {"event": raw})
        if event["type"] in FEED_EVENT_TYPES:
            self.r.xadd(KEYS.feed, {"session": session, "type": event["type"], "event_id": entry,
                                    "event": raw})

    def answer(self, session: str, value: dict[str, Any]) -> None:
        if session in self.ignored:
            return
        if value["type"] == "message.create":
            self.emit(session, {"type": "message.created", "message": {"role": "user", "content": "hi"}})
            self.emit(session, {"type": "interrupt.raised", "interrupt_id": f"int-{session}"})
            return
        assert value["type"] == "interrupt.resume" and value["interrupt_id"] == f"int-{session}"
        self.emit(session, {"type": "interrupt.resumed", "interrupt_id": value["interrupt_id"],
                            "delivered": session not in self.undelivered})
        if session in self.fail:
            self.emit(session, {"type": self.fail[session], "code": "scripted"})
            return  # the turn never completes: only the session's stream says why
        self.emit(session, {"type": "tool.completed"})
        self.emit(session, {"type": "message.created",
                            "message": {"role": "assistant", "content": self.final.get(session, FINAL)}})
        self.emit(session, {"type": "turn.completed"})

    def run(self) -> None:
        last: Any = "0-0"
        while not self.stopping.is_set():
            reply: Any = self.r.xread({KEYS.inputs(): last}, block=50)
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    self.answer(fields[b"session"].decode(), orjson.loads(fields[b"input"]))

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.r.close()


@pytest.fixture
def engine(redis_server: Any) -> Iterator[Any]:
    started: list[Engine] = []

    def start(**kw: Any) -> Engine:
        e = Engine(redis_server.url, **kw)
        e.start()
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def tracks(n: int, prefix: str = "s") -> list[Track]:
    return [Track(f"{prefix}-{i}") for i in range(n)]


def test_the_feed_carries_the_flow_and_each_stream_is_read_once_at_its_end(r: redis.Redis,
                                                                           engine: Any) -> None:
    engine()
    # an entry from before the run (another session's) is not the driver's business
    r.xadd(KEYS.feed, {"session": "old", "type": "turn.completed", "event_id": "1-1", "event": b"{}"})
    producer = Producer(r, KEYS, 1)
    ts = tracks(50)
    wall = run_flow(producer, ts, timeout=30)
    assert all(t.done and t.problem is None for t in ts)
    assert all(t.delivered and t.final == FINAL and t.interrupt_id == f"int-{t.session}" for t in ts)
    assert all(t.message_ms and t.raised_at and t.resume_ms and t.resumed_at and t.completed_at for t in ts)
    reads = producer.read_counts()
    # each session's stream once, at its end; the feed at most once per entry (3 a session)
    # plus a read each time it waited in vain (100 ms): never a read of every stream in flight
    assert reads["xrange"] == 50
    assert reads["xread"] <= 3 * 50 + wall / (driver.FEED_BLOCK_MS / 1000) + 1
    assert reads["xrevrange"] == 1


@pytest.mark.parametrize("follow", ["feed", "streams"])
def test_a_wrong_last_message_or_an_undelivered_resume_is_a_problem(r: redis.Redis, engine: Any,
                                                                   follow: str) -> None:
    engine(final={"s-1": "Done. send_email: refused"}, undelivered=frozenset({"s-2"}))
    ts = tracks(4)
    run_flow(Producer(r, KEYS, 1), ts, timeout=30, follow=follow)
    assert ts[1].problem == "finished wrongly: delivered=True final='Done. send_email: refused'"
    assert ts[2].problem == f"finished wrongly: delivered=False final={FINAL!r}"
    assert ts[0].problem is None and ts[3].problem is None


@pytest.mark.parametrize("kind", ["llm.failed", "decision.failed", "input.refused"])
def test_a_failure_the_feed_does_not_carry_is_found_when_the_feed_goes_quiet(
        r: redis.Redis, engine: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "STALL_S", 0.3)
    engine(fail={"s-0": kind})
    ts = tracks(3)
    producer = Producer(r, KEYS, 1)
    run_flow(producer, ts, timeout=20)
    assert ts[0].problem == f"{kind}: scripted" and ts[0].completed_at is None
    assert ts[1].problem is None and ts[2].problem is None
    # the quiet feed made the driver read the streams of the sessions still in flight
    assert producer.read_counts()["xread"] >= 2


def test_a_session_that_never_ends_times_the_run_out(r: redis.Redis, engine: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "STALL_S", 0.2)
    engine(ignored=frozenset({"s-2"}))
    ts = tracks(3)
    with pytest.raises(DriveError, match=r"1 of 3 sessions unfinished after 2s \(e.g. Track\(session='s-2'"):
        run_flow(Producer(r, KEYS, 1), ts, timeout=1.5)
    assert ts[0].done and ts[1].done and not ts[2].done


def test_follow_names_a_way_to_follow(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="follow"):
        run_flow(Producer(r, KEYS, 1), tracks(1), timeout=1, follow="guess")


def test_resumes_one_at_a_time_record_the_decision_applied(r: redis.Redis, engine: Any) -> None:
    engine()
    producer = Producer(r, KEYS, 1)
    ts = tracks(10, "p")
    producer.send_messages(ts)
    # parked without being followed, as scenario 3 parks them; then caught up with once
    deadline = time.monotonic() + 10
    while int(r.xlen(KEYS.feed)) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    read_parked(producer, ts)
    assert all(t.interrupt_id == f"int-{t.session}" for t in ts)
    resume_closed_loop(producer, ts, concurrency=1, timeout=20)
    assert all(t.problem is None and t.applied_at and t.completed_at for t in ts)
    assert all(t.resumed_at is not None and t.resumed_at < t.applied_at < t.completed_at for t in ts
               if t.applied_at and t.completed_at)


def test_read_parked_says_which_sessions_are_not_parked(r: redis.Redis) -> None:
    with pytest.raises(DriveError, match="1 sessions are not parked"):
        read_parked(Producer(r, KEYS, 1), [Track("never-sent")])


def test_the_real_engine_through_the_feed(tmp_path: Path) -> None:
    """Scenario 1's row on a real fleet, small: every session done without a problem, the
    driver's reads a few per session and left out of the engine's commands per session."""
    from bench.fleet import Fleet
    from bench.scenarios.seed_cycle import flow_row

    with Fleet(tmp_path / "fleet", appendfsync="everysec", workers=1) as fleet:
        row = flow_row(fleet, 20, 120, True, "t")
    assert row["problems"] == 0, row["problem_examples"]
    assert row["jobs"] == 80 and row["transitions"] == 120
    reads = row["driver_reads_per_session"]
    assert reads["xrange"] == 1.0 and reads["xread"] <= 6
    assert "xrange" not in row["redis_commands_per_session"]["top"]
    usec = row["redis_usec_per_session"]
    assert 0 < usec["driver_reads"] < usec["total"] and usec["driver_share"] < 0.5
