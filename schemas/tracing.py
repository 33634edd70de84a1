"""Trace context on the wire, and the spans the engine's pure core describes (docs/tracing.md).

A turn is one trace. Its context is a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`):
the producer's own, sent in the turn's `message.create`, or else one the dispatcher derives
from the session and the turn (so a replayed transition derives the same one). The session
keeps it with the turn; every job of the turn carries it, every outcome names the job's span,
and every span the engine writes for the turn is in that trace.

The core computes no time and does no I/O: what it knows of a span (an interrupt's life, from
raised to answered) it returns as a `TraceSpan`, and the dispatcher's shell exports it.
"""

import hashlib
import re
from dataclasses import dataclass, field

#: a W3C traceparent of version 00, lowercase hex (https://www.w3.org/TR/trace-context/). An id
#: of all zeros matches too (the pattern language of pydantic's validator has no look-ahead):
#: the exporter reads such a context as none, and the span starts a trace of its own.
TRACEPARENT_PATTERN = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TRACEPARENT_RE = re.compile(TRACEPARENT_PATTERN)

Attribute = str | int | float | bool


def derived_traceparent(*parts: str) -> str:
    """A sampled traceparent derived from `parts` (the session, the turn): the same parts give
    the same trace, so a transition applied again after a crash names the same one."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    trace_id, span_id = digest[:32], digest[32:48]
    # an all-zero id is invalid; a sha256 prefix of all zeros is not a practical concern, but
    # the rule is cheap to keep
    trace_id = trace_id if trace_id.strip("0") else "1" + trace_id[1:]
    span_id = span_id if span_id.strip("0") else "1" + span_id[1:]
    return f"00-{trace_id}-{span_id}-01"


def trace_id_of(traceparent: str) -> str:
    return traceparent.split("-")[1]


@dataclass(frozen=True, slots=True)
class TraceSpan:
    """A span whose whole life the core knows: `name`, its parent (a traceparent), when it
    started and ended (Unix ms) and its attributes."""

    name: str
    parent: str
    start_ms: int
    end_ms: int
    attributes: dict[str, Attribute] = field(default_factory=dict)
