"""Scenario 13: long sessions (bench/README.md).

A real fleet (bench/fleet.py: redis-server with appendfsync always, a dispatcher, workers) runs
this module as its app. Three sessions are built through the engine:

- `fresh`: one turn (a user message, the model's reply): 2 messages.
- `long`: one turn whose model asks for `pad` tool calls, a hundred at a time, until the branch
  holds `messages` messages of ~4 KB each (the user message, the tools' results), then replies.
  `pad` is deferred: this driver settles each call with a `tool.result` input as it reads its
  `tool.deferred` (an input's transition, no job).
- `branched`: a root turn, then user messages forking from the root, each answered, until the
  tree has `branches` leaves.

Then, on each, a closed loop of `branch.switch` inputs (one input, a blocking XREAD on the
session's events stream until its `branch.switched`, the next; the three sessions take turns),
timed from XADD to the event, and `parley show` of it: `Client.show` plus `format_transcript`
in this process (what the command does, without starting Python), timed whole.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.fleet import Fleet
from parley.cli.transcript import format_transcript
from parley.client import Client

#: the app of the fleet (PARLEY_APP): `tools` and `llm` below; no `decide` (no decide jobs)
APP = "bench.long_sessions"
BODY_BYTES = 4_000
#: tool calls per model reply while filling the long session
FANOUT = 100


def pad(n: int) -> str:
    """Return a result of about 4 KB.

    Args:
        n: the call's number
    """
    return (f"{n:06} " * (BODY_BYTES // 7 + 1))[:BODY_BYTES]


# Settled by the driver's `tool.result` inputs (docs/protocol.md, Tools): a message each without a
# worker's round trip, so the 3,000 messages take seconds, not minutes.
pad.deferred = True  # type: ignore[attr-defined]

tools = [pad]


def llm(request: dict[str, Any]) -> dict[str, Any]:
    """A scripted model: a user message `fill N` is answered by `pad` calls until the branch holds
    N messages (the last one this reply), anything else by a short reply."""
    messages = request["messages"]
    first = messages[0]["content"]
    if not first.startswith("fill "):
        return {"content": "ok"}
    target = int(first.split()[1])
    room = target - len(messages) - 2  # this reply and the final one
    if room <= 0:
        return {"content": "done"}
    k = min(FANOUT, room)
    calls = [{"id": f"t{i}", "name": "pad", "arguments": {"n": len(messages) + i}} for i in range(k)]
    return {"content": "", "tool_calls": calls}


def _events(fleet: Fleet, session: str, last: str, until: Callable[[dict[str, Any]], bool],
            timeout_s: float) -> str:
    """Read the session's events after `last` until one satisfies `until`: its id."""
    key = fleet.keys.events(session)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = fleet.redis.xread({key: last}, count=1000, block=1000)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id.decode()
                if until(orjson.loads(fields[b"event"])):
                    return last
    raise TimeoutError(f"{session}: no awaited event in {timeout_s} s")


def _last_event(fleet: Fleet, session: str) -> str:
    last = fleet.redis.xrevrange(fleet.keys.events(session), count=1)
    return last[0][0].decode() if last else "0-0"


def _turns_completed(fleet: Fleet, session: str, n: int, timeout_s: float, after: str = "0-0") -> str:
    seen = 0

    def done(event: dict[str, Any]) -> bool:
        nonlocal seen
        seen += event["type"] == "turn.completed"
        return seen >= n
    return _events(fleet, session, after, done, timeout_s)


