"""Traces end to end, as deployed: Redis with the shipped redis.conf and users.acl, a dispatcher
and a worker as processes under their logins, exporting by OTLP/HTTP to a local receiver
(tests/otlp_receiver.py, which keeps every span in a file outside the system under test).

The producer sends the turn's message inside a span of its own (the OpenTelemetry SDK in this
process): every span the dispatcher and the worker export for the turn (each transition, the
model call, the approval's life, the tool call) is in that one trace, down to the turn's end.
An interrupt's span says its reason, who answered, how long it waited and whether its default
was used. With no endpoint, nothing is exported."""

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import Tracer, TracerProvider

from parley.client import Client
from parley.runtime.procs import RedisServer
from parley.schemas.keys import Keys
from tests.conftest import Procs, all_events, of_type, wait_for
from tests.otlp_receiver import Receiver, Span, otlp_receiver
from tests.sse_server import Stream, StreamServer, stream_server

pytestmark = pytest.mark.e2e

APP = "tests.apps.agui_app"
DESK_KEY = "desk-signing-key-0123456789"
PAY = {"id": "m-call-1", "name": "pay", "arguments": {"to": "acme", "amount": "120 EUR"}}


@pytest.fixture
def redis_server(deployed_redis_server: RedisServer) -> RedisServer:
    return deployed_redis_server


@pytest.fixture
def model_server() -> Iterator[StreamServer]:
    with stream_server() as server:
        yield server


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with otlp_receiver(tmp_path / "spans.jsonl") as received:
        yield received


def start(procs: Procs, model_server: StreamServer, tmp_path: Path, endpoint: str | None,
          env: dict[str, str] | None = None) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"desk": DESK_KEY}))
    otel = {"PARLEY_OTEL_ENDPOINT": endpoint} if endpoint else {}
    otel |= env or {}
    procs.start("dispatcher", APP, "--keys-file", str(keys), env=otel)
    procs.start("worker", APP, env={"PARLEY_LLM_BASE_URL": model_server.base_url, **otel})


def pay_once(producer: Client, client: Client, session: str, model_server: StreamServer,
             tracer: Tracer | None = None) -> str | None:
    """One approved payment; the trace id of the producer's span it was sent in (None: none)."""
    model_server.reply(Stream(["Paying."], tool_calls=[PAY]), Stream(["Paid."]))
    send = {"type": "message.create", "content": "Pay acme's invoice"}
    trace_id = None
    if tracer is None:
        producer.send(session, send)
    else:
        with tracer.start_as_current_span("user request") as span:
            producer.send(session, send)
            trace_id = f"{span.get_span_context().trace_id:032x}"
    asked = wait_for(client, session, lambda e: e["type"] == "interrupt.raised")[-1]
    producer.resume(session, asked["interrupt_id"], {"approved": True}, principal="desk", key=DESK_KEY)
    wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=30)
    return trace_id


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_one_turn_is_one_trace_across_the_producer_the_dispatcher_and_the_worker(
        procs: Procs, producer_client: Client, client: Client, model_server: StreamServer,
        receiver: Receiver, tmp_path: Path) -> None:
    start(procs, model_server, tmp_path, receiver.url)
    tracer = TracerProvider().get_tracer("the producer's app")
    producers_trace = pay_once(producer_client, client, "tr-1", model_server, tracer)

    def complete(spans: list[Span]) -> bool:
        return (len(named(spans, "chat stream-model")) == 2 and bool(named(spans, "execute_tool pay"))
                and bool(named(spans, "parley.interrupt")))

    spans = receiver.wait(complete)
    assert {s.trace_id for s in spans} == {producers_trace}  # every span is in the producer's trace
    assert {s.service for s in spans} == {"parley-dispatcher", "parley-worker"}
    transitions = named(spans, "parley.transition")
    assert len(transitions) >= 5  # the message, the model's replies, the resume, the tool's result
    types = {s.attributes.get("parley.input.type") for s in transitions}
    assert {"message.create", "interrupt.resume"} <= types

    chat = named(spans, "chat stream-model")[0]
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "stream-model"
    usage = (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"])
    assert usage == (7, 5)
    [tool] = named(spans, "execute_tool pay")
    assert (tool.attributes["gen_ai.tool.name"], tool.attributes["gen_ai.tool.call.id"]) == ("pay", "call-1")
    # the transition applying a job's outcome is the job span's child
    assert any(t.parent_span_id == tool.span_id for t in transitions)

    [life] = named(spans, "parley.interrupt")
    assert life.service == "parley-dispatcher"
    assert {k: life.attributes[k] for k in ("parley.interrupt.reason", "parley.interrupt.outcome",
                                            "parley.interrupt.principal", "parley.interrupt.default_used",
                                            "gen_ai.tool.call.id")} == \
        {"parley.interrupt.reason": "approval", "parley.interrupt.outcome": "resumed",
         "parley.interrupt.principal": "desk", "parley.interrupt.default_used": False,
         "gen_ai.tool.call.id": "call-1"}
    [raised] = of_type(all_events(client, "tr-1"), "interrupt.raised")
    [resumed] = of_type(all_events(client, "tr-1"), "interrupt.resumed")
    assert life.attributes["parley.interrupt.wait_ms"] == resumed["at"] - raised["at"]
    assert (life.start_ns // 1_000_000, life.end_ns // 1_000_000) == (raised["at"], resumed["at"])


def test_a_turn_sent_outside_any_span_gets_a_trace_of_its_own(
        procs: Procs, producer_client: Client, client: Client, model_server: StreamServer,
        receiver: Receiver, tmp_path: Path) -> None:
    start(procs, model_server, tmp_path, receiver.url)
    pay_once(producer_client, client, "tr-2", model_server)
    spans = receiver.wait(lambda s: bool(named(s, "execute_tool pay")) and bool(named(s, "parley.interrupt")))
    assert len({s.trace_id for s in spans}) == 1


def test_without_an_endpoint_nothing_is_exported(procs: Procs, producer_client: Client, client: Client,
                                                 model_server: StreamServer, receiver: Receiver,
                                                 tmp_path: Path) -> None:
    # the SDK's own variable names the receiver: were tracing on by any other way, it would export
    # there. Parley's endpoint is not given, so nothing must be.
    start(procs, model_server, tmp_path, None, env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
                                                      "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    tracer = TracerProvider().get_tracer("the producer's app")
    pay_once(producer_client, client, "tr-3", model_server, tracer)
    time.sleep(1.0)  # two export periods
    assert receiver.requests == 0
    # the producer's trace context was not kept: an untraced dispatcher stores none
    core = client.redis.hget(Keys().meta("tr-3"), "core")
    assert core is not None and b"trace" not in core
    assert of_type(all_events(client, "tr-3"), "turn.completed")
