"""Prometheus metrics and health endpoints of real processes (docs/operations.md, Health and
Metrics)."""

import time
import urllib.request

import orjson
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from parley.client import Client
from parley.runtime.procs import free_port
from tests.conftest import Procs, eventually, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(port: int, path: str) -> int:
    return int(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status)


def test_counters_move_by_the_right_amounts(procs: Procs, r: redis.Redis, client: Client) -> None:
    dport, wport = free_port(), free_port()
    procs.dispatcher("examples.seed_app", "--metrics-port", str(dport))
    procs.worker("examples.seed_app", "--metrics-port", str(wport))
    eventually(lambda: _up(dport) and _up(wport), timeout=10)
    assert get(dport, "/healthz") == 200 and get(dport, "/readyz") == 200 and get(wport, "/readyz") == 200
    r.xadd("parley:inputs", {"session": "m1", "input": orjson.dumps(
        {"type": "message.create", "content": "Email bob@example.com: hi"})})
    wait_for(client, "m1", lambda e: e["type"] == "interrupt.raised")
    eventually(lambda: scrape(dport).get(("parley_open_interrupts", ())) == 1)
    m = scrape(dport)
    assert m[("parley_parked_branches", ())] == 1
    assert m[("parley_interrupts_raised_total", (("scope", "anchored"),))] == 1
    assert m[("parley_inputs_total", (("code", ""), ("outcome", "applied"), ("type", "message.create")))] == 1
    r.xadd("parley:inputs", {"session": "m1", "input": orjson.dumps(
        {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})})
    r.xadd("parley:inputs", {"session": "m1", "input": orjson.dumps(
        {"type": "interrupt.resume", "interrupt_id": "int-1"})})
    r.xadd("parley:inputs", {"session": "m1", "input": b"{oops"})
    wait_for(client, "m1", lambda e: e["type"] == "turn.completed")
    time.sleep(0.3)
    m = scrape(dport)
    assert m[("parley_interrupts_resumed_total", (("delivered", "true"),))] == 1
    assert m[("parley_inputs_total", (("code", "already_resumed"), ("outcome", "ignored"),
                                      ("type", "interrupt.resume")))] == 1
    assert m[("parley_inputs_total", (("code", "invalid_input"), ("outcome", "rejected"),
                                      ("type", "unknown")))] == 1
    assert m[("parley_open_interrupts", ())] == 0 and m[("parley_held_decisions", ())] == 0
    assert m[("parley_triggers_total", (("type", "tool.execute"),))] == 1
    assert m[("parley_actions_total", (("type", "interrupt"),))] == 1
    assert m[("parley_interrupt_wait_seconds_count", ())] == 1
    assert m[("parley_stream_pending", (("stream", "parley:inputs"),))] == 0
    assert m[("parley_queue_depth", (("queue", "decide"),))] == 0
    w = scrape(wport)
    # seed_app decides tool.execute and interrupt.resumed only (decide_on): 2 decide jobs, 2 LLM jobs
    assert w[("parley_jobs_total", (("kind", "decide"), ("outcome", "ok")))] == 2
    assert w[("parley_jobs_total", (("kind", "llm"), ("outcome", "ok")))] == 2
    assert w[("parley_job_seconds_count", (("kind", "llm"),))] == 2


def _up(port: int) -> bool:
    try:
        return get(port, "/healthz") == 200
    except OSError:
        return False


def test_interrupts_command_filters_for_scripts(procs: Procs, r: redis.Redis, client: Client) -> None:
    import json

    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    for s in ("team-a-1", "team-a-2", "team-b-1"):
        r.xadd("parley:inputs", {"session": s, "input": orjson.dumps(
            {"type": "message.create", "content": "Email bob@example.com: hi"})})
    for s in ("team-a-1", "team-a-2", "team-b-1"):
        wait_for(client, s, lambda e: e["type"] == "interrupt.raised")
    eventually(lambda: len(client.interrupts()) == 3)

    def run(*args: str) -> list[dict]:
        out = run_parley(["--redis-url", procs.url, "interrupts",
                              "--json", *args], text=True, check=True)
        return json.loads(out.stdout)

    assert sorted(row["session"] for row in run("--session-prefix", "team-a-")) == ["team-a-1", "team-a-2"]
    assert len(run("--reason", "confirm")) == 3 and run("--reason", "budget") == []
    assert run("--older-than", "3600") == []
    time.sleep(1.1)
    assert len(run("--older-than", "1")) == 3