def build(fleet: Fleet, client: Client, messages: int, branches: int, timeout_s: float) -> dict[str, float]:
    """The three sessions, through the engine: seconds each took."""
    took: dict[str, float] = {}
    t = time.perf_counter()
    client.send("fresh", {"type": "message.create", "content": "hello"})
    _turns_completed(fleet, "fresh", 1, timeout_s)
    took["fresh"] = time.perf_counter() - t

    t = time.perf_counter()
    client.send("long", {"type": "message.create", "content": f"fill {messages} " + pad(0)})
    n = 0

    def settle(event: dict[str, Any]) -> bool:
        nonlocal n
        if event["type"] == "tool.deferred":
            n += 1
            client.send("long", {"type": "tool.result", "call_id": event["call_id"], "result": pad(n)})
        return event["type"] == "turn.completed"
    _events(fleet, "long", "0-0", settle, timeout_s)
    took["long"] = time.perf_counter() - t

    t = time.perf_counter()
    client.send("branched", {"type": "message.create", "content": "root " + pad(0), "message_id": "root"})
    last = _turns_completed(fleet, "branched", 1, timeout_s)
    for i in range(branches - 1):
        client.send("branched", {"type": "message.create", "content": f"fork {i} " + pad(i),
                                 "parent_id": "root"})
    _turns_completed(fleet, "branched", branches - 1, timeout_s, after=last)
    took["branched"] = time.perf_counter() - t
    return took


def switches(fleet: Fleet, client: Client, sessions: list[str], n: int,
             timeout_s: float) -> dict[str, list[float]]:
    """`n` branch switches on each session, one at a time, between its head and its first
    message: ms from sending each to its `branch.switched` event. The sessions take turns, one
    switch each, so a busy moment of the machine falls on all of them alike."""
    heads, last = {}, {}
    for session in sessions:
        view = client.show(session)
        assert view is not None
        heads[session] = [view["head"], view["messages"][0]["id"]]
        last[session] = _last_event(fleet, session)
    times: dict[str, list[float]] = {session: [] for session in sessions}
    for i in range(n):
        for session in sessions:
            t = time.perf_counter()
            client.send(session, {"type": "branch.switch", "head": heads[session][i % 2]})
            last[session] = _events(fleet, session, last[session], lambda e: e["type"] == "branch.switched",
                                    timeout_s)
            times[session].append((time.perf_counter() - t) * 1000)
    return times


def shows(client: Client, session: str, n: int) -> tuple[list[float], int, int]:
    """`parley show` of the session `n` times (in this process): ms each, its messages, its lines."""
    times, size, lines = [], 0, 0
    for _ in range(n):
        t = time.perf_counter()
        view = client.show(session)
        assert view is not None
        text = format_transcript(view)
        times.append((time.perf_counter() - t) * 1000)
        size, lines = len(view["messages"]), text.count("\n") + 1
    return times, size, lines


def long_sessions_row(workdir: Path, messages: int, branches: int, transitions: int, show_runs: int,
                      workers: int, timeout_s: float, dist: Callable[[list[float]], dict[str, Any]],
                      percentile: Callable[[list[float], float], float],
                      log: Callable[[str], None]) -> dict[str, Any]:
    fleet = Fleet(workdir, appendfsync="always", workers=workers, app=APP).start()
    try:
        client = Client(fleet.redis)
        built = build(fleet, client, messages, branches, timeout_s)
        log("  built in " + ", ".join(f"{k} {v:.1f} s" for k, v in built.items()))
        row: dict[str, Any] = {"messages": messages, "branches": branches, "transitions": transitions,
                               "build_s": {k: round(v, 2) for k, v in built.items()}}
        sessions = ["fresh", "long", "branched"]
        switched = switches(fleet, client, sessions, transitions, timeout_s)
        for session in sessions:
            raw = fleet.redis.hmget(fleet.keys.meta(session), "n_msgs", "n_branches")
            ms = switched[session]
            show_ms, size, lines = shows(client, session, show_runs)
            row[session] = {"n_msgs": int(raw[0] or 0), "n_branches": int(raw[1] or 0),
                            "transition_ms": {**dist(ms), "p95": round(percentile(ms, 0.95), 2)},
                            "show_ms": dist(show_ms), "show_messages": size, "show_lines": lines,
                            "msgs_hash_bytes": fleet.redis.memory_usage(fleet.keys.messages(session)),
                            "meta_hash_bytes": fleet.redis.memory_usage(fleet.keys.meta(session))}
            log(f"  {session}: {row[session]['n_msgs']} messages, {row[session]['n_branches']} branches: "
                f"transition p50 {row[session]['transition_ms'].get('p50')} ms, "
                f"show p50 {row[session]['show_ms'].get('p50')} ms")
        return row
    finally:
        fleet.stop()
