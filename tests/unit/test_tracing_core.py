"""The pure core's part of tracing (docs/tracing.md): a turn keeps its trace context, its jobs
carry it, a transition names the trace it belongs to, and an interrupt's life is described as
a span, whole, when it ends; no I/O."""

from typing import Any

import pytest

from parley.dispatcher.core import Enqueue
from parley.schemas.codec import InputError
from parley.schemas.tracing import TRACEPARENT_RE, derived_traceparent, trace_id_of
from tests.unit.harness import Sim

PRODUCERS = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def job_traces(s: Sim) -> list[Any]:
    """The trace context of every job enqueued so far, in order."""
    return [fx.args.get("trace") for fx in s.effects if isinstance(fx, Enqueue)]


def test_the_producers_trace_context_is_the_turns_and_every_job_of_the_turn_carries_it() -> None:
    s = Sim()
    s.tracing = True
    tr = s.input({"type": "message.create", "content": "hi", "traceparent": PRODUCERS})
    turn = s.ev("message.created")["message"]["id"]
    assert s.turn(turn).trace == PRODUCERS and tr.trace == PRODUCERS
    assert job_traces(s) == [PRODUCERS]  # the decide of session.created (created by the message)
    s.decide()
    assert job_traces(s) == [PRODUCERS, PRODUCERS]  # and of message.created
    s.decide()
    assert s.running_llm() and job_traces(s)[-1] == PRODUCERS  # the model call


@pytest.mark.parametrize("sent", [None, PRODUCERS])
def test_an_untraced_dispatcher_keeps_no_trace_even_of_a_producers_turn(sent: str | None) -> None:
    s = Sim()
    message = {"type": "message.create", "content": "hi"}
    tr = s.input(message if sent is None else {**message, "traceparent": sent})
    assert s.turn(s.ev("message.created")["message"]["id"]).trace is None
    assert tr.trace is None and job_traces(s) == [None] and tr.spans == []
    s.decide()
    s.decide()
    assert set(job_traces(s)) == {None}
    assert "trace" not in s.core.to_json()  # nothing stored: no bytes spent


def test_a_tracing_dispatcher_derives_a_turns_trace_the_same_way_every_time() -> None:
    def first_turn_trace() -> str | None:
        s = Sim()
        s.tracing = True
        s.send("hi")
        return s.turn(s.ev("message.created")["message"]["id"]).trace

    trace = first_turn_trace()
    assert trace is not None and TRACEPARENT_RE.fullmatch(trace)
    assert trace == first_turn_trace()  # a replayed transition names the same trace
    assert trace_id_of(trace) != trace_id_of(derived_traceparent("s1", "msg-2", "1002"))


def test_a_transition_applying_an_outcome_is_in_the_job_spans_trace() -> None:
    s = Sim()
    s.tracing = True
    s.input({"type": "message.create", "content": "hi", "traceparent": PRODUCERS})
    s.decide()
    s.decide()
    [llm] = s.running_llm()
    job_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
    tr = s.outcome("llm", llm, 1, value={"content": "hello"}, trace=job_span)
    assert tr.trace == job_span


def test_an_interrupts_life_is_one_span_from_raised_to_answered() -> None:
    s = Sim()
    s.tracing = True
    _turn, _calls, iid = s.pause_on_tool("send_email", reason="confirm")
    raised, trace = s.interrupt(iid).raised_at, s.interrupt(iid).trace
    assert trace is not None and trace == s.turn(_turn).trace  # kept with the interrupt
    tr = s.resume(iid, {"ok": True}, signed_by="alice")
    [span] = tr.spans
    assert span.name == "parley.interrupt" and span.parent == trace
    assert (span.start_ms, span.end_ms) == (raised, s.now)
    assert span.attributes == {
        "parley.session": "s1", "parley.interrupt.id": iid, "parley.interrupt.reason": "confirm",
        "parley.interrupt.outcome": "resumed", "parley.interrupt.wait_ms": s.now - raised,
        "parley.interrupt.principal": "alice", "parley.interrupt.default_used": False,
        "parley.interrupt.delivered": True}
    assert tr.trace == span.parent


def test_a_deadline_is_a_timed_out_span_that_used_the_default() -> None:
    s = Sim()
    s.tracing = True
    _turn, _calls, iid = s.pause_on_tool("send_email", timeout_s=60, default={"ok": False})
    [span] = s.deadline(iid).spans
    assert span.attributes["parley.interrupt.outcome"] == "timed_out"
    assert span.attributes["parley.interrupt.default_used"] is True
    assert "parley.interrupt.principal" not in span.attributes


def test_a_closed_session_ends_its_open_interrupts_spans_as_cancelled() -> None:
    s = Sim()
    s.tracing = True
    s.pause_on_tool("send_email")
    [span] = s.input({"type": "session.close", "reason": "done"}).spans
    assert (span.attributes["parley.interrupt.outcome"], span.attributes["parley.interrupt.why"]) == \
        ("cancelled", "done")


def test_an_untraced_interrupt_describes_no_span() -> None:
    s = Sim()
    _turn, _calls, iid = s.pause_on_tool("send_email")
    assert s.resume(iid, {"ok": True}).spans == []


@pytest.mark.parametrize("bad", ["00-xyz", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                 "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", 7])
def test_a_traceparent_that_is_not_one_is_refused_saying_where(bad: Any) -> None:
    with pytest.raises(InputError, match="traceparent"):
        Sim().entry({"type": "message.create", "content": "hi", "traceparent": bad})
