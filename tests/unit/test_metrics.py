"""What the shell counts from a committed transition (parley/metrics.py): the failure counters
are read off the transition's events, so the pure core needs no counter of its own for them."""

from typing import Any

from parley import metrics
from parley.dispatcher.core.transition import Transition
from parley.schemas.state import SessionState


def value(name: str) -> float:
    got = metrics.REGISTRY.get_sample_value(name)
    return 0.0 if got is None else got


def committed(*events: dict[str, Any]) -> Transition:
    return Transition(state=SessionState(core=None, messages={}, applied={}), events=list(events))


def test_failed_decisions_failed_model_calls_and_timed_out_resumes_are_counted() -> None:
    before = {n: value(n) for n in ("parley_decisions_failed_total", "parley_llm_failed_total",
                                    "parley_interrupts_timed_out_total")}
    metrics.record_transition(committed(
        {"type": "decision.failed", "error": "boom"},
        {"type": "llm.failed", "call_id": "llm-1", "error": "timeout"},
        {"type": "interrupt.resumed", "interrupt_id": "int-1", "timed_out": True},
        {"type": "interrupt.resumed", "interrupt_id": "int-2", "timed_out": False},
    ), 0.001)
    metrics.record_transition(committed({"type": "decision.failed", "error": "again"}), 0.001)
    assert value("parley_decisions_failed_total") - before["parley_decisions_failed_total"] == 2
    assert value("parley_llm_failed_total") - before["parley_llm_failed_total"] == 1
    assert value("parley_interrupts_timed_out_total") - before["parley_interrupts_timed_out_total"] == 1
