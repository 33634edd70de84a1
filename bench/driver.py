"""The producer side: write inputs the way an app does and follow sessions the way one should.

Inputs are XADDs to `parley:inputs[:n]` (pipelined, 500 per round trip). Sessions are followed
through the fleet-wide feed (`parley:feed`, docs/protocol.md "Feed"): one blocking XREAD of one
stream carries every session's `interrupt.raised`, `interrupt.resumed` and `turn.completed`,
so the driver's reads cost Redis about the same whatever the number of sessions in flight.
What the feed does not carry is read from the one session's own events stream, only when it
is needed: once at the session's end (the last assistant message, and any `input.refused`,
`decision.failed` or `llm.failed` on the way), every stream still in flight when the feed has
been quiet for a second (a session that failed without ending its turn), and, in scenario 3,
a blocking XREAD of the streams of the sessions being resumed (`tool.completed`).

The old way, XREAD of up to 100 session streams at once over every session in flight
(`follow="streams"`), stays for the soak (scenario 8), whose fleet caps the feed at one entry.

Times: an input's time is the millisecond part of its stream entry id (Redis's clock when
it accepted the XADD); an event's time is its `at` field (Unix ms, the dispatcher's clock
when it computed the transition). Same machine, same clock, both truncated to the
millisecond, so differences are exact to about ±1 ms and do not include this driver's
polling delay. `observed` times (this driver's clock when it read the event) are only used
to decide when to send the next input and for wall-clock totals.
"""

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from parley.schemas.keys import Keys

XADD_BATCH = 500
STREAMS_PER_XREAD = 100
FEED_COUNT = 1000     # feed entries per XREAD
FEED_BLOCK_MS = 100   # how long one XREAD of the feed waits for the next entry
STALL_S = 1.0         # a quiet feed this long: read the streams of the sessions in flight
POLL_S = 0.01  # pause between polling rounds while events keep coming (follow="streams")
CONTENT = "Email bob@example.com: the launch moved to Friday ({session})."
FINAL = "Done. send_email: sent"


class DriveError(RuntimeError):
    pass


def entry_ms(entry_id: Any) -> int:
    return int(text(entry_id).split("-", 1)[0])


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


@dataclass
class Track:
    """What the driver knows of one session."""

    session: str
    cursor: str = "0-0"              # the last entry of its events stream read
    message_ms: int | None = None    # entry id ms of the message.create input
    raised_at: int | None = None     # `at` of interrupt.raised
    interrupt_id: str | None = None
    resume_ms: int | None = None     # entry id ms of the interrupt.resume input
    resumed_at: int | None = None    # `at` of interrupt.resumed
    applied_at: int | None = None    # `at` of tool.completed: the resumed decide's decision applied
    completed_at: int | None = None  # `at` of turn.completed (after the resume)
    delivered: bool | None = None
    final: str | None = None         # content of the last assistant message
    problem: str | None = None

    @property
    def done(self) -> bool:
        return self.completed_at is not None or self.problem is not None


@dataclass
class FeedEntry:
    """One entry of the fleet-wide feed: the session it names, the event's type, the event."""

    session: str
    kind: str
    event: dict[str, Any]


