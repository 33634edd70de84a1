"""Sub-agents in the pure core (docs/protocol.md, Tools: `fn.agent`; Sub-agents): child ids the
engine owns, a spawn that never adopts an existing session, the time limit of a sub-agent
call, and closing a child the parent stopped waiting for."""

import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from parley.dispatcher.core import (
    AppInfo,
    Close,
    DeadlineAdd,
    DeadlineRemove,
    IndexRemove,
    Limits,
    Report,
    Retire,
    Spawn,
    ToolInfo,
)
from parley.schemas.codec import InputError
from parley.schemas.ids import subagent_deadline
from parley.schemas.signing import ENGINE_PRINCIPAL, Keyring, Unauthorized, signed_fields

from .harness import Sim, make_app

AGENT = "apps:helper"
PARENT_TOOLS = {"research": ToolInfo(agent=AGENT), "quick": ToolInfo(agent=AGENT, timeout_s=2),
                "search": ToolInfo()}
CHILD_APP = AppInfo(has_decide=False, tools={"search": ToolInfo(), "dig": ToolInfo(agent=AGENT)})
NOW = int(time.time() * 1000)
LINK = {"session": "p", "call_id": "call-1", "attempt": 1, "app": AGENT, "reply_to": "parley:results"}


def parent_sim(**limits: float) -> Sim:
    return Sim(make_app(has_decide=False, tools=PARENT_TOOLS), session="p", agents={AGENT: CHILD_APP},
               limits=Limits(**limits))


def child_sim(session: str = "p:sub-1") -> Sim:
    return Sim(make_app(has_decide=False, tools={}), session=session, agents={AGENT: CHILD_APP})


def spawn_entry(link: dict[str, Any] | None = None, task: str = '{"topic": "otters"}') -> dict[str, Any]:
    return {"type": "session.create", "parent": link or LINK, "task": task}


def close_entry(reason: str = "timeout", link: dict[str, Any] | None = None) -> dict[str, Any]:
    ref = link or LINK
    return {"type": "session.close", "reason": reason,
            "parent": {k: ref[k] for k in ("session", "call_id", "attempt")}}


def call_subagent(sim: Sim, tool: str = "research") -> str:
    """A parent turn whose model asks for the sub-agent tool: returns the call id (spawned)."""
    sim.send("go")
    [call] = sim.reply_tools(tool)
    return call


def only(effects: list[Any], kind: type) -> Any:
    found = [fx for fx in effects if isinstance(fx, kind)]
    assert len(found) == 1, (kind, effects)
    return found[0]


# ---- child ids are the engine's ----------------------------------------------------------------


def test_a_producer_cannot_create_a_session_with_a_child_id():
    sim = child_sim()
    sim.create(metadata={"mine": True})
    refusal = sim.ev("input.refused")
    assert refusal["code"] == "engine_only" and "sub-agent" in refusal["message"]
    assert sim.state.core is None


def test_a_producer_cannot_start_a_turn_in_a_child_session():
    sim = child_sim()
    sim.send("hello")
    assert sim.ev("input.refused")["code"] == "engine_only" and sim.state.core is None
    sim.input(spawn_entry(), engine=True)  # the engine's own spawn creates it
    assert sim.types()[:2] == ["session.created", "message.created"]
    sim.send("more", parent=sim.head)  # nor in one the engine made
    assert sim.ev("input.refused")["code"] == "engine_only"


def test_a_producer_cannot_link_a_session_to_a_parent_call_nor_close_one():
    sim = Sim(session="mine")
    sim.input(spawn_entry())
    assert sim.ev("input.refused")["code"] == "engine_only" and sim.state.core is None
    sim.send("hi")
    sim.input(close_entry())
    assert sim.ev("input.refused")["code"] == "engine_only" and sim.core.status == "open"


def test_a_producer_may_still_answer_a_childs_interrupt_and_switch_its_branches():
    sim = child_sim()
    sim.input(spawn_entry(), engine=True)
    sim.switch(sim.head)
    assert sim.types() == ["branch.switched"]
    sim.resume("int-9")
    assert sim.ev("input.ignored")["code"] == "unknown_interrupt"


def test_the_spawn_creates_the_child_and_its_first_message_in_one_input():
    sim = child_sim()
    sim.input(spawn_entry(), engine=True)
    assert sim.types() == ["session.created", "message.created", "llm.started"]
    first = sim.ev("message.created")["message"]
    assert (first["role"], first["content"], first["parent_id"]) == ("user", '{"topic": "otters"}', None)
    assert sim.core.parent == LINK and sim.core.app == AGENT


