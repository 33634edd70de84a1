"""parley/runtime/telemetry.py: what the processes export (with the SDK's in-memory exporter),
and that with tracing off nothing is imported and nothing happens."""

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from parley.client.producer import traced
from parley.runtime import telemetry
from parley.schemas.tracing import TraceSpan

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert telemetry.configure("parley-test", None, exporter=exporter)
    yield exporter
    telemetry.shutdown()


def finished(exporter: InMemorySpanExporter) -> list:  # type: ignore[type-arg]
    telemetry._state.provider.force_flush()
    return list(exporter.get_finished_spans())


def test_off_is_the_default_and_costs_nothing() -> None:
    assert not telemetry.configure("parley-test", None)
    assert not telemetry.enabled()
    with telemetry.job_span("chat m", PARENT, {}) as span:
        span.set("x", 1)
    assert span.traceparent is None
    telemetry.transition(PARENT, 0, 1, {}, [TraceSpan("parley.interrupt", PARENT, 0, 1)])  # a no-op


def test_a_process_without_an_endpoint_never_imports_opentelemetry() -> None:
    code = ("import sys, parley.runtime.telemetry as t, parley.client.producer as p\n"
            "assert not t.configure('x', None)\n"
            "p.traced({'type': 'message.create', 'content': 'hi'})\n"
            "with t.job_span('n', None, {}): pass\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_a_span_known_whole_is_exported_with_its_times_parent_and_attributes(
        exported: InMemorySpanExporter) -> None:
    telemetry.record(TraceSpan("parley.interrupt", PARENT, 1_700_000_000_000, 1_700_000_002_500,
                               {"parley.interrupt.reason": "approval"}))
    [span] = finished(exported)
    assert span.name == "parley.interrupt"
    assert (span.start_time, span.end_time) == (1_700_000_000_000 * 10**6, 1_700_000_002_500 * 10**6)
    assert f"{span.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.attributes["parley.interrupt.reason"] == "approval"
    assert span.resource.attributes["service.name"] == "parley-test"


def test_a_transition_with_no_trace_is_not_exported_but_its_spans_are(exported: InMemorySpanExporter) -> None:
    telemetry.transition(None, 0, 10, {"parley.session": "s"}, [TraceSpan("parley.interrupt", PARENT, 0, 1)])
    assert [s.name for s in finished(exported)] == ["parley.interrupt"]


def test_a_job_span_is_the_parents_child_and_names_itself_for_the_outcome(
        exported: InMemorySpanExporter) -> None:
    with telemetry.job_span("execute_tool pay", PARENT, {"gen_ai.tool.name": "pay"}) as span:
        span.set("gen_ai.usage.input_tokens", 7)
        span.set("ignored", None)
        posted = span.traceparent
    [done] = finished(exported)
    assert posted == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{done.context.span_id:016x}-01"
    assert done.attributes == {"gen_ai.tool.name": "pay", "gen_ai.usage.input_tokens": 7}


def test_a_bad_parent_starts_a_trace_of_its_own(exported: InMemorySpanExporter) -> None:
    telemetry.record(TraceSpan("parley.interrupt", "not a traceparent", 0, 1))
    [span] = finished(exported)
    assert span.parent is None


def test_a_producers_current_span_is_the_turns_trace() -> None:
    tracer = TracerProvider().get_tracer("app")
    message = {"type": "message.create", "content": "hi"}
    assert traced(message) == message  # no span: nothing added
    with tracer.start_as_current_span("request") as span:
        sent = traced(message)
        own = traced({**message, "traceparent": PARENT})
        resume = traced({"type": "interrupt.resume", "interrupt_id": "int-1"})
    ctx = span.get_span_context()
    assert sent["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert own["traceparent"] == PARENT and "traceparent" not in resume
