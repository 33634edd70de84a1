"""What the shell counts from a committed transition (parley/runtime/metrics.py): the failure counters
are read off the transition's events, so the pure core needs no counter of its own for them."""

from typing import Any

from parley.dispatcher.core.transition import Transition
from parley.runtime import metrics
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


# ---- the shard label -----------------------------------------------------------------------------

def served_samples() -> list[Any]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(metrics.served()).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_set_shard_labels_every_served_series_and_leaves_the_metrics_themselves_alone() -> None:
    """A process of shard 1 serves every sample (counters, labelled counters, histograms'
    buckets) with shard="1"; the registry the code counts into keeps no such label."""
    metrics.INPUTS.labels("message.create", "applied", "").inc()
    metrics.TRANSITION_SECONDS.observe(0.002)
    assert all("shard" not in s.labels for s in served_samples())  # before: unlabelled
    try:
        metrics.set_shard(1)
        samples = served_samples()
        assert samples, "nothing served"
        assert {s.labels.get("shard") for s in samples} == {"1"}
        names = {s.name for s in samples}
        assert {"parley_inputs_total", "parley_transition_seconds_bucket"} <= names
        # the other labels are kept beside the new one
        inputs = [s for s in samples if s.name == "parley_inputs_total"
                  and s.labels.get("type") == "message.create" and s.labels.get("outcome") == "applied"]
        assert inputs and inputs[0].value >= 1
        assert metrics.REGISTRY.get_sample_value("parley_transitions_total") is not None
        assert all("shard" not in s.labels for fam in metrics.REGISTRY.collect() for s in fam.samples)
        # a count made after set_shard shows in the served, labelled series
        before = inputs[0].value
        metrics.INPUTS.labels("message.create", "applied", "").inc()
        again = [s for s in served_samples() if s.name == "parley_inputs_total"
                 and s.labels.get("type") == "message.create" and s.labels.get("outcome") == "applied"]
        assert again[0].value == before + 1
        metrics.set_shard(0)  # called again: the label is replaced, not added twice
        assert {s.labels.get("shard") for s in served_samples()} == {"0"}
    finally:
        metrics._served = metrics.REGISTRY


def test_the_metrics_endpoint_serves_the_labelled_registry() -> None:
    """/metrics of `serve` (what dispatchers and workers run) carries the label once it is set."""
    import urllib.request

    from parley.runtime.procs import free_port

    class Ready:
        def ready(self) -> tuple[bool, str]:
            return True, "ok"

    port = free_port()
    server = metrics.serve(port, None, None, Ready(), redis_state=False)  # type: ignore[arg-type]
    try:
        metrics.set_shard(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'parley_transitions_total{shard="3"}' in text
        metrics._served = metrics.REGISTRY
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert 'shard="3"' not in reply.read().decode()
    finally:
        metrics._served = metrics.REGISTRY
        server.shutdown()
        server.server_close()
