"""OpenTelemetry traces of turns, decisions, jobs and interrupts (docs/tracing.md).

Off unless a process is given an OTLP/HTTP endpoint (`--otel-endpoint`, PARLEY_OTEL_ENDPOINT):
then, and only then, the OpenTelemetry SDK (the `otel` extra) is imported, and spans go to
that endpoint in batches. Off, every function here is a no-op that imports nothing, so the
engine's hot path pays one attribute read.

The SDK's tracer provider is this module's own, not the process's global one: an app that
traces with its own provider keeps it, and Parley's spans go where the operator said.
"""

import atexit
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from parley.runtime.logs import kv
from parley.schemas.tracing import TRACEPARENT_RE, Attribute, TraceSpan

log = logging.getLogger("parley.telemetry")

#: how long finished spans wait before they are sent (the SDK's default is 5 s)
EXPORT_DELAY_MS = 500


class TelemetryUnavailable(RuntimeError):
    """Tracing was asked for and the OpenTelemetry SDK is not installed."""


@dataclass
class _State:
    tracer: Any = None
    provider: Any = None
    service: str | None = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def configure(service: str, endpoint: str | None, *, exporter: Any = None) -> bool:
    """Trace this process as `service`, exporting to the OTLP/HTTP traces `endpoint` (e.g.
    http://collector:4318/v1/traces). No endpoint: off (returns False). `exporter`: a span
    exporter of the SDK's instead (tests)."""
    if not endpoint and exporter is None:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TelemetryUnavailable("tracing needs the OpenTelemetry SDK: pip install 'parley[otel]' "
                                   f"({exc})") from None
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS))
    _state.provider, _state.tracer, _state.service = provider, provider.get_tracer("parley"), service
    atexit.register(shutdown)
    log.info("tracing", extra=kv(service=service, endpoint=endpoint or "(given exporter)"))
    return True


def shutdown() -> None:
    """Send what is left and stop (at exit, and when a process stops)."""
    provider, _state.provider, _state.tracer = _state.provider, None, None
    if provider is not None:
        provider.shutdown()


def _context(traceparent: str | None) -> Any:
    """The SDK context whose parent is `traceparent` (None, or not one: a new trace)."""
    if traceparent is None or not TRACEPARENT_RE.fullmatch(traceparent):
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def traceparent_of(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def record(span: TraceSpan) -> None:
    """Export a span whose whole life is known (the core's: an interrupt's)."""
    if _state.tracer is None:
        return
    live = _state.tracer.start_span(span.name, context=_context(span.parent), attributes=span.attributes,
                                    start_time=span.start_ms * 1_000_000)
    live.end(end_time=span.end_ms * 1_000_000)


def transition(parent: str | None, start_ns: int, end_ns: int, attributes: dict[str, Attribute],
               spans: list[TraceSpan]) -> None:
    """The dispatcher's span of one applied entry (in the trace of the turn it touched: a
    transition that touched none is not traced), and the spans the core described."""
    if _state.tracer is None:
        return
    if parent is not None:
        live = _state.tracer.start_span("parley.transition", context=_context(parent), attributes=attributes,
                                        start_time=start_ns)
        live.end(end_time=end_ns)
    for span in spans:
        record(span)


@dataclass
class JobSpan:
    """A worker's span of one job, open while it runs: `set` adds attributes as they are learnt
    (a model's tokens), `traceparent` names it in the outcome."""

    live: Any = None
    attributes: dict[str, Attribute] = field(default_factory=dict)

    def set(self, key: str, value: Attribute | None) -> None:
        if self.live is not None and value is not None:
            self.live.set_attribute(key, value)

    @property
    def traceparent(self) -> str | None:
        return traceparent_of(self.live) if self.live is not None else None


@contextmanager
def job_span(name: str, parent: str | None, attributes: dict[str, Attribute]) -> Iterator[JobSpan]:
    """A span around a job of a traced turn (`parent`: the job's trace context); none when
    tracing is off or the job carries no trace."""
    if _state.tracer is None or parent is None:
        yield JobSpan()
        return
    live = _state.tracer.start_span(name, context=_context(parent), attributes=attributes)
    try:
        yield JobSpan(live)
    finally:
        live.end()


def current_traceparent() -> str | None:
    """The traceparent of the OpenTelemetry span current in the caller (a producer's), or None:
    no span, or OpenTelemetry not in use by the process (it is not imported for this)."""
    import sys

    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    span = trace.get_current_span()
    return traceparent_of(span) if span.get_span_context().is_valid else None
