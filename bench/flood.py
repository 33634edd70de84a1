"""Scenario 10: fairness under a flood (bench/README.md).

A fleet (one dispatcher, one worker, appendfsync always) with two registered producers. The
`flood` producer writes 20,000 inputs for ONE session as fast as a pipeline goes, while the
`web` producer sends one message every 50 ms, each to a session of its own. The figure is the
delay of `web`'s messages: the entry's id (Redis's clock when it was written) to the `at` of its
`message.created` event (the dispatcher's clock, same machine), p50/p99 over the messages sent
while the flood lasts (at most 15 s, `--flood-window`).

Two rows: the flood appended straight to the producer's own stream (`XADD parley:in:flood`,
bypassing the submit function and its limits: the worst case), and the flood submitted through
the client, whose submit function refuses what is over the pending limit (most of it).
"""

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.fleet import Fleet
from parley.schemas.producers import new_producer

FLOODED = "flooded"
PROBE_EVERY_S = 0.05
# how long the other producer's messages are sent (--flood-window): the flood takes longer to
# drain (one session's entries go one transition after the other: 11,912 of 20,000 were still
# to apply after 30 s on 2026-12-01), so every message of a 15 s window is sent under the flood
PROBE_WINDOW_S = 15.0
WRITE_BATCH = 500


def message(session: str, text: str) -> dict[str, Any]:
    return {"session": session, "input": orjson.dumps({"type": "message.create", "content": text})}


def entry_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def flood_straight(r: redis.Redis, stream: str, n: int) -> dict[str, Any]:
    """n inputs of one session appended straight to the producer's stream, in pipelines."""
    for start in range(0, n, WRITE_BATCH):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(n, start + WRITE_BATCH)):
            pipe.xadd(stream, message(FLOODED, f"flood {i}"))
        pipe.execute()
    return {"written": n, "refused": 0}


def flood_submitted(url: str, n: int) -> dict[str, Any]:
    """n inputs of one session through the client's submit path as producer `flood`: what the
    submit function refuses synchronously (over the pending limit) is counted, not retried."""
    from parley.client import Client

    # as producer `flood`: its inputs go through the submit function to its own stream
    as_producer: dict[str, Any] = {"producer": "flood"}
    client = Client(redis.Redis.from_url(url), **as_producer)
    written = refused = 0
    for i in range(n):
        try:
            client.send(FLOODED, {"type": "message.create", "content": f"flood {i}"})
            written += 1
        except Exception as exc:  # SubmitRefused: the submit function said no
            if type(exc).__name__ != "SubmitRefused":
                raise
            refused += 1
    return {"written": written, "refused": refused}


def flood_row(workdir: Path, inputs: int, submit: bool, timeout: float,
              dist: Callable[[list[float]], dict[str, Any]], log: Callable[[str], None],
              window_s: float = PROBE_WINDOW_S) -> dict[str, Any]:
    mode = "submit function" if submit else "straight to the stream"
    with Fleet(workdir, appendfsync="always", workers=1) as fleet:
        r, keys = fleet.redis, fleet.keys
        for name in ("flood", "web"):
            r.hset(keys.producers, name, new_producer(name, None).to_json())
        flood_stream, web_stream = keys.producer_inputs("flood"), keys.producer_inputs("web")
        deadline = time.monotonic() + 30
        # the dispatcher reads the registry every couple of seconds: wait for its groups
        while not (r.exists(flood_stream) and r.exists(web_stream)):
            if time.monotonic() > deadline:
                return {"mode": mode, "inputs": inputs, "skipped": "the dispatcher never read the producers"}
            time.sleep(0.1)
        if submit and not r.function_list(library="parley"):
            return {"mode": mode, "inputs": inputs,
                    "skipped": "the submit function (library parley) is not loaded"}

        done = threading.Event()
        flood_out: dict[str, Any] = {}
        errors: list[BaseException] = []

        def run_flood() -> None:
            try:
                started = time.monotonic()
                flood_out.update(flood_submitted(fleet.url, inputs) if submit
                                 else flood_straight(redis.Redis.from_url(fleet.url), flood_stream, inputs))
                flood_out["write_s"] = round(time.monotonic() - started, 2)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        probes: list[tuple[str, int]] = []
        thread = threading.Thread(target=run_flood, daemon=True)
        started = time.monotonic()
        thread.start()
        i = 0
        # probe while the flood is written and then applied, for up to window_s
        while not done.is_set() or r.xlen(flood_stream):
            if time.monotonic() - started > min(timeout, window_s):
                break
            session = f"probe-{i}"
            probes.append((session, entry_ms(r.xadd(web_stream, message(session, "are you there?")))))
            i += 1
            time.sleep(PROBE_EVERY_S)
        thread.join(timeout=60)
        probed_s = round(time.monotonic() - started, 2)
        if errors:
            return {"mode": mode, "inputs": inputs, "skipped": f"the flood failed: {errors[0]!r}"}
        delays: list[float] = []
        missing = 0
        wait_until = time.monotonic() + 30
        for session, sent_ms in probes:
            at = None
            while at is None and time.monotonic() < wait_until:
                for _id, fields in r.xrange(keys.events(session)):
                    event = orjson.loads(fields[b"event"])
                    if event["type"] == "message.created":
                        at = event["at"]
                        break
                else:
                    time.sleep(0.05)
            if at is None:
                missing += 1
            else:
                delays.append(float(at - sent_ms))
        fleet.check_alive()
        row = {"mode": mode, "inputs": inputs, **flood_out, "probes": len(probes), "missing": missing,
               "probed_s": probed_s, "delay_ms": dist(delays),
               "flood_left": int(r.xlen(flood_stream))}
        d = row["delay_ms"]
        log(f"  {mode}: {row.get('written')} written, {row.get('refused')} refused; other session's "
            f"message delay p50 {d.get('p50')} ms p99 {d.get('p99')} ms over {len(delays)} messages "
            f"({missing} missing) in {probed_s} s; {row['flood_left']} of the flood still to apply")
        return row
