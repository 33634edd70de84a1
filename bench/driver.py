"""The producer side: write inputs the way an app does and follow each session's events.

Inputs are XADDs to `parley:inputs[:n]` (pipelined, 500 per round trip). Events are read
with XREAD over many sessions' event streams at once: one XREAD names up to 100 streams,
and one pipelined round trip carries every XREAD of a polling round. Sessions that are
finished are no longer polled.

Times: an input's time is the millisecond part of its stream entry id (Redis's clock when
it accepted the XADD); an event's time is its `at` field (Unix ms, the dispatcher's clock
when it computed the transition). Same machine, same clock, both truncated to the
millisecond, so differences are exact to about ±1 ms and do not include this driver's
polling delay. `observed` times (this driver's clock when it read the event) are only used
to decide when to send the next input and for wall-clock totals.
"""

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from parley.schemas.keys import Keys

XADD_BATCH = 500
STREAMS_PER_XREAD = 100
POLL_S = 0.01  # pause between polling rounds while events keep coming
CONTENT = "Email bob@example.com: the launch moved to Friday ({session})."
FINAL = "Done. send_email: sent"


class DriveError(RuntimeError):
    pass


def entry_ms(entry_id: Any) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(text.split("-", 1)[0])


def chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


@dataclass
class Track:
    """What the driver knows of one session."""

    session: str
    cursor: str = "0-0"
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


class Producer:
    def __init__(self, redis: Any, keys: Keys, partitions: int, idempotency_keys: bool = True):
        self.redis = redis
        self.keys = keys
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys

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

    def poll(self, tracks: list[Track]) -> list[tuple[Track, dict[str, Any]]]:
        """New events of these sessions, in one round trip; advances their cursors."""
        if not tracks:
            return []
        by_key = {self.keys.events(t.session): t for t in tracks}
        pipe = self.redis.pipeline(transaction=False)
        for batch in chunks(tracks, STREAMS_PER_XREAD):
            pipe.xread({self.keys.events(t.session): t.cursor for t in batch}, count=100)
        out: list[tuple[Track, dict[str, Any]]] = []
        for reply in pipe.execute():
            for stream, entries in reply or []:
                t = by_key[stream.decode() if isinstance(stream, bytes) else stream]
                for entry_id, fields in entries:
                    t.cursor = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    out.append((t, orjson.loads(fields[b"event"])))
        return out


def observe(t: Track, event: dict[str, Any]) -> None:
    """Record what one event says about the seed flow of its session."""
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


def run_flow(producer: Producer, tracks: list[Track], timeout: float, check: Any = None) -> float:
    """Scenario 1's flow for every track at once: all messages are sent together, each interrupt
    is resumed (approved) as soon as it is seen, until every session's turn completes.
    Returns the wall-clock seconds from the first send to the last completion seen."""
    started = time.monotonic()
    producer.send_messages(tracks)
    active = list(tracks)
    idle = POLL_S
    while active:
        if time.monotonic() - started > timeout:
            raise DriveError(f"{len(active)} of {len(tracks)} sessions unfinished after {timeout:.0f}s "
                             f"(e.g. {active[0]})")
        events = producer.poll(active)
        to_resume = []
        for t, event in events:
            was_parked = t.interrupt_id is not None
            observe(t, event)
            if not was_parked and t.interrupt_id is not None:
                to_resume.append(t)
        if to_resume:
            producer.send_resumes(to_resume)
        active = [t for t in active if not t.done]
        if events:
            idle = POLL_S
        else:
            # nothing new: back off (to 100 ms) so that polling thousands of streams does not
            # become a load of its own; latencies come from the events' `at`, not from here
            if check is not None:
                check()
            idle = min(idle * 2, 0.1)
        time.sleep(idle)
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
                       check: Any = None) -> float:
    """Resume parked sessions keeping `concurrency` of them in flight: the next resume goes
    out when a resumed session's turn completes. Returns the wall-clock seconds."""
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
        events = producer.poll(inflight)
        for t, event in events:
            observe(t, event)
        inflight = [t for t in inflight if not t.done]
        if not events:
            if check is not None:
                check()
            time.sleep(0.002)
    return time.monotonic() - started