class Producer:
    def __init__(self, redis: Any, keys: Keys, partitions: int, idempotency_keys: bool = True):
        self.redis = redis
        self.keys = keys
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys
        self.feed_cursor = "0-0"
        #: the read commands this driver sent, as Redis counts them (INFO commandstats names),
        #: so that the report can tell the engine's commands from the driver's
        self.reads: Counter[str] = Counter()

    def read_counts(self) -> Counter[str]:
        return Counter(self.reads)

    def stream(self, session: str) -> str:
        """Partitioning (docs/protocol.md, Writing inputs), computed here once instead of an HGET
        of parley:config per send."""
        return self.keys.inputs_of(session, self.partitions)

    def send(self, items: Iterable[tuple[str, dict[str, Any], str]]) -> list[int]:
        """XADD (session, input, idempotency key) entries, pipelined; their entry-id ms, in order."""
        out: list[int] = []
        for batch in chunks(list(items), XADD_BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for session, value, idem in batch:
                fields: dict[str, Any] = {"session": session, "input": orjson.dumps(value)}
                if self.idempotency_keys:
                    fields["id"] = idem
                pipe.xadd(self.stream(session), fields)
            out.extend(entry_ms(e) for e in pipe.execute())
        return out

    def send_messages(self, tracks: list[Track]) -> None:
        ms = self.send((t.session, {"type": "message.create", "content": CONTENT.format(session=t.session)},
                        f"msg-{t.session}") for t in tracks)
        for t, m in zip(tracks, ms, strict=True):
            t.message_ms = m

    def send_resumes(self, tracks: list[Track], approved: bool = True) -> None:
        ms = self.send((t.session, {"type": "interrupt.resume", "interrupt_id": t.interrupt_id,
                                    "payload": {"approved": approved}}, f"resume-{t.session}")
                       for t in tracks)
        for t, m in zip(tracks, ms, strict=True):
            t.resume_ms = m

    # ---- the feed ---------------------------------------------------------------------------

    def follow_feed(self) -> None:
        """Read the feed from its current end on (called before the inputs are sent, so that
        every entry they cause comes after it)."""
        last = self.redis.xrevrange(self.keys.feed, count=1)
        self.reads["xrevrange"] += 1
        self.feed_cursor = text(last[0][0]) if last else "0-0"

    def feed(self, block_ms: int | None = FEED_BLOCK_MS) -> list[FeedEntry]:
        """The feed's next entries (up to FEED_COUNT) after the cursor, waiting up to `block_ms`
        for the first; advances the cursor."""
        reply = self.redis.xread({self.keys.feed: self.feed_cursor}, count=FEED_COUNT, block=block_ms)
        self.reads["xread"] += 1
        out: list[FeedEntry] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                self.feed_cursor = text(entry_id)
                out.append(FeedEntry(text(fields[b"session"]), text(fields[b"type"]),
                                     orjson.loads(fields[b"event"])))
        return out

    # ---- sessions' own streams ------------------------------------------------------------------

    def read_rest(self, tracks: list[Track]) -> list[tuple[Track, dict[str, Any]]]:
        """Each session's events after its cursor (XRANGE, the cursor excluded), in one round
        trip; advances the cursors."""
        if not tracks:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for t in tracks:
            pipe.xrange(self.keys.events(t.session), "-" if t.cursor == "0-0" else f"({t.cursor}", "+")
        self.reads["xrange"] += len(tracks)
        out: list[tuple[Track, dict[str, Any]]] = []
        for t, entries in zip(tracks, pipe.execute(), strict=True):
            for entry_id, fields in entries:
                t.cursor = text(entry_id)
                out.append((t, orjson.loads(fields[b"event"])))
        return out

    def poll(self, tracks: list[Track], block_ms: int | None = None) -> list[tuple[Track, dict[str, Any]]]:
        """New events of these sessions (XREAD of up to 100 streams at a time, all in one round
        trip); advances their cursors. `block_ms` waits for the first event when one XREAD
        names them all (a blocking read inside a pipeline would hold up the others)."""
        if not tracks:
            return []
        by_key = {self.keys.events(t.session): t for t in tracks}
        batches = list(chunks(tracks, STREAMS_PER_XREAD))
        block = block_ms if len(batches) == 1 else None
        pipe = self.redis.pipeline(transaction=False)
        for batch in batches:
            pipe.xread({self.keys.events(t.session): t.cursor for t in batch}, count=100, block=block)
        self.reads["xread"] += len(batches)
        out: list[tuple[Track, dict[str, Any]]] = []
        for reply in pipe.execute():
            for stream, entries in reply or []:
                t = by_key[text(stream)]
                for entry_id, fields in entries:
                    t.cursor = text(entry_id)
                    out.append((t, orjson.loads(fields[b"event"])))
        return out


def observe(t: Track, event: dict[str, Any]) -> None:
    """Record what one event says about the seed flow of its session. Seeing an event twice
    (from the feed, then in the session's stream) records the same."""
    kind = event["type"]
    if kind == "interrupt.raised" and t.interrupt_id is None:
        t.raised_at = event["at"]
        t.interrupt_id = event["interrupt_id"]
    elif kind == "interrupt.resumed":
        t.resumed_at = event["at"]
        t.delivered = bool(event.get("delivered"))
    elif kind == "tool.completed" and t.resume_ms is not None and t.applied_at is None:
        t.applied_at = event["at"]
    elif kind == "message.created" and event["message"]["role"] == "assistant":
        t.final = event["message"].get("content")
    elif kind == "turn.completed" and t.resume_ms is not None:
        t.completed_at = event["at"]
        if not t.delivered or t.final != FINAL:
            t.problem = f"finished wrongly: delivered={t.delivered} final={t.final!r}"
    elif kind in ("input.refused", "decision.failed", "llm.failed"):
        t.problem = f"{kind}: {event.get('code') or event.get('error')}"


class Flow:
    """Scenario 1's bookkeeping over a set of tracks: which are parked (to be resumed), which
    ended (to be read), which are still in flight."""

    def __init__(self, tracks: list[Track]):
        self.by_session = {t.session: t for t in tracks}
        self.active = list(tracks)

    def see(self, t: Track, event: dict[str, Any], to_resume: list[Track]) -> None:
        was_parked = t.interrupt_id is not None
        observe(t, event)
        if not was_parked and t.interrupt_id is not None and not t.done:
            to_resume.append(t)

    def from_feed(self, entries: list[FeedEntry], to_resume: list[Track], ending: list[Track]) -> None:
        """The feed's entries: interrupts recorded (a new one to be resumed); a turn completed
        after the resume means the session's stream is to be read (its last message, and any
        failure on the way: the feed does not carry them)."""
        for entry in entries:
            t = self.by_session.get(entry.session)
            if t is None or t.done:
                continue
            if entry.kind == "turn.completed":
                if t.resume_ms is not None and t not in ending:
                    ending.append(t)
                continue
            self.see(t, entry.event, to_resume)

    def settle(self) -> None:
        self.active = [t for t in self.active if not t.done]


def run_flow(producer: Producer, tracks: list[Track], timeout: float, check: Callable[[], None] | None = None,
             follow: str = "feed") -> float:
    """Scenario 1's flow for every track at once: all messages are sent together, each interrupt
    is resumed (approved) as soon as it is seen, until every session's turn completes.
    `follow`: "feed" (the fleet-wide feed, and each session's stream once at its end) or
    "streams" (every session's stream, for a fleet whose feed is capped to nothing).
    Returns the wall-clock seconds from the first send to the last completion seen."""
    if follow not in ("feed", "streams"):
        raise ValueError(f"follow: 'feed' or 'streams', not {follow!r}")
    flow = Flow(tracks)
    if follow == "feed":
        producer.follow_feed()
    started = time.monotonic()
    producer.send_messages(tracks)
    quiet_since = started
    idle = POLL_S
    while flow.active:
        now = time.monotonic()
        if now - started > timeout:
            raise DriveError(f"{len(flow.active)} of {len(tracks)} sessions unfinished after {timeout:.0f}s "
                             f"(e.g. {flow.active[0]})")
        to_resume: list[Track] = []
        if follow == "feed":
            ending: list[Track] = []
            entries = producer.feed()
            flow.from_feed(entries, to_resume, ending)
            if to_resume:
                producer.send_resumes(to_resume)
                to_resume = []
            for t, event in producer.read_rest(ending):
                flow.see(t, event, to_resume)
            if entries:
                quiet_since = time.monotonic()
            else:
                if check is not None:
                    check()
                if time.monotonic() - quiet_since >= STALL_S:
                    # Nothing on the feed for a while: a session may have failed in a way the
                    # feed does not carry (llm.failed, input.refused...). Read every stream
                    # still in flight once (what it says is recorded; an interrupt seen here
                    # first is resumed here), then wait on the feed again.
                    for t, event in producer.poll(flow.active):
                        flow.see(t, event, to_resume)
                    quiet_since = time.monotonic()
        else:
            events = producer.poll(flow.active)
            for t, event in events:
                flow.see(t, event, to_resume)
            if events:
                idle = POLL_S
            else:
                # nothing new: back off (to 100 ms) so that polling thousands of streams does not
                # become a load of its own; latencies come from the events' `at`, not from here
                if check is not None:
                    check()
                idle = min(idle * 2, 0.1)
            time.sleep(idle)
        if to_resume:
            producer.send_resumes(to_resume)
        flow.settle()
    return time.monotonic() - started


def read_parked(producer: Producer, tracks: list[Track]) -> None:
    """Catch up on the events of sessions parked without being followed (scenario 3)."""
    pending = list(tracks)
    while pending:
        events = producer.poll(pending)
        for t, event in events:
            observe(t, event)
        if not events:
            break
        pending = [t for t in pending if t.interrupt_id is None]
    missing = [t.session for t in tracks if t.interrupt_id is None]
    if missing:
        raise DriveError(f"{len(missing)} sessions are not parked (e.g. {missing[0]})")


def resume_closed_loop(producer: Producer, tracks: list[Track], concurrency: int, timeout: float,
                       check: Callable[[], None] | None = None) -> float:
    """Resume parked sessions keeping `concurrency` of them in flight: the next resume goes
    out when a resumed session's turn completes. The sessions in flight are followed with a
    blocking XREAD of their own streams (`tool.completed`, the decision applied, is not on the
    feed). Returns the wall-clock seconds."""
    started = time.monotonic()
    waiting = list(tracks)
    inflight: list[Track] = []
    while waiting or inflight:
        if time.monotonic() - started > timeout:
            raise DriveError(f"resumes unfinished after {timeout:.0f}s")
        room = concurrency - len(inflight)
        if room > 0 and waiting:
            batch, waiting = waiting[:room], waiting[room:]
            producer.send_resumes(batch)
            inflight += batch
        events = producer.poll(inflight, block_ms=FEED_BLOCK_MS)
        for t, event in events:
            observe(t, event)
        inflight = [t for t in inflight if not t.done]
        if not events and check is not None:
            check()
    return time.monotonic() - started
