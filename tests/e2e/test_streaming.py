"""Token streaming end to end, as deployed: Redis with the shipped redis.conf and users.acl, the
dispatcher and the worker under their shipped logins, the session written and watched under
the producer login, and a local OpenAI-compatible server that streams (tests/sse_server.py),
which keeps what it was asked outside the system under test.

A reply's pieces arrive on the watch in order, before the durable `message.created` that
records the reply whole. A worker killed -9 mid-stream leaves pieces on the deltas stream and
nothing in the transcript: the call is retried as attempt 2, which streams the whole reply
again, and the transcript holds that one reply."""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.deltas import Delta
from tests.conftest import Procs, all_events, of_type, wait_for
from tests.sse_server import Stream, StreamServer, stream_server

pytestmark = pytest.mark.e2e

APP = "tests.apps.streaming_app"
PIECES = ["The launch ", "moved ", "to ", "Friday, ", "the ", "team ", "says."]


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


@pytest.fixture
def model_server() -> Iterator[StreamServer]:
    with stream_server() as server:
        yield server


def start(procs: Procs, model_server: StreamServer) -> None:
    procs.dispatcher(APP)
    start_worker(procs, model_server)


def start_worker(procs: Procs, model_server: StreamServer):  # type: ignore[no-untyped-def]
    return procs.start("worker", APP, env={"PARLEY_LLM_BASE_URL": model_server.base_url})


def watched(client: Client, session: str) -> list[Any]:
    """Everything the watch with deltas yields, up to the turn's end."""
    seen: list[Any] = []
    for _id, item in client.watch(session, deltas=True, block_ms=200):
        seen.append(item)
        if item.type == "turn.completed":
            return seen
    raise AssertionError("the watch ended")


def assistant_replies(client: Client, session: str) -> list[str]:
    return [e["message"]["content"] for e in of_type(all_events(client, session), "message.created")
            if e["message"]["role"] == "assistant"]


def test_a_replys_pieces_arrive_in_order_before_the_message_that_records_it(
        procs: Procs, producer_client: Client, model_server: StreamServer) -> None:
    model_server.reply(Stream(PIECES, delay_s=0.05))
    start(procs, model_server)
    producer_client.send("st-1", {"type": "message.create", "content": "When is the launch?"})
    seen = watched(producer_client, "st-1")
    kinds = ["delta" if isinstance(i, Delta) else i.type for i in seen]
    recorded = next(n for n, i in enumerate(seen) if i.type == "message.created"
                    and i.message["role"] == "assistant")
    deltas = [i for i in seen if isinstance(i, Delta)]
    assert deltas and max(n for n, k in enumerate(kinds) if k == "delta") < recorded
    assert "".join(d.text for d in deltas) == "".join(PIECES)
    assert [d.seq for d in deltas] == list(range(1, len(deltas) + 1))
    assert {(d.call_id, d.attempt) for d in deltas} == {("llm-1", 1)}
    assert assistant_replies(producer_client, "st-1") == ["".join(PIECES)]
    [asked] = model_server.received
    assert asked["stream"] is True
    assert asked["messages"][0] == {"role": "system", "content": "Answer in one sentence."}


def test_a_worker_killed_mid_stream_leaves_no_half_reply_and_the_retry_streams_it_whole(
        procs: Procs, producer_client: Client, client: Client, model_server: StreamServer) -> None:
    slow = [f"piece {n} " for n in range(40)]
    model_server.reply(Stream(slow, delay_s=0.15), Stream(PIECES))
    procs.dispatcher(APP)
    first = start_worker(procs, model_server)
    producer_client.send("st-2", {"type": "message.create", "content": "When is the launch?"})
    early: list[Delta] = []
    for _id, item in producer_client.watch("st-2", deltas=True, block_ms=200):
        if isinstance(item, Delta):
            early.append(item)
        if len(early) >= 3:
            break
    first.kill()
    first.wait()
    procs.forget(first)
    assert assistant_replies(client, "st-2") == []  # nothing of the half reply is recorded
    start_worker(procs, model_server)
    wait_for(client, "st-2", lambda e: e["type"] == "turn.completed", timeout=60)

    assert assistant_replies(client, "st-2") == ["".join(PIECES)]
    events = all_events(client, "st-2")
    assert len(of_type(events, "llm.started")) == 1 and len(of_type(events, "llm.completed")) == 1
    pieces = deltas_of(client, "st-2")
    by_attempt = {a: "".join(d.text for d in pieces if d.attempt == a) for a in {d.attempt for d in pieces}}
    assert by_attempt[2] == "".join(PIECES)  # the retry streamed the whole reply again
    assert by_attempt[1].startswith("piece 0 piece 1 piece 2 ") and by_attempt[1] != "".join(slow)
    assert len(model_server.received) == 2  # the killed attempt's request, and the retry's


def deltas_of(client: Client, session: str) -> list[Delta]:
    """Every piece the session's deltas stream holds (the watch reads it from its start)."""
    return [i for _id, i in client.watch(session, deltas=True, block_ms=10, until=time.monotonic() + 0.5)
            if isinstance(i, Delta)]