# ---- a spawn never adopts an existing session --------------------------------------------------


def test_a_spawn_onto_an_existing_session_changes_nothing_there_and_fails_the_call():
    sim = child_sim()
    sim.input(spawn_entry(LINK | {"session": "other"}), engine=True)  # e.g. left by an earlier parent
    messages = dict(sim.state.messages)
    sim.input(spawn_entry(task='{"secret": "arguments"}'), engine=True)
    assert sim.types() == ["input.ignored"] and sim.ev("input.ignored")["code"] == "session_exists"
    assert sim.state.messages == messages  # the call's arguments never reach that conversation
    report = only(sim.last.effects, Report)
    assert report.stream == "parley:results"
    assert (report.outcome.session, report.outcome.work, report.outcome.attempt) == ("p", "call-1", 1)
    assert (report.outcome.ok, report.outcome.error, report.outcome.source) == \
        (False, "subagent_session_exists", "p:sub-1")


def test_the_same_spawn_again_is_ignored_without_a_report():
    sim = child_sim()
    sim.input(spawn_entry(), engine=True)
    sim.input(spawn_entry(), engine=True)
    assert sim.ev("input.ignored")["code"] == "session_exists" and sim.last.effects == []


def test_the_parent_settles_a_failed_spawn_and_goes_on():
    sim = parent_sim()
    call = call_subagent(sim)
    child = sim.work(call).child
    sim.outcome("tool", call, 1, ok=False, error="subagent_session_exists", source=child)
    assert sim.ev("tool.completed")["error"] == "subagent_session_exists"
    assert not [fx for fx in sim.last.effects if isinstance(fx, Close)]  # not ours: nothing to close
    assert sim.enqueued_work("llm")  # the turn goes on


# ---- a sub-agent call has a time limit ---------------------------------------------------------


def test_a_spawn_sets_the_calls_deadline_from_the_tools_timeout_or_the_default_limit():
    sim = parent_sim(subagent_timeout_s=60)
    call = call_subagent(sim, "quick")
    deadline = only(sim.last.effects, DeadlineAdd)
    assert (deadline.timer, deadline.at) == (subagent_deadline(call), sim.now + 2_000)
    spawn = only(sim.last.effects, Spawn)
    assert spawn.child == "p:sub-1" and spawn.content == orjson.dumps({"n": 0}).decode()
    sim = parent_sim(subagent_timeout_s=60)
    call_subagent(sim, "research")
    assert only(sim.last.effects, DeadlineAdd).at == sim.now + 60_000


def test_a_sub_agent_call_past_its_deadline_fails_as_timeout_and_its_child_is_closed():
    sim = parent_sim()
    call = call_subagent(sim)
    child = sim.work(call).child
    sim.outcome("deadline", subagent_deadline(call), 0)
    done = sim.ev("tool.completed")
    assert (done["call_id"], done["error"]) == (call, "timeout")
    close = only(sim.last.effects, Close)
    assert (close.child, close.call_id, close.attempt, close.reason) == (child, call, 1, "timeout")
    assert sim.enqueued_work("llm")  # proposed: the model sees the error and goes on
    # the child's report, should it still come, is dropped
    sim.outcome("tool", call, 1, ok=True, value="late", source=child)
    assert sim.last.dropped == "already_settled" and sim.last.events == []
    # and so is the deadline again (posted twice)
    sim.outcome("deadline", subagent_deadline(call), 0)
    assert sim.last.dropped == "already_settled"


def test_a_report_in_time_settles_the_call_clears_its_deadline_and_closes_nothing():
    sim = parent_sim()
    call = call_subagent(sim)
    sim.outcome("tool", call, 1, ok=True, value="found it", source=sim.work(call).child)
    assert sim.ev("tool.completed")["call_id"] == call
    assert only(sim.last.effects, DeadlineRemove).timer == subagent_deadline(call)
    assert not [fx for fx in sim.last.effects if isinstance(fx, Close)]


def test_an_app_settling_a_running_sub_agent_call_closes_its_child():
    sim = Sim(make_app(decide_on={"tool.completed"}, tools=PARENT_TOOLS), session="p",
              agents={AGENT: CHILD_APP})
    sim.send("go")
    research, search = sim.reply_tools("research", "search")
    sim.finish_tool(search)
    sim.decide([{"type": "tool.result", "call_id": research, "result": "enough"}], expect="tool.completed")
    assert [e["call_id"] for e in sim.of("tool.completed")] == [search, research]
    close = only(sim.last.effects, Close)
    assert (close.child, close.call_id, close.reason) == ("p:sub-1", research, "abandoned")
    assert only(sim.last.effects, DeadlineRemove).timer == subagent_deadline(research)