def inputs(input_type: str, outcome: str, code: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("parley_inputs_total", (("code", code), ("outcome", outcome), ("type", input_type)))


def test_a_fresh_process_shows_known_label_series_at_zero(procs: Procs) -> None:
    """Dashboards show 0, not "No data", before anything happened: every labelled series whose
    label values are a known set exists from the start, as do the failure counters."""
    dport, wport = free_port(), free_port()
    procs.dispatcher("examples.seed_app", "--metrics-port", str(dport))
    procs.worker("examples.seed_app", "--metrics-port", str(wport))
    eventually(lambda: _up(dport) and _up(wport), timeout=10)
    d, w = scrape(dport), scrape(wport)
    zero = [
        inputs("interrupt.resume", "applied", ""), inputs("interrupt.resume", "refused", "forbidden"),
        inputs("message.create", "ignored", "duplicate"), inputs("unknown", "rejected", "invalid_input"),
        ("parley_triggers_total", (("type", "llm.failed"),)),
        ("parley_actions_total", (("type", "interrupt"),)),
        ("parley_interrupts_raised_total", (("scope", "global"),)),
        ("parley_interrupts_resumed_total", (("delivered", "false"),)),
        ("parley_results_dropped_total", (("reason", "stale_attempt"),)),
        ("parley_work_retried_total", (("kind", "tool"),)),
        ("parley_work_lost_total", (("kind", "llm"),)),
        ("parley_sweep_errors_total", (("sweep", "fire_deadlines"),)),
        ("parley_decisions_failed_total", ()),
        ("parley_llm_failed_total", ()),
        ("parley_interrupts_timed_out_total", ()),
    ]
    assert {key: d.get(key) for key in zero} == {key: 0.0 for key in zero}
    for kind in ("decide", "llm", "tool"):
        for outcome in ("ok", "error", "stopped"):
            assert w[("parley_jobs_total", (("kind", kind), ("outcome", outcome)))] == 0
        assert w[("parley_job_seconds_count", (("kind", kind),))] == 0


def test_failures_and_deadlines_are_counted_by_a_real_dispatcher(procs: Procs, r: redis.Redis,
                                                                 client: Client) -> None:
    dport = free_port()
    procs.dispatcher("tests.apps.scenarios", "--llm-timeout", "1", "--metrics-port", str(dport))
    procs.worker()
    eventually(lambda: _up(dport), timeout=10)
    for session, text in (("f1", "[decide-raises]"), ("f2", "[slow-llm] hi"),
                          ("f3", "email bob: [deadline] hi")):
        r.xadd("parley:inputs", {"session": session, "input": orjson.dumps(
            {"type": "message.create", "content": text})})
    wait_for(client, "f1", lambda e: e["type"] == "decision.failed", timeout=30)
    wait_for(client, "f2", lambda e: e["type"] == "llm.failed", timeout=30)
    wait_for(client, "f3", lambda e: e["type"] == "interrupt.resumed" and e["timed_out"], timeout=30)
    counted = ("parley_decisions_failed_total", "parley_llm_failed_total",
               "parley_interrupts_timed_out_total")
    # the events are committed before the dispatcher counts them: wait for the count, then check it
    eventually(lambda: all(scrape(dport)[(name, ())] >= 1 for name in counted))
    time.sleep(0.3)
    m = scrape(dport)
    assert {name: m[(name, ())] for name in counted} == dict.fromkeys(counted, 1.0)