# ---- a closed child ----------------------------------------------------------------------------


def running_child() -> Sim:
    """A child whose model asked for a tool job and a grandchild, both running."""
    sim = child_sim()
    sim.input(spawn_entry(), engine=True)
    sim.reply_tools("search", "dig")
    assert {w.status for w in sim.core.work.values()} == {"running"}
    return sim


def test_a_close_stops_everything_the_child_runs_and_it_never_reports():
    sim = running_child()
    sim.input(close_entry(), engine=True)
    assert sim.types() == ["session.closed"] and sim.ev("session.closed")["reason"] == "timeout"
    assert sim.core.status == "closed" and sim.core.work == {} and sim.core.turns == {}
    assert [(fx.job, fx.work) for fx in sim.cancelled()] == [("tool", "call-1")]
    grandchild = only(sim.last.effects, Close)
    assert (grandchild.child, grandchild.call_id, grandchild.reason) == \
        ("p:sub-1:sub-1", "call-2", "abandoned")
    assert not [fx for fx in sim.last.effects if isinstance(fx, Report)]


def test_a_closed_child_refuses_or_ignores_every_input_and_applies_no_outcome():
    sim = running_child()
    sim.input(close_entry(), engine=True)
    for send in (lambda: sim.switch("msg-1"), lambda: sim.tool_result("call-1", result=1),
                 lambda: sim.send("more", engine=True)):
        send()
        assert sim.ev("input.refused")["code"] == "session_closed", sim.types()
    for send in (lambda: sim.resume("int-1"), lambda: sim.input(close_entry(), engine=True)):
        send()
        assert sim.ev("input.ignored")["code"] == "session_closed", sim.types()
    sim.finish_tool("call-1", attempt=1)  # running at the close: recorded late, never applied
    assert sim.last.dropped == "session_closed" and sim.types() == ["tool.late"]
    # nothing applied; the one effect copies the session, late result included, to the archive
    assert [fx.op for fx in sim.last.effects] == ["retire"] and sim.last.new_messages == []
    sim.finish_tool("call-1", attempt=1)  # once
    assert sim.last.dropped == "session_closed" and sim.last.events == [] and sim.last.effects == []


def test_a_close_clears_the_childs_open_interrupts_and_its_decide_in_flight():
    sim = Sim(make_app(tools={}), session="p:sub-1", agents={AGENT: AppInfo(has_decide=True)})
    sim.input(spawn_entry(), engine=True)
    sim.decide([{"type": "interrupt", "reason": "ask", "timeout_s": 60}], expect="session.created")
    assert sim.held_refs(sim.head) == [("message.created", None)]
    sim.input(close_entry(), engine=True)
    assert [fx.interrupt_id for fx in sim.last.effects if isinstance(fx, IndexRemove)] == ["int-1"]
    assert sim.core.interrupts == {} and sim.core.turns == {}
    # whoever was asked is told the question is gone (the event goes to the fleet-wide feed too)
    cancelled = sim.ev("interrupt.cancelled")
    assert {k: cancelled[k] for k in ("interrupt_id", "reason", "request", "why")} == {
        "interrupt_id": "int-1", "reason": "ask", "request": None, "why": close_entry()["reason"]}
    deciding = Sim(make_app(tools={}), session="p:sub-1", agents={AGENT: AppInfo(has_decide=True)})
    deciding.input(spawn_entry(), engine=True)
    deciding.input(close_entry(), engine=True)
    assert [(fx.job, fx.work) for fx in deciding.cancelled()] == [("decide", "dec-1")]
    assert deciding.core.deciding is None and deciding.core.queue == []


def test_a_close_for_a_session_that_is_not_the_calls_child_is_ignored():
    sim = child_sim()
    sim.input(spawn_entry(LINK | {"call_id": "call-7"}), engine=True)
    sim.input(close_entry(), engine=True)
    assert sim.ev("input.ignored")["code"] == "unknown_session" and sim.core.status == "open"
    nobody = child_sim("p:sub-2")
    nobody.input(close_entry(), engine=True)
    assert nobody.ev("input.ignored")["code"] == "unknown_session" and nobody.state.core is None


# ---- the engine's own inputs: signed with a key no producer holds ------------------------------


def engine_entry(key: str, session: str = "p:sub-1") -> dict[bytes, bytes]:
    raw = orjson.dumps(spawn_entry())
    signed = signed_fields(key, ENGINE_PRINCIPAL, session, "parley-spawn", raw)
    return {b"session": session.encode(), b"input": raw, b"id": b"parley-spawn",
            **{k.encode(): v.encode() for k, v in signed.items()}}


def test_the_engines_inputs_verify_with_its_key_even_where_signing_is_required():
    ring = Keyring({"alice": "alice-secret"}, required=True).with_engine_key("engine-secret")
    assert ring.verify(engine_entry("engine-secret"), NOW) == ENGINE_PRINCIPAL
    assert "engine-secret" not in repr(ring)


@pytest.mark.parametrize(("ring", "key", "why"), [
    (Keyring({"alice": "alice-secret"}).with_engine_key("engine-secret"), "alice-secret", "bad signature"),
    (Keyring({"alice": "alice-secret"}).with_engine_key("engine-secret"), "guessed", "bad signature"),
    (Keyring({"alice": "alice-secret"}), "alice-secret", "unknown principal"),
], ids=["a-producers-key", "a-guess", "no-engine-key-known"])
def test_a_producer_cannot_sign_as_the_engine(ring: Keyring, key: str, why: str):
    with pytest.raises(Unauthorized, match=why):
        ring.verify(engine_entry(key), NOW)


def test_a_keys_file_may_not_name_the_engine(tmp_path: Path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"alice": "a", ENGINE_PRINCIPAL: "b"}))
    with pytest.raises(ValueError, match=ENGINE_PRINCIPAL):
        Keyring.load(str(path))


def test_a_spawn_from_a_deployment_with_a_colon_in_its_prefix_is_valid():
    sim = child_sim()
    sim.input(spawn_entry(LINK | {"reply_to": "acme:parley:results:3"}), engine=True)
    assert sim.core.parent is not None and sim.core.parent["reply_to"] == "acme:parley:results:3"


def test_a_pause_of_the_parent_keeps_waiting_for_its_child():
    sim = Sim(make_app(decide_on={"tool.execute"}, tools=PARENT_TOOLS), session="p",
              agents={AGENT: CHILD_APP})
    sim.send("go")
    research, _search = sim.reply_tools("research", "search")
    sim.decide(expect="tool.execute")  # the sub-agent is spawned
    sim.decide([{"type": "interrupt", "reason": "confirm"}], expect="tool.execute")  # the branch parks
    assert sim.work(research).status == "running"
    assert not [fx for fx in sim.effects if isinstance(fx, Close | DeadlineRemove)]
    sim.outcome("tool", research, 1, ok=True, value="found", source=sim.work(research).child)
    assert sim.ev("tool.completed")["call_id"] == research and sim.types()[-1] == "decision.held"


def test_a_child_that_reports_is_closed_archived_and_retired_and_answers_nothing_more():
    """Its answer is posted, and nothing more can happen in it (only the engine starts a child's
    turns): it closes as `reported`, so it is archived and expires like any closed session."""
    sim = child_sim()
    sim.input(spawn_entry(), engine=True)
    [llm] = sim.running_llm()
    sim.finish_llm(llm, content="otters hold hands")
    assert sim.types()[-2:] == ["turn.completed", "session.closed"]
    assert sim.ev("session.closed")["reason"] == "reported" and sim.core.status == "closed"
    report = only(sim.last.effects, Report)
    assert (report.outcome.ok, report.outcome.value) == (True, "otters hold hands")
    only(sim.last.effects, Retire)
    sim.input(close_entry("abandoned"), engine=True)  # its parent's later close: nothing to do
    assert sim.ev("input.ignored")["code"] == "session_closed" and sim.last.effects == []


# ---- traces (docs/tracing.md) ---------------------------------------------------------------------


def test_a_traced_parents_spawn_starts_the_childs_turn_in_the_parents_trace():
    sim = parent_sim()
    sim.tracing = True
    call_subagent(sim, "research")
    spawn = only(sim.last.effects, Spawn)
    parent_trace = sim.turn(sim.work(spawn.parent.call_id).turn).trace
    assert parent_trace is not None and spawn.trace == parent_trace
    child = child_sim()
    child.tracing = True
    child.input({**spawn_entry(), "traceparent": spawn.trace}, engine=True)
    assert child.turn(child.head).trace == parent_trace


def test_a_traceparent_on_a_session_create_comes_only_with_a_task():
    with pytest.raises(InputError, match="traceparent"):
        child_sim().entry({"type": "session.create",
                           "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
